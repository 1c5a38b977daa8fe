"""Evaluate a concrete placement: Helix-semantics max flow and the depth-aware capacity.

Helix semantics (seed 000 §4.3): each stage unit u is split into u:in -> u:out with capacity
T_u(k_u); source -> u:in if u holds layer 0 (capacity bandwidth / token bytes); u:out -> sink if
u holds the last layer; u:out -> v:in if end_u == start_v (partial inference: start_v <= end_u <
end_v), capacity bandwidth / activation bytes. The max flow is the serving throughput in
prompt + decode tokens/s. In chains mode only the chain's own consecutive edges exist.

Depth-aware capacity (the default objective; refines Helix's per-node T(k), which assumes every
node owns a KV-limited batch) is perf/capacity.py's formula in its fast (fluid) mode, on the chain's
ReplicaModel (chain_model.py): C = min(max_num_seqs, KV_min / s), b = C / d, every micro-batch step
carries b decode tokens and b I / O prompt tokens, tau = max(max_i t_i, (sum_i t_i + H) / d),
X = b / tau decode tokens/s; `capacity` = X (1 + I/O), prompt + decode tokens/s (Helix's unit). The
plan reports the full mode of the same formula on the same model (place_problem.chain_estimate).

For shared (per-request) pipelines a max flow is decomposed into paths p with flows f_p; each path
gets the share f_p / f_u of every unit's KV (C_p = min_u share * C_u), nodes batch the
micro-batches of all their paths together (B_u = sum_p C_p / d_p; t_u(B) the fluid step time of the
unit's StageModel), and
    max sum_p X_p  s.t.  sum_{p through u} X_p t_u(B_u) / B_u <= 1  (unit u busy at most 100%)
                         X_p <= C_p / (sum_{u in p} t_u(B_u) + H_p)   (round trip of path p)
which is the chain formula for a single path plus Helix's wrap hop through the coordinator (sink
link + source link). A placement has many maximum flows and they decompose
differently, so `shared_depth_aware` takes the best of the flows four max-flow algorithms return
(the comparison gives the shared baselines the benefit of the doubt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hetcompile.perf.capacity import fluid_batch, fluid_capacity
from hetcompile.perf.stepmodel import Hop, hops_seconds, step_seconds
from hetcompile.placement.chain_model import chain_model, stage_model
from hetcompile.placement.problem import SINK, SOURCE, PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit
from hetcompile.opt.dense import small_lp
from hetcompile.placement.tables import host, node_pair_cap

if TYPE_CHECKING:  # imported where a max flow runs (flow_algorithms): a build without placement never needs it
    import networkx as nx

# -- Helix semantics --------------------------------------------------------------------------


def unit_profile(p: PlacementProblem, u: StageUnit) -> StageProfile:
    return p.groups[u.gi].profile(u.tp)


def edge_allowed(a: StageUnit, b: StageUnit, partial: bool) -> bool:
    if a.unit == b.unit:
        return False
    if partial:
        return b.start <= a.end < b.end
    return a.end == b.start


def flow_graph(
    p: PlacementProblem, units: Sequence[StageUnit], chains: Sequence[Sequence[str]] | None = None, partial: bool = False
) -> nx.DiGraph:
    """The Helix graph of a placement; `chains` restricts edges to consecutive chain stages."""
    import networkx as nx

    L = p.num_layers
    G = nx.DiGraph()
    G.add_node(SOURCE)
    G.add_node(SINK)
    by_id = {u.unit: u for u in units}
    for u in sorted(units, key=lambda u: u.unit):
        G.add_edge((u.unit, "in"), (u.unit, "out"), capacity=unit_profile(p, u).T(u.layers))
    if chains is None:
        for u in sorted(units, key=lambda u: u.unit):
            if u.start == 0:
                G.add_edge(SOURCE, (u.unit, "in"), capacity=p.edge_capacity(SOURCE, u.node))
            if u.end == L:
                G.add_edge((u.unit, "out"), SINK, capacity=p.edge_capacity(u.node, SINK))
            for v in sorted(units, key=lambda v: v.unit):
                if edge_allowed(u, v, partial):
                    _add_link(G, p, u.unit, v.unit)
    else:
        for chain in chains:
            first, last = by_id[chain[0]], by_id[chain[-1]]
            G.add_edge(SOURCE, (first.unit, "in"), capacity=p.edge_capacity(SOURCE, first.node))
            G.add_edge((last.unit, "out"), SINK, capacity=p.edge_capacity(last.node, SINK))
            for a, b in zip(chain, chain[1:]):
                _add_link(G, p, a, b)
    return G


def _add_link(G: nx.DiGraph, p: PlacementProblem, a: str, b: str) -> None:
    cap = node_pair_cap(p, a, b)
    if math.isinf(cap):
        G.add_edge((a, "out"), (b, "in"))  # no capacity attribute: unbounded for networkx
    else:
        G.add_edge((a, "out"), (b, "in"), capacity=cap)


def helix_flow(
    p: PlacementProblem, units: Sequence[StageUnit], chains: Sequence[Sequence[str]] | None = None, partial: bool = False
) -> tuple[float, dict]:
    """(max flow value, networkx flow dict) of a placement in Helix's semantics."""
    import networkx as nx

    G = flow_graph(p, units, chains, partial)
    if not any(True for _ in G.successors(SOURCE)) or not any(True for _ in G.predecessors(SINK)):
        return 0.0, {}
    value, flow = nx.maximum_flow(G, SOURCE, SINK, flow_func=nx.algorithms.flow.boykov_kolmogorov)
    return float(value), flow


def edge_flows(flow: dict, tol: float = 1e-9) -> tuple[tuple[str, str, float], ...]:
    """Unit-level edges with positive flow (the u:in -> u:out arcs are node throughput, dropped)."""
    out = []
    for a, nbrs in flow.items():
        for b, f in nbrs.items():
            if f <= tol:
                continue
            ua = a if isinstance(a, str) else a[0]
            ub = b if isinstance(b, str) else b[0]
            if ua != ub:
                out.append((ua, ub, float(f)))
    return tuple(sorted(out))


def decompose_paths(flow: dict, tol: float = 1e-7) -> list[tuple[tuple[str, ...], float]]:
    """Split a source-sink flow into paths of units (deterministic: widest edge first)."""
    res = {a: {b: f for b, f in nb.items() if f > tol} for a, nb in flow.items()}
    paths = []
    for _ in range(10_000):
        if not res.get(SOURCE):
            break
        node, path, width, seen = SOURCE, [SOURCE], math.inf, {SOURCE}
        while node != SINK:
            nxt = sorted(res.get(node, {}).items(), key=lambda kv: (-kv[1], str(kv[0])))
            if not nxt:
                break
            node = nxt[0][0]
            width = min(width, nxt[0][1])
            if node in seen:
                break
            seen.add(node)
            path.append(node)
        if node != SINK:  # only round-off residue is left (conservation holds on the rest)
            break
        for a, b in zip(path, path[1:]):
            res[a][b] -= width
            if res[a][b] <= tol:
                del res[a][b]
        units = tuple(dict.fromkeys(x[0] for x in path[1:-1]))
        paths.append((units, width))
    return paths


# -- depth-aware capacity ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChainEval:
    capacity: float  # tokens/s (prompt + decode, Helix's unit)
    concurrency: float
    concurrency_limit: str
    micro_batch: float
    binding: str
    stage_times: tuple[float, ...]
    hops_s: float


def unit_concurrency(p: PlacementProblem, u: StageUnit) -> float:
    """Sequences the stage's KV keeps in flight at the model's mean context (capped by max_num_seqs)."""
    prof = unit_profile(p, u)
    kv = prof.kv_token_layers[u.layers - 1] / (u.layers * p.model.context_tokens)
    mc = p.model.max_concurrency
    return min(kv, float(mc)) if mc is not None else kv


def step_time(p: PlacementProblem, u: StageUnit, batch: float, last: bool = False) -> float:
    """t_i(b): one fluid engine step of `batch` sequences through the unit's layers, the step's host
    work overlapped (perf/capacity.fluid_batch on the unit's StageModel, perf/stepmodel.step_seconds)."""
    m = p.model
    n, S, A, seqs = fluid_batch(batch, m.input_tokens, m.output_tokens)
    return step_seconds(stage_model(p, u, last).time(n, S, A), m.step_host_s(seqs))


def hop_time(p: PlacementProblem, a: str, b: str, batch: float) -> float:
    """A fluid step of `batch` sequences crossing from unit a to unit b (perf/stepmodel.hops_seconds)."""
    if host(a) == host(b) and a not in (SOURCE, SINK) and b not in (SOURCE, SINK):
        return 0.0
    lk = p.link(host(a), host(b))
    m = p.model
    n, *_ = fluid_batch(batch, m.input_tokens, m.output_tokens)  # the fluid step's tokens: b (1 + I/O)
    return hops_seconds([Hop.model_construct(latency_s=lk.latency, bandwidth=lk.bandwidth)], n, m.activation_bytes)


def chain_eval(p: PlacementProblem, stages: Sequence[StageUnit]) -> ChainEval:
    """Depth-aware capacity of one chain (stages in order): perf/capacity.fluid_capacity of its
    ReplicaModel (chain_model.py), the fast mode of the formula every reported number comes from."""
    concs = [unit_concurrency(p, u) for u in stages]
    j = int(np.argmin(concs))
    mc = p.model.max_concurrency
    limit = "max-num-seqs" if mc is not None and concs[j] >= mc - 1e-9 else f"kv:{stages[j].unit}"
    m = p.model
    f = fluid_capacity(chain_model(p, stages), m.input_tokens, m.output_tokens)
    i = int(np.argmax(f.stage_times))
    return ChainEval(
        capacity=f.decode_tokens_per_s * (1.0 + m.input_tokens / m.output_tokens), concurrency=f.concurrency,
        concurrency_limit=limit, micro_batch=f.micro_batch,
        binding=f"stage:{stages[i].unit}" if f.stage_bound else "latency", stage_times=f.stage_times, hops_s=f.hops_s,
    )


def flow_algorithms() -> tuple:
    """The maximum-flow algorithms shared_depth_aware takes the best of (networkx is imported here,
    not at the module's top: a build without placement never needs its 0.2 s import)."""
    import networkx as nx

    return (nx.algorithms.flow.boykov_kolmogorov, nx.algorithms.flow.preflow_push, nx.algorithms.flow.edmonds_karp,
            nx.algorithms.flow.dinitz)


def shared_depth_aware(p: PlacementProblem, units: Sequence[StageUnit], partial: bool = False) -> float:
    """Depth-aware capacity of shared pipelines: the best over several maximum flows."""
    import networkx as nx

    G = flow_graph(p, units, None, partial)
    if G.out_degree(SOURCE) == 0 or G.in_degree(SINK) == 0:
        return 0.0
    Gi, q = integer_graph(G)
    best = 0.0
    for algo in flow_algorithms():
        _, flow = nx.maximum_flow(Gi, SOURCE, SINK, flow_func=algo)
        flow = {a: {b: f * q for b, f in nb.items()} for a, nb in flow.items()}
        best = max(best, shared_capacity(p, units, decompose_paths(flow)))
    return best


FLOW_QUANTUM = 2.0 ** -40  # relative to the smallest positive capacity (Python ints do not overflow)


def integer_graph(G: nx.DiGraph) -> tuple[nx.DiGraph, float]:
    """G with capacities floor(c / q) as Python ints, and q: max-flow algorithms are exact on it.

    networkx's dinitz compares float residuals to 0 and can keep a residual of 1e-15 that its
    BFS level graph then misses (KeyError: 'source'); on integers every residual is exact. A flow
    of the integer graph times q is feasible for G (floor) and short of its max flow by at most
    (edges in a min cut) * q, i.e. ~1e-12 of the smallest capacity. Unbounded edges stay unbounded."""
    import networkx as nx

    caps = [c for _, _, c in G.edges(data="capacity") if c is not None and math.isfinite(c) and c > 0]
    q = min(caps, default=1.0) * FLOW_QUANTUM
    H = nx.DiGraph()
    H.add_nodes_from(G.nodes)
    for a, b, c in G.edges(data="capacity"):
        if c is None or not math.isfinite(c):
            H.add_edge(a, b)
        else:
            H.add_edge(a, b, capacity=int(math.floor(c / q)))
    return H, q


def shared_capacity(p: PlacementProblem, units: Sequence[StageUnit], paths: list[tuple[tuple[str, ...], float]]) -> float:
    """Depth-aware capacity of per-request pipelines (the LP in the module docstring)."""
    paths = [(pu, f) for pu, f in paths if f > 1e-9 and pu]
    if not paths:
        return 0.0
    by_id = {u.unit: u for u in units}
    through: dict[str, float] = {}
    for pu, f in paths:
        for x in pu:
            through[x] = through.get(x, 0.0) + f
    conc = {x: unit_concurrency(p, by_id[x]) for x in through}
    Cp = [min(f / through[x] * conc[x] for x in pu) for pu, f in paths]
    bp = [c / len(pu) for c, (pu, _) in zip(Cp, paths)]
    B = {x: 0.0 for x in through}
    for b, (pu, _) in zip(bp, paths):
        for x in pu:
            B[x] += b
    t = {x: step_time(p, by_id[x], B[x]) for x in through}
    nodes = sorted(through)
    A, rhs = [], []
    for x in nodes:
        A.append([t[x] / B[x] if x in pu else 0.0 for pu, _ in paths])
        rhs.append(1.0)
    ub = []
    for c, b, (pu, _) in zip(Cp, bp, paths):
        hops = sum(hop_time(p, a, z, b) for a, z in zip(pu, pu[1:]))
        first, last = by_id[pu[0]].node, by_id[pu[-1]].node
        hops += p.link(last, SINK).latency + p.link(SOURCE, first).latency
        ub.append(c / (sum(t[x] for x in pu) + hops))
    res = small_lp(np.ones(len(paths)), np.array(A), np.array(rhs), np.array(ub))
    X = res.objective if res.objective is not None else 0.0  # None exactly when there is no x
    m = p.model
    return float(X * (1.0 + m.input_tokens / m.output_tokens))
