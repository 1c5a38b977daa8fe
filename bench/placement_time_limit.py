"""Bench: does the placement pass respect the spec's time limit on a 192-node mixed spec?

    python bench/placement_time_limit.py [--time-limit 60] [--runs 2] [--scale 192]

The spec is Helix's high-heterogeneity cluster (examples/helix-highhet42: 7 machine types,
LLaMA-2 70B, Helix's T(k) tables as measured layer profiles, owned Kubernetes nodes) with every
offer scaled up to `--scale` nodes in all (42 -> 192 by default), `placement.pipelines: mixed`, `compare_shared: true` (unless --no-compare-shared): a chains and a
shared placement, which together must stay within the one limit.
Each run compiles it with the real driver and prints the wall time of the build and of the
place pass against the time limit, the placed depth-aware capacity, and whether plan.json is
byte-identical across runs (the work budgets, not the clock, must decide the plan).
Timings are wall clock on whatever machine runs this; the ratio to the limit is what counts.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def scaled_spec(out: Path, total: int, time_limit: float, compare_shared: bool) -> Path:
    src = ROOT / "examples" / "helix-highhet42"
    spec = yaml.safe_load((src / "spec.yaml").read_text())
    offers = spec["regions"][0]["offers"]
    base = sum(o["max_nodes"] for o in offers)
    counts = [o["max_nodes"] * total // base for o in offers]
    counts[0] += total - sum(counts)  # the rounding remainder goes to the first offer
    for o, c in zip(offers, counts):
        o["max_nodes"] = o["owned"] = c
    spec["name"] = f"helix-highhet{total}"
    spec["solver"]["time_limit"] = f"{time_limit:g}s"
    spec["placement"]["compare_shared"] = compare_shared
    shutil.copy(src / "layer_profiles.yaml", out / "layer_profiles.yaml")
    path = out / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--scale", type=int, default=192)
    ap.add_argument("--no-compare-shared", action="store_true", help="chains only (no shared-mode comparison solve)")
    ap.add_argument("--root", type=Path, default=ROOT, help="hetcompile checkout to import (compare two versions)")
    args = ap.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    from hetcompile.backends.emit import artifacts
    from hetcompile.driver import compile_spec
    digests = []
    with tempfile.TemporaryDirectory() as d:
        path = scaled_spec(Path(d), args.scale, args.time_limit, not args.no_compare_shared)
        for run in range(args.runs):
            t0 = time.perf_counter()
            ir = compile_spec(path).ir
            wall = time.perf_counter() - t0
            place = next(r for r in ir.reports if r.name == "place")
            plan = artifacts(ir)["plan.json"]
            digests.append(hashlib.sha256(plan.encode()).hexdigest()[:16])
            da = sum(p.depth_aware_capacity for p in ir.placements)
            print(f"run {run}: {args.scale} nodes, build {wall:.1f} s, place {place.time_s:.1f} s, limit {args.time_limit:g} s "
                  f"(build/limit {wall / args.time_limit:.2f}), depth-aware {da:.1f} tokens/s, plan.json {digests[-1]}")
            for n in place.notes:
                print("   ", n)
    print("identical plans across runs:", len(set(digests)) == 1)


if __name__ == "__main__":
    main()
