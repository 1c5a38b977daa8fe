"""Small synthetic placement problems and brute-force optima for the placement tests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hetcompile.placement.evaluate import helix_flow
from hetcompile.placement.problem import Link, ModelSpec, NodeGroup, PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit


def profile(tp: int, T: Sequence[float], kv_per_layer: float = 2e5, dec_ms: float = 5.0, pre_ms: float = 20.0) -> StageProfile:
    """A stage profile: T(k) as given, KV(k) = kv_per_layer * (K - k + 1) token-layers, linear times."""
    K = len(T)
    return StageProfile(
        tp=tp, max_layers=K, throughput=tuple(float(t) for t in T),
        kv_token_layers=tuple(kv_per_layer * (K - k + 1) for k in range(1, K + 1)),
        decode_time=((1.0, dec_ms * 1e-3), (256.0, 3 * dec_ms * 1e-3)),
        prefill_time=((256.0, pre_ms * 1e-3 / 8), (2048.0, pre_ms * 1e-3)),
        source="test",
    )


def problem(
    groups: Sequence[tuple[str, str, int, int, dict[int, Sequence[float]]]], L: int, *,
    intra_bw: float = 1e12, inter_bw: float = 1e12, latency: float = 1e-3, name: str = "test",
    max_concurrency: int | None = 64,
) -> PlacementProblem:
    """groups: (gpu, region, count, gpus per node, {tp: T table}); activations are 1 byte/token."""
    gs = []
    for gpu, region, count, gpus, tables in groups:
        prefix = f"{gpu.lower()}-{region}-"
        gs.append(NodeGroup(prefix, gpu, region, count, gpus, tuple(profile(tp, T) for tp, T in sorted(tables.items()))))
    regions = sorted({g.region for g in gs})
    links = []
    for a, b in itertools.combinations_with_replacement(regions, 2):
        links.append(Link(a, b, intra_bw if a == b else inter_bw, latency))
    model = ModelSpec(name="m", num_layers=L, token_bytes=1.0, activation_bytes=1.0, input_tokens=100, output_tokens=50,
                      max_concurrency=max_concurrency)
    return PlacementProblem(name, model, tuple(gs), tuple(links), regions[0])


def brute_force_shared(p: PlacementProblem) -> float:
    """Max Helix flow over every placement (nodes of a group interchangeable unless node links differ)."""
    L = p.num_layers
    per_group = []
    for gi, g in enumerate(p.groups):
        K = g.native.max_layers
        opts = [None] + [(a, a + k) for k in range(1, K + 1) for a in range(0, L - k + 1)]
        # nodes of a group are interchangeable only without per-node links: multisets, else every tuple
        choices = itertools.product(opts, repeat=g.count) if p.node_links else itertools.combinations_with_replacement(opts, g.count)
        per_group.append([(gi, c) for c in choices])
    best = 0.0
    for combo in itertools.product(*per_group):
        units = []
        for gi, choice in combo:
            g = p.groups[gi]
            for node, iv in zip(g.ids, choice):
                if iv is not None:
                    units.append(StageUnit(node, node, gi, g.gpus_per_node, tuple(range(g.gpus_per_node)), *iv))
        val, _ = helix_flow(p, units)
        best = max(best, val)
    return best


def brute_force_chains(p: PlacementProblem) -> float:
    """Max summed chain bottleneck over partitions of native-TP nodes into chains (uniform links)."""
    L = p.num_layers
    nodes = [(gi, n) for gi, g in enumerate(p.groups) for n in g.ids]
    best = 0.0
    n = len(nodes)
    for labels in itertools.product(range(n + 1), repeat=n):  # label n = unused
        chains: dict[int, list[int]] = {}
        for (gi, _), lab in zip(nodes, labels):
            if lab < n:
                chains.setdefault(lab, []).append(gi)
        if any(labels[i] > max(labels[:i], default=-1) + 1 and labels[i] < n for i in range(n)):
            continue  # canonical labelling only
        total = 0.0
        for members in chains.values():
            tps = {p.groups[gi].gpus_per_node for gi in members}
            if len(tps) > 1:
                total = -1.0
                break
            Ts = [p.groups[gi].native.throughput for gi in members]
            total += _chain_best(Ts, L)
        best = max(best, total)
    return best


def _chain_best(Ts: list[tuple[float, ...]], L: int) -> float:
    best = 0.0
    for ks in itertools.product(*[range(1, len(T) + 1) for T in Ts]):
        if sum(ks) == L:
            best = max(best, min(T[k - 1] for T, k in zip(Ts, ks)))
    return best


def brute_force_chain_search(p: PlacementProblem, objective: str) -> float:
    """Optimum of the chain search's own evaluator: every node mode (whole, or cut into TP
    slices), every partition of the slots into chains of one TP (slots may stay unused), each
    chain in the search's stage order at its best layer split."""
    from hetcompile.placement.chains.search import ChainSearch, order_slots, slots_of

    cs = ChainSearch(p, objective)
    nodes = [(n, g) for g in p.groups for n in g.ids]
    best = 0.0
    for modes in itertools.product(*[sorted(pr.tp for pr in g.profiles) for _, g in nodes]):
        slots = [s for (n, _), tp in zip(nodes, modes) for s in slots_of(p, n, tp)]

        def rec(i: int, chains: list[list]) -> None:
            nonlocal best
            if i == len(slots):  # noqa: B023 (rec runs inside this iteration)
                best = max(best, sum(cs.split(order_slots(p, tuple(c)))[0] for c in chains))
                return
            s = slots[i]  # noqa: B023
            rec(i + 1, chains)  # unused
            for c in chains:
                if c[0].tp == s.tp:
                    c.append(s)
                    rec(i + 1, chains)
                    c.pop()
            chains.append([s])
            rec(i + 1, chains)
            chains.pop()

        rec(0, [])
    return best
