"""Bench: mixed placement against the single-type plan on the 1,072-node spec (issue 17).

    python bench/mixed_vs_single.py [--spec bench/data/scale1072.yaml] [--modes single-type,mixed]
                                    [--root PATH]

The spec (bench/scale_spec.py writes it: 8 GPU types, 10 regions over gcp/aws/azure/kubernetes,
1,072 nodes, 4 models, 8 workloads, $2000/h) is compiled with the real driver once per
`placement.pipelines` value, everything else the same. Each build runs in its own Python process,
so its peak memory (getrusage maxrss) is its own. Per build it prints: wall time of the build and
of the place pass, peak RSS, the plan's objective (theta, x the demand mix), the bound and gap
plan.json reports on it (compose's bound, where the plan deploys compose's replicas; else none, and
why), compose's own theta and bound (compose stops at solver.time_limit on a busy machine, so two
builds may start from slightly different compositions), replicas, nodes, GPUs and $/h, and per
model which replicas mixed kept, with the three thetas it compared. `--root` imports another
hetcompile checkout (compare before/after a change).
Timings are wall clock on whatever machine runs this; on a shared machine they vary.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "bench" / "data" / "scale1072.yaml"


def one(spec: Path, mode: str, root: Path) -> dict:
    """Compile `spec` with `placement.pipelines: mode` in this process; the figures as a dict."""
    sys.path.insert(0, str(root.resolve()))
    from hetcompile.ir.document import proven_bound
    from hetcompile.driver import compile_spec

    s = yaml.safe_load(spec.read_text())
    s.setdefault("placement", {})["pipelines"] = mode
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "spec.yaml"
        path.write_text(yaml.safe_dump(s, sort_keys=False))
        t0 = time.perf_counter()
        # progress to stderr (the parent passes it through): a 1,072-node build runs for minutes
        ir = compile_spec(path, log=lambda msg: print(f"[{mode} {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr,
                                                     flush=True)).ir
        wall = time.perf_counter() - t0
    rep = {r.name: r for r in ir.reports}
    comp, place = rep["compose"], rep.get("place")
    bound, source = proven_bound(ir)  # plan.json's totals: the bound on the emitted plan's theta, or why none
    return {
        "mode": mode, "wall_s": wall, "place_s": place.time_s if place else None,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "theta": ir.composition.scale, "compose_theta": comp.objective, "compose_bound": comp.bound, "compose_gap": comp.gap,
        "bound": bound, "gap": None if bound is None or ir.composition.scale <= 0 else (bound - ir.composition.scale) / ir.composition.scale,
        "bound_source": source,
        "replicas": len(ir.replicas), "nodes": len(ir.nodes), "gpus": sum(n.gpus for n in ir.nodes),
        "cost_h": sum(n.price_per_s for n in ir.nodes) * 3600,
        "kept": {p.model: f"{p.kept} (chains {p.scale_placement:.4g}, compose same model {p.scale_compose:.4g}, single-type {getattr(p, 'scale_single_type', float('nan')):.4g})" for p in ir.placements},
    }


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--modes", default="single-type,mixed")
    ap.add_argument("--root", type=Path, default=ROOT, help="hetcompile checkout to import")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: one build in this process, JSON out
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.spec, args.one, args.root)))
        return 0
    print(f"mixed_vs_single: {args.spec.name}, hetcompile at {args.root.resolve()}")
    print(f"{'mode':<12} {'wall s':>7} {'place s':>7} {'RSS MiB':>8} {'theta':>8} {'bound':>8} {'gap':>8} "
          f"{'c.theta':>8} {'c.bound':>8} {'reps':>5} {'nodes':>5} {'GPUs':>5} {'$/h':>8}")
    rows = []
    for mode in args.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--spec", str(args.spec), "--root", str(args.root), "--one", mode],
                             stdout=subprocess.PIPE, text=True)
        if out.returncode:
            print(f"{mode:<12} ERROR (exit {out.returncode}; its traceback is above)")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"{mode:<12} {r['wall_s']:7.1f} {fmt(r['place_s'], '7.1f')} {r['maxrss_mib']:8.0f} {r['theta']:8.4f} "
              f"{fmt(r['bound'], '8.4f')} {fmt(r['gap'], '8.1e')} {fmt(r['compose_theta'], '8.4f')} "
              f"{fmt(r['compose_bound'], '8.4f')} {r['replicas']:5d} {r['nodes']:5d} {r['gpus']:5d} {r['cost_h']:8.2f}", flush=True)
        print(f"{'':<12}   bound: {r['bound_source']}")
        for m, k in r["kept"].items():
            print(f"{'':<12}   {m}: kept {k}")
    by = {r["mode"]: r for r in rows}
    if "single-type" in by and "mixed" in by:
        s, m = by["single-type"], by["mixed"]
        print(f"mixed / single-type theta: {m['theta'] / s['theta']:.4f}  ($/h {m['cost_h']:.2f} vs {s['cost_h']:.2f})")
        return 0 if m["theta"] >= s["theta"] * (1 - 1e-9) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
