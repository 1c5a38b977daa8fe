"""The p99 TTFT / TPOT plan.json states against an hour of simulation at the planned load.

    .venv/bin/python bench/tail_fidelity.py [OUT_ROOT] [--duration 3600] [--seeds 0,1] [--slowdown 5]

Builds every example (examples/*/spec.yaml) into OUT_ROOT/<name> (default: a temporary folder),
reads each workload's stated p99 (`simulated`: the build's seeded, work-bounded simulation of the
plan, seeds 0-3; where the build simulated nothing for it, the model's) and the tail model's (`predicted`: perf/tail.py at the planned load, worst routed
replica), and replays the plan with `hetcompile simulate`'s engine for --duration seconds of Poisson
arrivals at the planned rates per seed (seeds differ from the build's). Prints per workload: the
stated p99 of TTFT and TPOT, the hour's, the relative error (hour - stated) / stated and whether it
is within 25% (issue 18's done-criterion), the model's error the same way, plus the build time and
the part of it the build's verification took. --slowdown S builds every example with
`max_ttft_slowdown: S` appended to its spec (S = 0: `null`, the queueing bound off, so only SLO
workloads are simulated); without it, each spec's own setting (default 5: every workload simulated).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.backends.emit import write  # noqa: E402
from hetcompile.driver import compile_spec  # noqa: E402
from hetcompile.plan.io import read_plan_doc  # noqa: E402
from hetcompile.simulate import simulate, steady_arrivals  # noqa: E402

TOLERANCE = 0.25


def _err(pred: float | None, sim: float | None) -> float | None:
    if pred is None or sim is None or pred <= 0:
        return None
    return (sim - pred) / pred


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=None)
    ap.add_argument("--duration", type=float, default=3600.0)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--only", default="", help="comma-separated example names")
    ap.add_argument("--slowdown", type=float, default=None, help="append max_ttft_slowdown to every spec (0: null, off)")
    a = ap.parse_args()
    out_root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="tail-fidelity-"))
    seeds = [int(s) for s in a.seeds.split(",")]
    names = sorted(p.parent.name for p in (ROOT / "examples").glob("*/spec.yaml"))
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    print(f"{'example':20} {'workload':10} {'seed':>4} {'util':>5} {'TTFT stat':>9} {'sim':>9} {'err':>7} "
          f"{'TPOT stat':>9} {'sim':>9} {'err':>7} {'SLO att':>7}  within 25%  model TTFT/TPOT err")
    ok = total = model_ok = 0
    for name in names:
        logs: list[str] = []
        t0 = time.perf_counter()
        spec = ROOT / "examples" / name / "spec.yaml"
        if a.slowdown is not None:
            copy = Path(tempfile.mkdtemp(prefix="tail-fidelity-spec-")) / name
            shutil.copytree(spec.parent, copy)
            spec = copy / "spec.yaml"
            spec.write_text(spec.read_text() + f"\nmax_ttft_slowdown: {f'{a.slowdown:g}' if a.slowdown > 0 else 'null'}\n")
        res = compile_spec(spec, log=logs.append)
        build_s = time.perf_counter() - t0
        verify_s = sum(float(l.split(" in ")[1].split("s")[0]) for l in logs if l.startswith("verify:"))
        out = out_root / name
        write(res.ir, out)
        plan = read_plan_doc(out / "plan.json")
        pred = {w.name: w.predicted for w in plan.workloads}
        stated = {w.name: w.simulated for w in plan.workloads}
        if any(r.step_model is None for r in plan.replicas):
            print(f"{name:20} (a replica without a step model: not simulated)")
            continue
        for seed in seeds:
            doc = simulate(plan, steady_arrivals(plan, a.duration, seed), a.duration, seed=seed)
            for w in doc.workloads:
                p, st = pred.get(w.name), stated.get(w.name) or pred.get(w.name)  # no simulation: the model's
                if st is None or w.arrived == 0:
                    continue
                e1, e2 = _err(st.ttft_s, w.ttft_s.p99), _err(st.tpot_s, w.tpot_s.p99)
                m1, m2 = (_err(p.ttft_s, w.ttft_s.p99), _err(p.tpot_s, w.tpot_s.p99)) if p else (None, None)
                good = all(e is not None and abs(e) <= TOLERANCE for e in (e1, e2))
                model_good = all(e is not None and abs(e) <= TOLERANCE for e in (m1, m2))
                ok, total, model_ok = ok + good, total + 1, model_ok + model_good
                f = lambda x: "-" if x is None else f"{x:9.4g}"  # noqa: E731
                g = lambda x: "-" if x is None else f"{100 * x:+6.0f}%"  # noqa: E731
                att = "-" if w.slo_attainment is None else f"{100 * w.slo_attainment:6.2f}%"
                print(f"{name:20} {w.name:10} {seed:4d} {st.utilization or 0:5.2f} {f(st.ttft_s)} {f(w.ttft_s.p99)} {g(e1):>7} "
                      f"{f(st.tpot_s)} {f(w.tpot_s.p99)} {g(e2):>7} {att:>7}  {'yes' if good else 'NO':3}  "
                      f"{g(m1):>7} {g(m2):>7}", flush=True)
        print(f"{name:20} build {build_s:.1f}s, of which verification {verify_s:.1f}s", flush=True)
    print(f"stated p99 within {TOLERANCE:.0%} of the hour on both: {ok} of {total} (workload, seed) rows")
    print(f"the tail model's p99 within {TOLERANCE:.0%} on both: {model_ok} of {total}")


if __name__ == "__main__":
    main()
