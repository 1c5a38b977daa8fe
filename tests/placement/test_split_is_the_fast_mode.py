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


def _every_candidate(p, slots):
    """depth_split as it was before it skipped candidates by their floor: the split search at every
    usable concurrency candidate, the first of the largest values."""
    import numpy as np

    from hetcompile.perf.capacity import fluid_batch, fluid_rate
    from hetcompile.perf.stepmodel import hops_seconds, step_seconds
    from hetcompile.placement.chains import splits

    L, d, m = p.num_layers, len(slots), p.model
    data = [splits._slot_data(p, s) for s in slots]
    if d == 0 or d > L or sum(x.K for x in data) < L:
        return 0.0, []
    cands, kcaps = splits._candidates(data)
    usable = (kcaps.min(axis=1) >= 1) & (kcaps.sum(axis=1) >= L)
    costs, links = [x.cost for x in data], splits._hops(p, slots)
    head = np.zeros(d)
    head[-1] = data[-1].prof.head_s + m.step_gpu_s
    best, best_ks = 0.0, []
    for j in np.nonzero(usable)[0]:
        c, kcap = float(cands[j]), kcaps[j]
        n, S, A, seqs = fluid_batch(c / d, m.input_tokens, m.output_tokens)
        tau = np.array(splits._taus(p, slots, costs, c, n, S, A))
        steps = np.arange(1, int(kcap.max()) + 1)
        grid = np.unique((steps[None, :] * tau[:, None] + head[:, None])[steps[None, :] <= kcap[:, None]])
        fits = np.maximum(0.0, np.floor((grid[:, None] - head[None, :]) / tau[None, :] + 1e-9))
        ok = np.nonzero(np.minimum(kcap[None, :], fits).sum(axis=1) >= L)[0]
        if not len(ok):
            continue
        ks = np.minimum(kcap, np.maximum(0.0, np.floor((grid[ok[0]] - head) / tau + 1e-9))).astype(int)
        if ks.min() < 1:
            continue
        surplus = int(ks.sum() - L)
        while surplus > 0:
            i = int(np.argmax(np.where(ks > 1, ks * tau + head, -1.0)))
            ks[i] -= 1
            surplus -= 1
        host = m.step_host_s(seqs)
        times = tuple(float(step_seconds(float(t), host)) for t in ks * tau + head)
        X, _ = fluid_rate(times, hops_seconds(links, n, m.activation_bytes), c)
        cap = X * (1.0 + m.input_tokens / m.output_tokens)
        if cap > best * (1 + 1e-12):
            best, best_ks = cap, [int(k) for k in ks]
    return float(best), best_ks


@pytest.mark.parametrize("seed", range(4))
def test_skipping_candidates_by_their_floor_changes_no_split(seed: int) -> None:
    """depth_split skips a concurrency candidate whose best conceivable rate (no split's tau is below
    max(host, (L min tau_i + head + H) / d)) cannot beat the best found; on random chains with KV
    caches that bind (many candidates) it returns what searching every candidate returns."""
    rng = random.Random(100 + seed)
    base = _random_problem(rng, head_s=1e-3, step_gpu_s=1e-3)
    p = dataclasses.replace(base, model=dataclasses.replace(base.model, max_concurrency=None))
    compared = 0
    for chain in _chains(p, rng, 15):
        got = depth_split(p, list(chain))
        assert got == _every_candidate(p, list(chain))
        compared += got[0] > 0
    assert compared
