"""ReplicaModel.decode_times is stage_times of a decode-only batch, bit for bit (the simulator's
decode runs call it once per micro-batch step; a plan's verification must not depend on which one
ran)."""

from __future__ import annotations

import random

from hetcompile.perf.stepmodel import LayerCost, ReplicaModel, StageModel


def _cost(rng: random.Random) -> LayerCost:
    return LayerCost(flop_s_per_token=rng.uniform(1e-7, 1e-5), attn_s_per_pair=rng.uniform(1e-11, 1e-9),
                     weights_s=rng.uniform(1e-5, 1e-3), kv_s_per_token=rng.uniform(1e-9, 1e-7),
                     serial_fraction=rng.choice([0.0, rng.uniform(0, 0.5)]), comm_s_per_token=rng.choice([0.0, 1e-7]),
                     comm_s=rng.choice([0.0, 2e-5]))


def _model(rng: random.Random) -> ReplicaModel:
    costs = [_cost(rng) for _ in range(rng.randint(1, 3))]  # one kind, or stages of several GPU types
    stages = tuple(StageModel(gpu="g", tp=1, layers=rng.choice([3, 4, 4, 7]), kv_tokens=1e5, cost=rng.choice(costs),
                              head_s=rng.choice([0.0, 1e-3])) for _ in range(rng.randint(1, 6)))
    return ReplicaModel(stages=stages, step_overhead_s=rng.uniform(0, 2e-3), step_gpu_s=rng.uniform(0, 1e-3),
                        seq_overhead_s=rng.uniform(0, 1e-4), max_num_seqs=256, chunk_tokens=2048,
                        host_overlap=rng.random() < 0.8)


def test_decode_times_is_stage_times_bit_for_bit() -> None:
    rng = random.Random(0)
    kinds = set()
    for _ in range(200):
        m = _model(rng)
        terms = m.stage_terms()
        kinds.add((len(terms[0]) > 1, terms[2] is None, m.host_overlap))
        f = m.decode_times(terms)
        for _ in range(20):
            n = float(rng.randint(1, 512))
            S = float(rng.randint(1, 2_000_000))
            assert f(n, S) == m.stage_times(n, S, S, n, terms)
    assert len(kinds) == 8  # every branch: one kind or several, shared stage triples or not, overlap or not
