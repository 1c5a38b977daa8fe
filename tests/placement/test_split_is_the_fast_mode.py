"""The depth-aware split's value is perf/'s fast mode of the chain it returns (issue 33, item 3).

placement/splits.depth_split water-fills layers over a chain's stages with numpy for speed; the
number it ranks chains by must be what perf/capacity.fluid_capacity says of the same chain's step
model (placement/chain_model.chain_model), every term included: the last stage's lm_head read and
the step's other GPU work g. Random chains of random stage profiles, seeded, so a failure repeats.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from hetcompile.perf.capacity import fluid_capacity
from hetcompile.placement.chain_model import chain_model
from hetcompile.placement.chains.search import order_slots, slots_of
from hetcompile.placement.chains.splits import depth_split, stages_from_split

from .util import problem


def _random_problem(rng: random.Random, head_s: float, step_gpu_s: float):
    L = rng.randint(4, 12)
    groups = []
    for name, region in (("A", "r"), ("B", "r"), ("C", "s")):
        K = rng.randint(2, L)
        T = sorted((rng.uniform(100.0, 2000.0) for _ in range(K)), reverse=True)
        groups.append((name, region, rng.randint(1, 3), 1, {1: T}))
    p = problem(groups, L=L, latency=rng.uniform(1e-4, 5e-3), inter_bw=rng.uniform(1e8, 1e10))
    gs = tuple(dataclasses.replace(g, profiles=tuple(dataclasses.replace(pr, head_s=head_s) for pr in g.profiles))
               for g in p.groups)
    return dataclasses.replace(p, groups=gs, model=dataclasses.replace(p.model, step_gpu_s=step_gpu_s))


def _chains(p, rng: random.Random, n: int):
    slots = [s for g in p.groups for node in g.ids for s in slots_of(p, node, 1)]
    for _ in range(n):
        k = rng.randint(1, len(slots))
        yield order_slots(p, rng.sample(slots, k))


def _fast_tokens_per_s(p, chain, ks) -> float:
    m = p.model
    est = fluid_capacity(chain_model(p, stages_from_split(list(chain), ks)), m.input_tokens, m.output_tokens)
    return est.decode_tokens_per_s * (1 + m.input_tokens / m.output_tokens)


@pytest.mark.parametrize("seed", range(6))
def test_the_split_s_value_is_the_fast_mode_of_its_chain_and_a_head_term_moves_both(seed: int) -> None:
    rng = random.Random(seed)
    base = _random_problem(rng, head_s=0.0, step_gpu_s=0.0)
    heavy = dataclasses.replace(
        base, model=dataclasses.replace(base.model, step_gpu_s=2e-3),
        groups=tuple(dataclasses.replace(g, profiles=tuple(dataclasses.replace(pr, head_s=1e-3) for pr in g.profiles))
                     for g in base.groups))
    checked = moved = 0
    for chain in _chains(base, rng, 12):
        values = []
        for p in (base, heavy):
            val, ks = depth_split(p, list(chain))
            if val <= 0:
                break
            assert sum(ks) == p.num_layers and min(ks) >= 1
            assert val == pytest.approx(_fast_tokens_per_s(p, chain, ks), rel=1e-9)
            values.append(val)
        if len(values) == 2:
            checked += 1
            assert values[1] <= values[0] * (1 + 1e-9)  # more GPU work per step never serves more
            moved += values[1] < values[0] * (1 - 1e-6)
    assert checked and moved


@pytest.mark.parametrize("seed", range(4))
def test_flat_concurrency_tables_take_the_short_path_to_the_same_split(seed: int, monkeypatch) -> None:
    """Where no stage's KV cache binds (every concurrency table flat at max_concurrency),
    depth_split skips the candidate arrays: one candidate, kcap = K. The same splits and values as
    the general computation, on random chains; and the short path is taken there."""
    from hetcompile.placement.chains import splits

    rng = random.Random(seed)
    p = _random_problem(rng, head_s=1e-3, step_gpu_s=1e-3)
    chains = list(_chains(p, rng, 12))
    data = [splits._slot_data(p, s) for chain in chains for s in chain]
    assert all(x.flat is not None for x in data)  # util.problem's KV never binds
    short = [splits.depth_split(p, list(chain)) for chain in chains]
    general = splits._candidates
    monkeypatch.setattr(splits, "_candidates",
                        lambda data: general([dataclasses.replace(x, flat=None) for x in data]))
    p.memo.clear()
    assert [splits.depth_split(p, list(chain)) for chain in chains] == short
    assert any(v > 0 for v, _ in short)
