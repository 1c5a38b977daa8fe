"""The last step of chain placement decides by the capacity formula's full mode (what the plan reports):
a chain is cut in two when the full mode says the two serve more, never the other way."""

from __future__ import annotations

from hetcompile.placement.chain_model import full_tokens_per_s
from hetcompile.placement.chains.place import polish_full_mode
from hetcompile.placement.chains.search import ChainSearch, order_slots, slots_of
from hetcompile.placement.chains.splits import stages_from_split

from .util import problem


def _full(p, search, chains) -> float:
    total = 0.0
    for c in chains:
        val, ks = search.split(c)
        total += full_tokens_per_s(p, stages_from_split(list(c), ks)) if val > 0 and ks else 0.0
    return total


def test_a_deep_chain_of_nodes_that_each_hold_the_model_is_cut() -> None:
    p = problem([("A", "r", 6, 1, {1: [900.0 - 50 * k for k in range(8)]})], L=8)
    search = ChainSearch(p, "depth-aware")
    deep = order_slots(p, [s for n in p.groups[0].ids for s in slots_of(p, n, 1)])
    before = _full(p, search, [deep])
    out, used = polish_full_mode(p, [deep], search)
    assert len(out) > 1 and used > 0
    assert sorted(s.unit for c in out for s in c) == sorted(s.unit for s in deep)  # same slots, cut
    assert _full(p, search, out) > before


def test_polish_never_lowers_the_full_mode_value() -> None:
    for count, K in ((3, 4), (4, 3), (5, 8)):
        p = problem([("A", "r", count, 1, {1: [500.0] * K}), ("B", "s", 2, 1, {1: [300.0] * K})], L=K)
        search = ChainSearch(p, "depth-aware")
        slots = [s for g in p.groups for n in g.ids for s in slots_of(p, n, 1)]
        chains = [order_slots(p, slots)]
        before = _full(p, search, chains)
        out, _ = polish_full_mode(p, chains, search)
        assert _full(p, search, out) >= before * (1 - 1e-12)
