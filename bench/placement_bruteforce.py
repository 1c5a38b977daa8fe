"""Bench: placement against exact brute force on small random clusters (the tests' generators).

    python bench/placement_bruteforce.py [--root CHECKOUT] [--seeds 0,1,2,3] [--cases 40]

shared  2-4 nodes, 3-5 layers, binding region links and per-node links, 1- and 2-GPU nodes
        (tests/placement/test_shared_links.py); optimum = best networkx max flow over every placement
chains  3-5 nodes, a third of them 2-GPU nodes with TP-2 and TP-1 profiles, depth-aware and helix
        objectives (tests/placement/test_chains_exact.py); optimum = the chain search's own evaluator
        over every node mode and slot partition
Prints per mode: cases below the optimum, the worst and mean ratio to it. `--root` imports another
checkout (e.g. the main branch) so two versions run on the same cases.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=ROOT)
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--cases", type=int, default=40)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(args.root.resolve()))
    from hetcompile.placement import SolverOptions, place
    from placement import test_chains_exact as ce
    from placement import test_shared_links as sl
    from placement.util import brute_force_chain_search, brute_force_shared

    opts = SolverOptions(time_limit_s=30, mip_gap=1e-6)
    seeds = [int(s) for s in args.seeds.split(",")]
    for label, gen, run, opt in (
        ("shared", sl.random_case, lambda p: place(p, mode="shared", options=opts).helix_flow, brute_force_shared),
        ("chains/depth-aware", ce.random_case, lambda p: place(p, mode="chains", options=opts).depth_aware_capacity,
         lambda p: brute_force_chain_search(p, "depth-aware")),
        ("chains/helix", ce.random_case, lambda p: place(p, mode="chains", objective="helix", options=opts).helix_flow,
         lambda p: brute_force_chain_search(p, "helix")),
    ):
        ratios = []
        for seed in seeds:
            rng = random.Random(seed)
            for _ in range(args.cases):
                p = gen(rng)
                best = opt(p)
                try:
                    got = run(p)
                except Exception as exc:  # an old version may crash: count it as 0
                    print(f"  {label}: {type(exc).__name__}: {exc}")
                    got = 0.0
                ratios.append(got / best if best > 0 else 1.0)
        below = [r for r in ratios if r < 1 - 1e-6]
        print(f"{label}: {len(ratios)} cases, {len(below)} below the optimum, worst ratio {min(ratios):.3f}, "
              f"mean ratio {sum(ratios) / len(ratios):.4f}")


if __name__ == "__main__":
    main()
