"""perf/tail.py's prompt queue on pipelines: a prompt holds it for the convoy it drives through the
in-order stages (`prompt_hold`), not for its share of the slowest stage's chunk rate."""

from __future__ import annotations

import math

import numpy as np

from hetcompile.perf.capacity import chain_capacity, prefill_rate
from hetcompile.perf.stepmodel import Hop, LayerCost, ReplicaModel, StageModel
from hetcompile.perf.tail import TailModel, prefill_wait, prompt_hold
from hetcompile.simulate.run import poisson_requests, ttft_of

COST = LayerCost(flop_s_per_token=8.75e-6, attn_s_per_pair=2e-10, weights_s=1.2e-3, kv_s_per_token=3e-8,
                 serial_fraction=0.0, comm_s_per_token=0.0, comm_s=0.0)
I, O = 750, 240


LAN, WAN = Hop(latency_s=1e-3, bandwidth=1e10), Hop(latency_s=0.05, bandwidth=12.5e6)


def _chain(depth: int, layers: int = 10, wan: bool = False, chunk: int = 2048) -> ReplicaModel:
    """depth stages of `layers` layers each; with `wan`, the middle hop crosses a 12.5 MB/s link."""
    stages = tuple(StageModel(gpu="g", tp=1, layers=layers, kv_tokens=4e5, cost=COST) for _ in range(depth))
    hops = tuple(WAN if wan and i == (depth - 1) // 2 else LAN for i in range(depth - 1))
    return ReplicaModel(stages=stages, hops=hops,
                        activation_bytes=16384.0, step_overhead_s=5e-4, seq_overhead_s=5e-5, request_overhead_s=0.01,
                        max_num_seqs=256, chunk_tokens=chunk)


def _convoy(rm: ReplicaModel, n: float, done: float, m: float, context: float) -> float:
    """By hand: sum_i (T_i - t_i)^+ + (H - h)^+ for one chunk of n tokens after `done`."""
    chunk = rm.stage_times(n, done, n * done + n * n / 2.0, 1.0)
    decode = rm.stage_times(m, m * context, m * context, m)
    return sum(max(0.0, a - b) for a, b in zip(chunk, decode)) + max(0.0, rm.hop_time(n) - rm.hop_time(m))


def test_one_stage_holds_the_chunk_rate() -> None:
    rm = _chain(1, layers=60)
    assert TailModel(rm, I, O).hold(I) == I / prefill_rate(rm)


def test_a_pipeline_holds_its_convoy() -> None:
    rm = _chain(6)
    tm = TailModel(rm, I, O)
    m = float(math.ceil(tm.c_max / rm.depth - 1e-9))
    want = _convoy(rm, I, 0.0, m, I + O / 2.0)
    assert tm.hold(I) == want
    assert want > 3 * I / prefill_rate(rm)  # six stages in order: far above one stage's share


def test_a_slow_hop_adds_its_transfer_not_its_latency() -> None:
    fast, slow = _chain(6), _chain(6, wan=True)
    tf, ts = TailModel(fast, I, O), TailModel(slow, I, O)
    m = float(math.ceil(ts.c_max / slow.depth - 1e-9))
    extra = (slow.hop_time(I) - slow.hop_time(m)) - (fast.hop_time(I) - fast.hop_time(m))
    assert math.isclose(ts.hold(I) - tf.hold(I), extra, rel_tol=1e-9)
    assert extra > 0.9  # 750 x 16 KiB at 12.5 MB/s


def test_a_long_prompt_holds_each_of_its_chunks() -> None:
    rm = _chain(4, wan=True, chunk=512)
    tm = TailModel(rm, 1200, O)
    m, ctx = float(math.ceil(tm.c_max / rm.depth - 1e-9)), 1200 + O / 2.0
    want = _convoy(rm, 512, 0, m, ctx) + _convoy(rm, 512, 512, m, ctx) + _convoy(rm, 176, 1024, m, ctx)
    assert want > 1200 / prefill_rate(rm)
    assert math.isclose(prompt_hold(rm, 1200, prefill_rate(rm), tm.c_max, ctx), want, rel_tol=1e-12)


def test_the_tail_model_tracks_the_simulator_on_a_deep_chain() -> None:
    """Six stages across a WAN hop at 40% of full load: the simulator's p99 TTFT against the tail
    model's, which charged only I / P per prompt before (and then stated about the idle TTFT)."""
    rm = _chain(6, wan=True)
    tm = TailModel(rm, I, O)
    lam = 0.4 * chain_capacity(rm, I, O).requests_per_s
    reqs = poisson_requests(rm, I, O, lam, 2500.0 / lam, seed=0)
    sim = float(np.percentile([ttft_of(r) for r in reqs], 99))
    model = tm.point(lam, 0.99).ttft_s
    assert 0.6 < model / sim < 1.6
    base = tm.point(lam, 0.99, prompts=[]).ttft_s  # the TTFT without the prompt queue
    chunk_rate = base + prefill_wait([(lam, I)], tm.prefill_rate, 0.99)
    assert chunk_rate / sim < 0.6  # what the model said before: this test fails without the convoy
