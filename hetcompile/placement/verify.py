"""Independent checks of a placement result, and its summary lines for plan.md.

`verify_result` re-derives everything from the units alone: layer ranges inside [0, L) and
within each profile's max layers, one TP per node, no GPU used twice, chains contiguous over
[0, L) with one TP, each chain's C equal to the minimum over its stages (vLLM's KV minimum),
and the Helix max flow recomputed by networkx with a different algorithm (Edmonds-Karp instead
of Boykov-Kolmogorov, which evaluate.py uses) equal to the reported flow. Any failure is a
PassError (a bug, not a user error).
"""

from __future__ import annotations

import math
from typing import NoReturn

from hetcompile.errors import PassError
from hetcompile.placement.evaluate import chain_eval, flow_graph, unit_concurrency
from hetcompile.placement.problem import SINK, SOURCE, PlacementProblem
from hetcompile.placement.result import PlacementResult


def _fail(res: PlacementResult, msg: str) -> NoReturn:
    raise PassError(f"place ({res.problem_name}, {res.mode}): {msg}")


def verify_result(res: PlacementResult, p: PlacementProblem | None = None, *, rel_tol: float = 1e-6) -> float:
    """Rebuild the graph, recompute the max flow with networkx; raise if it disagrees (p: res.problem by default)."""
    import networkx as nx  # here: a build without placement never needs its import

    p = p or res.problem
    if p is None:
        _fail(res, "verify needs the problem")
    units = _check_units(res, p)
    chains = _check_chains(res, p, units) if res.mode == "chains" else None
    G = flow_graph(p, res.units, chains, res.partial_inference)
    if G.out_degree(SOURCE) == 0 or G.in_degree(SINK) == 0:
        value = 0.0
    else:
        value = float(nx.maximum_flow_value(G, SOURCE, SINK, flow_func=nx.algorithms.flow.edmonds_karp))
    if not math.isclose(value, res.helix_flow, rel_tol=rel_tol, abs_tol=1e-6):
        _fail(res, f"networkx max flow {value} != reported {res.helix_flow}")
    return value


def _check_units(res: PlacementResult, p: PlacementProblem) -> set[str]:
    """Each unit once, on a node of its group, within its layers and its node's GPUs, one TP per
    node, no GPU twice; returns the units' names."""
    L = p.num_layers
    idx = p.node_index()
    node_tp: dict[str, int] = {}
    gpus_used: set[tuple[str, int]] = set()
    seen: set[str] = set()
    for u in res.units:
        if u.unit in seen:
            _fail(res, f"unit {u.unit} appears twice")
        seen.add(u.unit)
        if u.node not in idx or idx[u.node][0] != u.gi:
            _fail(res, f"unit {u.unit}: node {u.node} is not in group {u.gi}")
        g = p.groups[u.gi]
        prof = g.profile(u.tp)
        if not (0 <= u.start < u.end <= L) or u.layers > prof.max_layers:
            _fail(res, f"unit {u.unit} holds [{u.start}, {u.end}) (max {prof.max_layers} layers of {L})")
        if node_tp.setdefault(u.node, u.tp) != u.tp:
            _fail(res, f"node {u.node} runs at two TP sizes")
        if len(u.gpus) != u.tp or max(u.gpus) >= g.gpus_per_node:
            _fail(res, f"unit {u.unit}: GPUs {u.gpus} do not fit TP {u.tp} on {g.gpus_per_node} GPUs")
        for x in u.gpus:
            if (u.node, x) in gpus_used:
                _fail(res, f"GPU {x} of {u.node} is used twice")
            gpus_used.add((u.node, x))
    return seen


def _check_chains(res: PlacementResult, p: PlacementProblem, units: set[str]) -> list[list[str]]:
    """Each chain contiguous over all layers at one TP, every placed unit in exactly one chain, its
    C and capacity what the step model gives; returns each chain's units in order."""
    L = p.num_layers
    chains: list[list[str]] = []
    in_chain: set[str] = set()
    for c in res.chains:
        pos = 0
        for s in c.stages:
            if s.start != pos:
                _fail(res, f"chain {c.id} is not contiguous at layer {pos}")
            if s.tp != c.tp:
                _fail(res, f"chain {c.id} mixes TP {s.tp} and {c.tp}")
            if s.unit in in_chain:
                _fail(res, f"unit {s.unit} serves two chains")
            in_chain.add(s.unit)
            pos = s.end
        if pos != L:
            _fail(res, f"chain {c.id} covers {pos} of {L} layers")
        kv_min = min(unit_concurrency(p, s) for s in c.stages)
        if not math.isclose(c.concurrency, max(kv_min, 1e-9), rel_tol=1e-9):
            _fail(res, f"chain {c.id}: C {c.concurrency} is not the minimum over stages {kv_min}")
        if c.mixed != (len({p.groups[s.gi].gpu for s in c.stages}) > 1) or c.depth != len(c.stages):
            _fail(res, f"chain {c.id}: mixed flag or depth is wrong")
        ev = chain_eval(p, c.stages)
        if not math.isclose(ev.capacity, c.capacity, rel_tol=1e-9):
            _fail(res, f"chain {c.id}: capacity {c.capacity} != {ev.capacity}")
        chains.append([s.unit for s in c.stages])
    if in_chain != units:
        _fail(res, "a unit is placed but serves no chain")
    return chains


def summary_lines(res: PlacementResult) -> list[str]:
    """plan.md lines: flows, bound, and per chain its nodes, depth, C and the binding term."""
    out = [
        f"- placement ({res.mode}, objective {res.objective}): Helix-semantics flow {res.helix_flow:.1f} tokens/s, "
        f"depth-aware capacity {res.depth_aware_capacity:.1f} tokens/s (prompt + decode)",
    ]
    if res.bound is not None:
        gap = f", gap {100 * res.gap:.2f}%" if res.gap is not None else ""
        out.append(f"- bound on the {'Helix flow' if res.value == res.helix_flow else 'objective'}: {res.bound:.1f}{gap}"
                   f" (incumbent from {res.incumbent_source})")
    for c in res.chains:
        parts = " -> ".join(f"{s.unit}[{s.start},{s.end})" for s in c.stages)
        out.append(
            f"- {c.id}: TP {c.tp}, depth {c.depth}, {'mixed GPUs' if c.mixed else 'one GPU type'}; C = {c.concurrency:.0f} "
            f"({c.concurrency_limit}), micro-batch {c.micro_batch:.1f}; {c.capacity:.1f} tokens/s, bound by "
            f"{c.binding}; Helix flow {c.helix_flow:.1f}; {parts}"
        )
    return out


def engine_cost_lines(shared: PlacementResult, chains: PlacementResult) -> list[str]:
    """What the engine constraint (chains, one TP, no shared stages) costs in Helix's semantics."""
    if shared.helix_flow <= 0:
        return ["- shared pipelines found no flow; nothing to compare"]
    cost = 1.0 - chains.helix_flow / shared.helix_flow
    return [
        f"- Helix flow with shared per-request pipelines (not deployable): {shared.helix_flow:.1f} tokens/s",
        f"- Helix flow of the deployable chains: {chains.helix_flow:.1f} tokens/s "
        f"(the engine constraint costs {100 * cost:.1f}%)",
    ]
