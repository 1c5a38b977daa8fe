"""Scale of the composition MILP on seed 003's evaluation grid: solve time and gap per instance.

    python bench/compose_scale.py [--quick] [--traces 1,2,3] [--time-limit 60] [--mip-gap 1e-4]

`--quick`: 4 instances (availability 1 and 4, 30 $/h, both models, trace 1), a few seconds.

The grid (seed 003 §5.1, App. H/I): 6 GPU types x 4 availability tables (Table 4) x 9 workload
types mixed as a trace (Table 5) x budgets 15/30/60 $/h x 2 models = 24 instances per trace
(all three traces by default, 72 instances; `--traces 1` runs 24).

Each instance is a spec YAML written to a temp dir and compiled with the real driver,
`compile_spec(path, stop_after="compose")`: the profile pass enumerates the replica shapes
(analytic h_{c,w}), the compose pass solves the MILP with objective max-throughput (stage 1:
max theta; stage 2: the cheapest plan keeping theta), time limit 60 s per solve, 1 thread.

  GPUs     4090 (catalog RTX4090), A40, A6000, L40, A100 (003's A100 is the 80 GB card:
           catalog A100-80GB), H100; one region, catalog prices (gpus.yaml, 003 Table 1).
  Nodes    Table 4 gives GPU counts, not machines. Each type's count is split into nodes of the
           largest power of two <= 8 that divides it (16 -> 2x8, 12 -> 3x4, 6 -> 3x2, 7 -> 7x1),
           so TP up to the node size is possible (003 App. D: TP only inside a machine) and PP
           chains same-type nodes.
  Workloads 003 §3: input means {2455, 824, 496} x output means {510, 253, 18}. Table 5 numbers
           them 1-9 "as in Figure 4 from left to right", which the text does not spell out;
           App. L says workload 1 is long-input short-output, i.e. {2455, 18}. We take
           input-major order with outputs ascending:
             1 (2455,18) 2 (2455,253) 3 (2455,510) 4 (824,18) 5 (824,253) 6 (824,510)
             7 (496,18)  8 (496,253)  9 (496,510)
           (output-major order would fit Table 5 about as well; only the mix weights move).
           Table 5's percentages are the workloads' `share`s, so theta is requests/s of the mix.
  Models   llama-3-8b and llama-3-70b (catalog), one model per instance.

Baselines measured in the same run, on the same ComposeTables:
  LP       the LP relaxation of stage 1 (integer y relaxed): its time, and its theta, an upper
           bound on the MILP's (LP/MILP = integrality gap the B&B has to close).
  greedy   003-style "best value first": rank shapes by mix throughput per $
           (h_mix(c) = 1 / sum_w share_w / h_{c,w}), add replicas of the best shape until
           availability or budget stops it, then the next; theta of that y with the best split
           of the workloads (an LP with y fixed). MILP/greedy is what optimizing buys.
Columns: inst = A<avail>-B<budget $/h>-<8b|70b>-T<trace>; shapes = |C|; vars = integer/total
MILP columns; stat/theta/bound/gap = stage-1 solve (theta in req/s of the mix, bound = HiGHS dual
bound); t1/t2 = stage-1/stage-2 solve seconds; pass = compose pass wall seconds (both stages,
model building); $/h = the plan's cost; LP th / LP s = relaxation theta and seconds; greedy =
greedy theta; LP/MILP, MILP/gr (final plan's theta over greedy's), t1/LP = ratios against the
baselines; GPUs rented = per type in the final plan.
Everything is bounded: at most 2 solves x time limit per instance, plus one LP and one fixed-y LP.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's hetcompile, whatever the installed one points at

import pyomo.environ as pyo  # noqa: E402
import yaml  # noqa: E402

import hetcompile.passes.compose as compose_mod  # noqa: E402
from hetcompile.driver import compile_spec  # noqa: E402
from hetcompile.errors import HetcompileError  # noqa: E402
from hetcompile.passes.compose import tables  # noqa: E402
from hetcompile.passes.compose_model import ComposeTables, build_model, solution_cost  # noqa: E402
from hetcompile.opt.solve import SolverOptions, solve  # noqa: E402

GPUS = ("RTX4090", "A40", "A6000", "L40", "A100-80GB", "H100")  # Table 4's column order
AVAIL = {  # 003 Table 4: 4090, A40, A6000, L40, A100, H100
    1: (16, 12, 8, 12, 6, 8),
    2: (32, 8, 16, 16, 7, 12),
    3: (32, 16, 8, 8, 32, 8),
    4: (24, 24, 24, 16, 4, 8),
}
INPUTS = (2455, 824, 496)
OUTPUTS = (18, 253, 510)
WORKLOADS = tuple((i, o) for i in INPUTS for o in OUTPUTS)  # workload k = WORKLOADS[k - 1]
TRACES = {  # 003 Table 5, percent
    1: (33, 7, 8, 7, 27, 6, 6, 3, 3),
    2: (22, 5, 5, 21, 5, 5, 19, 6, 12),
    3: (4, 1, 4, 3, 20, 27, 1, 25, 15),
}
BUDGETS = (15, 30, 60)
MODELS = ("llama-3-8b", "llama-3-70b")


def node_size(count: int) -> int:
    return max(g for g in (1, 2, 4, 8) if count % g == 0)


def spec_dict(avail: int, budget: int, model: str, trace: int, time_limit: float, mip_gap: float) -> dict:
    offers = []
    for gpu, n in zip(GPUS, AVAIL[avail]):
        g = node_size(n)
        offers.append({"gpu": gpu, "gpus_per_node": g, "max_nodes": n // g})
    return {
        "name": f"c003-a{avail}-b{budget}-{model.replace('.', '-')}-t{trace}",
        "models": [{"name": model}],
        "workloads": [
            {"name": f"w{k + 1}", "model": model, "input_tokens": i, "output_tokens": o, "share": f"{TRACES[trace][k]}%"}
            for k, (i, o) in enumerate(WORKLOADS)
        ],
        "regions": [{"name": "vast", "cloud": "vast", "offers": offers}],
        "budget": f"${budget}/h",
        "objective": "max-throughput",
        "solver": {"time_limit": f"{time_limit}s", "mip_gap": mip_gap, "threads": 1, "seed": 0},
    }


# ---- baselines ----------------------------------------------------------------------------------


def count_vars(t: ComposeTables) -> tuple[int, int]:
    m = build_model(t, "theta")
    vs = list(m.component_data_objects(pyo.Var))
    return sum(1 for v in vs if v.is_integer()), len(vs)


def lp_relaxation(t: ComposeTables, opts: SolverOptions) -> tuple[float | None, float]:
    m = build_model(t, "theta")
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(m)
    res = solve(m, opts, name="bench/lp-relaxation")
    return res.objective, res.time_s


def theta_of(t: ComposeTables, y: dict[str, int], opts: SolverOptions) -> float:
    """Best theta of a fixed composition y (an LP: y fixed, the split r free)."""
    m = build_model(t, "theta")
    for c in t.shapes:
        m.y[c].fix(y.get(c, 0))
    res = solve(m, opts, name="bench/fixed-y")
    return res.objective or 0.0


def greedy(t: ComposeTables) -> dict[str, int]:
    def h_mix(c: str) -> float:
        ws = [w for w in t.workloads if (c, w) in t.h]
        if len(ws) < len(t.workloads):
            return 0.0
        return 1.0 / sum(t.demand[w] / t.h[c, w] for w in ws)

    ranked = sorted(t.shapes, key=lambda c: (-h_mix(c) / (t.shape_gpus[c] * t.price[t.shape_offer[c]]), c))
    y = {c: 0 for c in t.shapes}
    for c in ranked:
        if h_mix(c) <= 0:
            continue
        o = t.shape_offer[c]
        while True:
            used = sum(t.shape_gpus[s] * n for s, n in y.items() if t.shape_offer[s] == o)
            if used + t.shape_gpus[c] > t.avail[o]:
                break
            if t.budget is not None and solution_cost({**y, c: y[c] + 1}, t) > t.budget * (1 + 1e-12):
                break
            y[c] += 1
    return y


# ---- one instance ---------------------------------------------------------------------------------


def run_instance(avail: int, budget: int, model: str, trace: int, args, tmp: Path) -> dict:
    spec = spec_dict(avail, budget, model, trace, args.time_limit, args.mip_gap)
    path = tmp / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    row: dict = {"inst": f"A{avail}-B{budget}-{model.split('-')[-1]}-T{trace}"}
    solves: list = []
    real_solve = compose_mod.solve

    def recording_solve(model_, options, *, name):  # instrumentation only: same call, result kept
        res = real_solve(model_, options, name=name)
        solves.append(res)
        return res

    compose_mod.solve = recording_solve
    start = time.perf_counter()
    try:
        result = compile_spec(path, stop_after="compose")
    except HetcompileError as exc:
        row["error"] = str(exc).splitlines()[0][:90]
        return row
    finally:
        compose_mod.solve = real_solve
    row["pass_s"] = next(r.time_s for r in result.ir.reports if r.name == "compose")
    row["total_s"] = time.perf_counter() - start
    ir = result.ir
    t = tables(ir)
    opts = SolverOptions(time_limit_s=args.time_limit, mip_gap=args.mip_gap, threads=1, seed=0)
    s1 = solves[0]
    lam = sum(t.demand.values())  # the model solves for theta * sum(lambda) (1 here: shares)
    row.update(
        shapes=len(t.shapes), ints_vars=count_vars(t), status=s1.status,
        theta=None if s1.objective is None else s1.objective / lam, bound=None if s1.bound is None else s1.bound / lam,
        gap=s1.gap,
        t1=s1.time_s, t2=solves[1].time_s if len(solves) > 1 else float("nan"),
        scale=ir.composition.scale, cost_h=solution_cost(dict(ir.composition.counts), t) * 3600,
        plan=gpus_used(ir),
    )
    lp_theta, row["lp_s"] = lp_relaxation(t, opts)
    row["lp_theta"] = None if lp_theta is None else lp_theta / lam
    row["greedy_theta"] = theta_of(t, greedy(t), opts) / lam
    return row


SHORT = {"RTX4090": "4090", "A40": "A40", "A6000": "A6000", "L40": "L40", "A100-80GB": "A100", "H100": "H100"}


def gpus_used(ir) -> str:
    """GPUs the plan rents per type, e.g. '4090:16 A40:12'."""
    used: dict[str, int] = {}
    for c, n in ir.composition.counts:
        s = ir.shape(c)
        used[s.gpu] = used.get(s.gpu, 0) + n * s.gpus
    return " ".join(f"{SHORT.get(g, g)}:{used[g]}" for g in GPUS if g in used)


def fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_row(r: dict) -> None:
    if "error" in r:
        print(f"{r['inst']:<16} ERROR {r['error']}", flush=True)
        return
    ints, total = r["ints_vars"]
    ratio_g = r["scale"] / r["greedy_theta"] if r["greedy_theta"] else float("inf")
    ratio_lp = r["lp_theta"] / r["theta"] if r["theta"] else float("nan")
    print(
        f"{r['inst']:<16} {r['shapes']:>6} {ints:>4}/{total:<5} {r['status']:<8} {fmt(r['theta'], '8.3f')} "
        f"{fmt(r['bound'], '8.3f')} {fmt(r['gap'], '8.1e')} {r['t1']:7.3f} {fmt(r['t2'], '7.3f')} {r['pass_s']:7.3f} "
        f"{r['cost_h']:6.2f} {fmt(r['lp_theta'], '8.3f')} {r['lp_s']:7.4f} {r['greedy_theta']:8.3f} "
        f"{ratio_lp:7.4f} {ratio_g:7.3f} {r['t1'] / r['lp_s']:7.1f}  {r['plan']}",
        flush=True,
    )


HEADER = (
    f"{'inst':<16} {'shapes':>6} {'int/vars':<10} {'stat':<8} {'theta':>8} {'bound':>8} {'gap':>8} {'t1 s':>7} "
    f"{'t2 s':>7} {'pass s':>7} {'$/h':>6} {'LP th':>8} {'LP s':>7} {'greedy':>8} {'LP/MILP':>7} {'MILP/gr':>7} "
    f"{'t1/LP':>7}  GPUs rented"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 instances: avail 1 and 4, budget 30 $/h, both models, trace 1")
    ap.add_argument("--traces", default="1,2,3", help="comma list of Table 5 traces (default all three)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per MILP solve (default 60)")
    ap.add_argument("--mip-gap", type=float, default=1e-4, help="relative MIP gap (default 1e-4, the spec default)")
    args = ap.parse_args()
    traces = [int(x) for x in args.traces.split(",")]
    if args.quick:
        grid = [(a, 30, m, 1) for a in (1, 4) for m in MODELS]
    else:
        grid = [(a, b, m, tr) for tr in traces for m in MODELS for a in AVAIL for b in BUDGETS]
    print(f"compose_scale: {len(grid)} instances, objective max-throughput, time limit {args.time_limit:g} s/solve, "
          f"mip_gap {args.mip_gap:g}, threads 1")
    print(HEADER)
    rows = []
    with tempfile.TemporaryDirectory(prefix="compose_scale_") as d:
        for inst in grid:
            r = run_instance(*inst, args, Path(d))
            rows.append(r)
            print_row(r)
    ok = [r for r in rows if "error" not in r]
    if not ok:
        print("no instance solved")
        return 1
    t1 = [r["t1"] for r in ok]
    passes = [r["pass_s"] for r in ok]
    gaps = [r["gap"] for r in ok if r["gap"] is not None]
    lp = [r["lp_s"] for r in ok]
    print()
    print(f"solved {len(ok)}/{len(rows)}; optimal (stage 1) {sum(r['status'] == 'optimal' for r in ok)}")
    print(f"stage-1 solve s: median {statistics.median(t1):.3f}  max {max(t1):.3f}   "
          f"compose pass s: median {statistics.median(passes):.3f}  max {max(passes):.3f}")
    print(f"LP relaxation s: median {statistics.median(lp):.4f}  max {max(lp):.4f}   "
          f"stage-1 / LP time: median {statistics.median(r['t1'] / r['lp_s'] for r in ok):.1f}x")
    print(f"gap: max {max(gaps):.2e}   LP/MILP theta: max {max(r['lp_theta'] / r['theta'] for r in ok):.4f}   "
          f"MILP/greedy theta: median {statistics.median(r['scale'] / r['greedy_theta'] for r in ok if r['greedy_theta']):.3f}  "
          f"min {min(r['scale'] / r['greedy_theta'] for r in ok if r['greedy_theta']):.3f}  "
          f"max {max(r['scale'] / r['greedy_theta'] for r in ok if r['greedy_theta']):.3f}")
    print(f"shapes: {min(r['shapes'] for r in ok)}-{max(r['shapes'] for r in ok)}; "
          f"integer vars: {min(r['ints_vars'][0] for r in ok)}-{max(r['ints_vars'][0] for r in ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
