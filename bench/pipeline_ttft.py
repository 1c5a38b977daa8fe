"""Bench: the tail model's p99 TTFT on pipelines against the simulator's, and the convoy it leaves out.

    .venv/bin/python bench/pipeline_ttft.py [--examples helix-geo24,helix-single24] [--loads 0.2,0.4,0.6,0.8]

Why the searching builds verify in 3-5 rounds (issue 32): on the Helix chains the first plan misses
its p99 TTFT bound by 2-5x, so the verify pass replans until the load is 39-85% of the tail
model's. For every pipeline shape (depth >= 2) of the golden plans, one replica is offered Poisson
arrivals of its workload alone at each load x h_full (perf/capacity.py), for max(3000 requests, 40
request lifetimes), fixed lengths; printed per load: perf/tail.py's p99 TTFT, the simulator's p99
and mean, and rho_conv = lambda S_conv.

S_conv is a candidate for what the model leaves out, printed so that it can be checked: the
convoy a prompt drives through an in-order pipeline. Every stage serves micro-batches in launch
order, so the batches behind a prompt's chunk wait behind it at every stage and every hop, and the
pipeline loses about

    S_conv = sum_i (T_i - t_i) + sum_i (H_i - h_i)

per prompt: T_i, H_i a chunk of I prompt tokens on stage i and hop i, t_i, h_i a decode batch of
ceil(C / d) sequences at the mean context (C: the KV concurrency). A request that arrives behind a
convoy waits for it before its prompt is even batched: no batch completes to free a slot (on
helix-geo24 at 40% load the longest waits before admission were 6.4-6.6 s, with all 14 batches
due within 0.3 s of each other). The tail model's prompt queue (prefill_wait) serves prompts at
the slowest stage's full-chunk rate, I / P: 0.14 s for helix-geo24's 750-token prompt, against
S_conv = 2.1 s (its WAN hop alone takes 1 s per chunk). An M/D/1 queue on S_conv comes near the
simulator on geo24's 14-stage chain (p99 10.3 s against 13.0 s at 40% load) but not on
llama70b-pp's PP-2 replicas at 80% (6 s against 55 s), where another queue binds: what the
simulator serves there against h_full is the next thing to measure.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.perf.capacity import chain_capacity  # noqa: E402
from hetcompile.perf.stepmodel import ReplicaModel  # noqa: E402
from hetcompile.perf.tail import TailModel  # noqa: E402
from hetcompile.plan.io import read_plan_doc  # noqa: E402
from hetcompile.simulate.capacity_check import _shapes  # noqa: E402
from hetcompile.simulate.run import poisson_requests, ttft_of  # noqa: E402


def convoy_seconds(rm: ReplicaModel, I: float, O: float, C: float) -> float:
    """S_conv (module docstring): what one prompt's chunk costs the batches behind it."""
    n = float(min(I, rm.chunk_tokens))
    chunk = rm.stage_times(n, 0.0, n * n / 2.0, 1.0)
    m = float(max(1, math.ceil(C / rm.depth)))
    S = m * (I + O / 2.0)
    decode = rm.stage_times(m, S, S, m)
    return sum(max(0.0, a - b) for a, b in zip(chunk, decode)) + rm.hop_time(n) - rm.hop_time(m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", type=Path, default=ROOT / "tests" / "golden")
    ap.add_argument("--examples", default="helix-cluster10,helix-geo24,helix-highhet42,helix-single24,llama70b-pp")
    ap.add_argument("--loads", default="0.2,0.4,0.6,0.8")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    loads = [float(x) for x in a.loads.split(",")]
    print(f"{'plan':16s} {'rep':4s} {'d':>3s} {'I/O':>9s} {'S_conv':>7s} {'load':>5s} {'rho_conv':>8s} "
          f"{'tail p99':>9s} {'sim p99':>9s} {'sim mean':>9s}")
    for name in a.examples.split(","):
        plan = read_plan_doc(a.golden / name / "plan.json")
        for r, w in _shapes(plan):
            rm = r.step_model.model()
            if rm.depth < 2:
                continue
            I, O = max(1, round(w.input_tokens)), max(2, round(w.output_tokens))
            full = chain_capacity(rm, I, O)
            tail = TailModel(rm, I, O)
            s_conv = convoy_seconds(rm, I, O, full.concurrency)
            life = full.ttft_s + O * full.tpot_s
            for load in loads:
                lam = load * full.requests_per_s
                reqs = poisson_requests(rm, I, O, lam, max(3000.0 / lam, 40.0 * life), a.seed)
                t = np.array([ttft_of(q) for q in reqs])
                print(f"{name:16s} {r.id:4s} {rm.depth:3d} {f'{I}/{O}':>9s} {s_conv:7.2f} {load:5.2f} {lam * s_conv:8.2f} "
                      f"{tail.point(lam, 0.99).ttft_s:9.2f} {np.percentile(t, 99):9.2f} {t.mean():9.2f}", flush=True)


if __name__ == "__main__":
    main()
