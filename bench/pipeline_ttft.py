"""Bench: the tail model's p99 TTFT on pipelines against the simulator's, and the convoy it prices.

    .venv/bin/python bench/pipeline_ttft.py [--examples helix-geo24,helix-single24] [--loads 0.2,0.4,0.6,0.8]

Why the searching builds verify in 3-5 rounds (issue 32): on the Helix chains the first plan misses
its p99 TTFT bound by 2-5x, so the verify pass replans until the load is 39-85% of the tail
model's. For every pipeline shape (depth >= 2) of the golden plans, one replica is offered Poisson
arrivals of its workload alone at each load x h_full (perf/capacity.py), for max(3000 requests, 40
request lifetimes), fixed lengths; printed per load: perf/tail.py's p99 TTFT, the simulator's p99
and mean, and rho_conv = lambda S_conv.

S_conv is the convoy a prompt drives through an in-order pipeline, which perf/tail.py's prompt
queue has charged a pipeline's prompt since it was measured here: the column is what the tail
model charges, `TailModel.hold` (perf/tail.py's `prompt_hold`, summed over the prompt's chunks and
at least I / P; before, the queue served prompts at I / P as on one stage). Every stage serves
micro-batches in launch order, so the batches behind a prompt's chunk wait behind it at every stage and every hop, and the
pipeline loses about

    S_conv = sum_i (T_i - t_i) + sum_i (H_i - h_i)

per prompt: T_i, H_i a chunk of I prompt tokens on stage i and hop i, t_i, h_i a decode batch of
ceil(C / d) sequences at the mean context (C: the KV concurrency). A request that arrives behind a
convoy waits for it before its prompt is even batched: no batch completes to free a slot (on
helix-geo24 at 40% load the longest waits before admission were 6.4-6.6 s, with all 14 batches
due within 0.3 s of each other). The tail model's prompt queue served prompts at the slowest
stage's full-chunk rate, I / P: 0.14 s for helix-geo24's 750-token prompt, against S_conv = 2.1 s
(its WAN hop alone takes 1 s per chunk). An M/D/1 queue on S_conv comes near the
simulator on geo24's 14-stage chain (p99 10.3 s against 13.0 s at 40% load) but not on
llama70b-pp's PP-2 replicas at 80% (6 s against 55 s), where another queue binds: what the
simulator serves there against h_full is the next thing to measure.

Two more columns measure what a prompt's service time would have to be: T_P, the prompt's own
trip through every stage and hop on the idle replica (capacity.prefill_time less the per-request
overhead), and S_fit, the service time at which the tail model's own prompt queue (prefill_wait,
M/D/1) reproduces the simulator's p99: the simulated p99 less the tail model's TTFT without the
prompt queue is the wait to match (bisection; '-' where the simulator shows no wait). vLLM's
scheduler puts every waiting prompt into the next batch up to the token budget, and with d batches
in flight the next batch is formed only when the oldest completes, so a prompt that arrives while
another's chunk is in flight waits for that chunk's whole trip; merged prompts do not share it (a
chunk's stage times grow linearly with its tokens past a few hundred). Only a backlog above the
budget spills into the following batches, which then pipeline behind the first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetcompile.perf.capacity import chain_capacity, prefill_time  # noqa: E402
from hetcompile.perf.tail import TailModel, prompt_wait  # noqa: E402
from hetcompile.plan.io import read_plan_doc  # noqa: E402
from hetcompile.simulate.capacity_check import _shapes  # noqa: E402
from hetcompile.simulate.run import poisson_requests, ttft_of  # noqa: E402


def fitted_service(lam: float, wait: float, q: float = 0.99) -> float | None:
    """S_fit: the service time S of one prompt at which prompt_wait([(lam, S)], q), the tail model's
    M/D/1 prompt queue, waits `wait` at its q-quantile (it grows with S up to rho = lam S = 1); None
    where the wait is not positive."""
    if wait <= 0:
        return None
    lo, hi = 0.0, 1.0 / lam
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if prompt_wait([(lam, mid)], q) < wait else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--golden", type=Path, default=ROOT / "tests" / "golden")
    ap.add_argument("--examples", default="helix-cluster10,helix-geo24,helix-highhet42,helix-single24,llama70b-pp")
    ap.add_argument("--loads", default="0.2,0.4,0.6,0.8")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    loads = [float(x) for x in a.loads.split(",")]
    print(f"{'plan':16s} {'rep':4s} {'d':>3s} {'I/O':>9s} {'S_conv':>7s} {'load':>5s} {'rho_conv':>8s} "
          f"{'tail p99':>9s} {'sim p99':>9s} {'sim mean':>9s} {'T_P':>6s} {'S_fit':>6s} {'S_fit/T_P':>9s}")
    for name in a.examples.split(","):
        plan = read_plan_doc(a.golden / name / "plan.json")
        for r, w in _shapes(plan):
            rm = r.step_model.model()
            if rm.depth < 2:
                continue
            I, O = max(1, round(w.input_tokens)), max(2, round(w.output_tokens))
            full = chain_capacity(rm, I, O)
            tail = TailModel(rm, I, O)
            s_conv = tail.hold(I)
            life = full.ttft_s + O * full.tpot_s
            trip = prefill_time(rm, I) - rm.request_overhead_s  # T_P
            for load in loads:
                lam = load * full.requests_per_s
                reqs = poisson_requests(rm, I, O, lam, max(3000.0 / lam, 40.0 * life), a.seed)
                t = np.array([ttft_of(q) for q in reqs])
                p99 = float(np.percentile(t, 99))
                # the simulated p99 less the tail model's TTFT without its prompt queue: the wait to match
                s_fit = fitted_service(lam, p99 - tail.point(lam, 0.99, prompts=[]).ttft_s)
                fit = f"{s_fit:6.2f} {s_fit / trip:9.2f}" if s_fit is not None else f"{'-':>6s} {'-':>9s}"
                print(f"{name:16s} {r.id:4s} {rm.depth:3d} {f'{I}/{O}':>9s} {s_conv:7.2f} {load:5.2f} {lam * s_conv:8.2f} "
                      f"{tail.point(lam, 0.99).ttft_s:9.2f} {p99:9.2f} {t.mean():9.2f} {trip:6.2f} {fit}", flush=True)


if __name__ == "__main__":
    main()
