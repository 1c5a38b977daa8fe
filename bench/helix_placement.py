"""Bench: hetcompile's placement on the four Helix setups against Helix, Swarm and Petals.

    python bench/helix_placement.py [--time-limit 60] [--gap 0.005] [--setups single24,geo24,...]
                                    [--max-num-seqs 256] [--json out.json]

Per setup it prints, all through the same evaluator (hetcompile.placement.evaluate):
  shared   `place(mode="shared")`: Helix-semantics flow (prompt + decode tokens/s), its proven
           bound and gap, wall time, ratio to Helix's published Gurobi value
  chains   `place(mode="chains")` (deployable; default depth-aware objective) and
           `place(mode="chains", objective="helix")` with the chain MILP's bound
  baselines Helix's own MILP layout and the artifact's Swarm / Petals layouts (where shipped),
           and hetcompile's Swarm / Petals / separate-pipelines implementations
and for every plan the depth-aware capacity (tokens/s). Every result is verified with networkx.
Timings are wall clock on whatever machine runs this; compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetcompile.placement import SolverOptions, place  # noqa: E402
from hetcompile.placement.helix.baselines import evaluate_placement, petals, separate_pipelines, swarm  # noqa: E402
from hetcompile.placement.helix.artifact import SETUPS, helix_layout, load_setup  # noqa: E402
from hetcompile.placement.verify import verify_result


def row(name: str, res, *, helix_value: float | None = None, wall: float | None = None) -> dict:
    verify_result(res)
    out = {"plan": name, "helix_flow": res.helix_flow, "depth_aware": res.depth_aware_capacity,
           "bound": res.bound, "gap": res.gap, "wall_s": wall, "source": res.incumbent_source}
    if helix_value:
        out["ratio_to_helix"] = res.helix_flow / helix_value
    if res.chains:
        out["chains"] = [{"depth": c.depth, "tp": c.tp, "mixed": c.mixed, "C": c.concurrency, "binding": c.binding,
                          "capacity": c.capacity} for c in res.chains]
    return out


def fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def bench_setup(name: str, opts: SolverOptions, max_num_seqs: int | None) -> list[dict]:
    info = SETUPS[name]
    p = load_setup(name, max_concurrency=max_num_seqs)
    rows = []
    t = time.perf_counter()
    res = place(p, mode="shared", options=opts)
    rows.append(row("hetcompile shared", res, helix_value=info.helix_value, wall=time.perf_counter() - t))
    t = time.perf_counter()
    res = place(p, mode="chains", options=opts)
    rows.append(row("hetcompile chains (depth-aware)", res, helix_value=info.helix_value, wall=time.perf_counter() - t))
    t = time.perf_counter()
    res = place(p, mode="chains", objective="helix", options=opts)
    rows.append(row("hetcompile chains (helix obj.)", res, helix_value=info.helix_value, wall=time.perf_counter() - t))
    rows.append(row("Helix MILP layout (artifact)", evaluate_placement(p, helix_layout(name, problem=p), source="artifact"),
                    helix_value=info.helix_value))
    for which in ("swarm", "petals"):
        try:
            units = helix_layout(name, which, problem=p)
        except KeyError:
            continue
        rows.append(row(f"{which.capitalize()} layout (artifact)", evaluate_placement(p, units, source="artifact"),
                        helix_value=info.helix_value))
    rows.append(row("Swarm (hetcompile impl.)", swarm(p), helix_value=info.helix_value))
    rows.append(row("Petals (hetcompile impl.)", petals(p), helix_value=info.helix_value))
    rows.append(row("separate pipelines", separate_pipelines(p), helix_value=info.helix_value))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per place() call")
    ap.add_argument("--gap", type=float, default=0.005, help="relative gap at which place stops early")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--max-num-seqs", type=int, default=256,
                    help="vLLM --max-num-seqs in the depth-aware model (0: KV-limited only)")
    ap.add_argument("--json", type=Path, help="also write all rows as JSON")
    args = ap.parse_args()
    opts = SolverOptions(time_limit_s=args.time_limit, mip_gap=args.gap, threads=args.threads, seed=0)
    everything = {}
    for name in args.setups.split(","):
        info = SETUPS[name]
        rows = bench_setup(name, opts, args.max_num_seqs or None)
        everything[name] = rows
        print(f"\n== {name}: {info.setup} ({info.model}, cluster {info.cluster}); Helix Gurobi value {info.helix_value:.1f}")
        print(f"{'plan':34s} {'helix flow':>10s} {'x Helix':>7s} {'bound':>8s} {'gap':>7s} {'wall s':>6s} "
              f"{'depth-aware':>11s}  source")
        for r in rows:
            gap = None if r["gap"] is None else 100 * r["gap"]
            print(f"{r['plan']:34s} {r['helix_flow']:10.1f} {fmt(r.get('ratio_to_helix'), '.3f'):>7s} "
                  f"{fmt(r['bound']):>8s} {fmt(gap, '.2f') + ('%' if gap is not None else ''):>7s} "
                  f"{fmt(r['wall_s']):>6s} {r['depth_aware']:11.1f}  {r['source']}")
        ours = next(r for r in rows if r["plan"].startswith("hetcompile chains (depth"))
        others = [r for r in rows if "layout" in r["plan"] or "Swarm" in r["plan"] or "Petals" in r["plan"]]
        best_other = max(others, key=lambda r: r["depth_aware"])
        print(f"depth-aware: hetcompile chains {ours['depth_aware']:.1f} vs best of Helix/Swarm/Petals "
              f"{best_other['depth_aware']:.1f} ({best_other['plan']}): x{ours['depth_aware'] / best_other['depth_aware']:.3f}")
        for c in ours.get("chains", []):
            print(f"   chain depth {c['depth']:2d} TP {c['tp']} {'mixed' if c['mixed'] else 'single'}  C {c['C']:.0f}  "
                  f"{c['capacity']:.1f} tok/s  bound by {c['binding']}")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
