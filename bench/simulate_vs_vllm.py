"""Simulated vs measured throughput of one replica at the same offered load (a shared trace).

    .venv/bin/python bench/simulate_vs_vllm.py URL OUT [--rate R] [--duration D] [--workload W]

URL: a running vLLM server of one replica of the plan in OUT (OUT/plan.json, built from a spec
that includes the server's `hetcompile profile` output, so the replica's step model is fitted).
A Poisson trace of workload W at R requests/s (default 1.5x the plan's capacity for W, i.e.
saturation) over D seconds is replayed open-loop against the server and through the simulator;
prints both throughputs, their ratio and the latency percentiles. The baseline is the real run,
measured in the same invocation. tests/engine/test_profile_simulate.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from hetcompile.plan.doc import PlanDoc  # noqa: E402
from hetcompile.plan.io import read_plan_doc  # noqa: E402
from hetcompile.profiling.replay import replay, throughput  # noqa: E402
from hetcompile.simulate.loadgen import poisson_times  # noqa: E402
from hetcompile.simulate.run import Arrival, WARMUP_FRACTION, simulate  # noqa: E402


def one_replica(plan: PlanDoc, rid: str) -> PlanDoc:
    reps = tuple(r for r in plan.replicas if r.id == rid)
    return plan.model_copy(update={"replicas": reps, "routing": {w: {rid: 1.0} for w in plan.routing}})


def trace(plan: PlanDoc, workload: str, rate: float, duration: float, seed: int) -> list[Arrival]:
    """round(rate x duration) Poisson arrivals at exactly `rate` over the run (loadgen.poisson_times):
    an unscaled seeded draw can offer 40% less than asked, below the capacity it means to exceed."""
    w = next(x for x in plan.workloads if x.name == workload)
    n = max(1, round(rate * duration))
    return [Arrival(round(t + 0.5 / rate, 6), workload, round(w.input_tokens), round(w.output_tokens))
            for t in poisson_times(n, rate, seed)]


def compare(url: str, plan: PlanDoc, workload: str, rate: float | None, duration: float, seed: int = 0) -> dict:
    rid = plan.replicas[0].id
    single = one_replica(plan, rid)
    cap = plan.replicas[0].workloads[workload].capacity_requests_per_s
    rate = rate or 1.5 * cap
    arr = trace(plan, workload, rate, duration, seed)
    sim = simulate(single, arr, duration, seed=seed, arrivals_name="trace")
    real = replay(url, arr)
    warm = duration * WARMUP_FRACTION
    sw = next(w for w in sim.workloads if w.name == workload)
    inside = [m for m in real if warm <= m.arrival <= duration]
    ttft = [m.first_token - m.arrival for m in inside]
    tpot = [(m.finish - m.first_token) / (m.output_tokens - 1) for m in inside if m.output_tokens > 1]
    return {
        "replica": rid, "workload": workload, "offered_rps": len(arr) / duration, "plan_capacity_rps": cap,
        "requests": len(arr), "real_answered": len(real),
        "sim_rps": sw.throughput_requests_per_s, "real_rps": throughput(real, warm, duration),
        "sim_ttft_p50_s": sw.ttft_s.p50, "real_ttft_p50_s": float(np.percentile(ttft, 50)),
        "sim_tpot_p50_s": sw.tpot_s.p50, "real_tpot_p50_s": float(np.percentile(tpot, 50)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--rate", type=float, default=None)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--workload", default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    plan = read_plan_doc(a.out)
    workload = a.workload or sorted(plan.replicas[0].workloads)[0]
    res = compare(a.url, plan, workload, a.rate, a.duration, a.seed)
    print(json.dumps(res, indent=2))
    print(f"sim/real throughput: {res['sim_rps'] / res['real_rps']:.3f}")


if __name__ == "__main__":
    main()
