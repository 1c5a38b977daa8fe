"""The node-level MILP for shared (Helix) placement where links bind: exact, for small clusters.

The group-count model (milp.py) aggregates interchangeable nodes, so it cannot see which
node pair a flow uses; where links bind it can only bound the pair flow by a count of placed
nodes, and a placed node that carries no flow still counts -- its "optimum" is then not
realizable (up to 3x above the max flow of its own placement), and with per-node links it also
misses pairs faster than the weakest one. This model keeps one flow variable per directed node
pair and boundary, so its objective *is* the max flow of the placement it selects (seed 000
Tables 5-6 with the edge capacity on the flow, never on the placement, and no big-M).

Notation: i a node (group g(i), native TP), K_i its max layers, T_i(k) its capacity holding k
layers; intervals [a, b) with 1 <= b - a <= K_i and T_i(b - a) > 0; boundaries l = 1..L-1;
c_ii' = bandwidth / activation bytes of the pair (inf inside one machine), src_i / snk_i the
coordinator links; F_ub an upper bound on the flow (a node never carries more than F).

Variables
    z_iab in {0, 1}        node i holds [a, b)
    x_iab >= 0             tokens/s through node i holding [a, b)
    f_ii'l in [0, c_ii']   tokens/s handed from i (ending at l) to i' (starting at l)
    F                      total flow
Constraints (one add_* each)
    ineq_one_interval      sum_ab z_iab <= 1                          (a node holds one range)
    ineq_node_capacity     x_iab <= min(T_i(b - a), F_ub) z_iab       (Table 6 row 4)
    eq_flow_out            sum_a x_ial = sum_i' f_ii'l                (i ends at l: all it carries leaves)
    eq_flow_in             sum_b x_i'lb = sum_i f_ii'l                (i' starts at l: all it carries arrives)
    ineq_coordinator       sum_b x_i0b <= src_i,  sum_a x_iaL <= snk_i
    eq_source / eq_sink    F = sum_ib x_i0b = sum_ia x_iaL
Objective: max F. A node that does not end at l carries no x out at l, so f_ii'l = 0 by
eq_flow_out alone: the link capacity needs no row tying it to z. Given z, the rest is exactly
the max-flow LP of the Helix graph of that placement, so objective = realizable max flow, and
the dual bound is a valid bound on every placement. Without partial inference only.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyomo.core as pyo

from hetcompile.placement.problem import SINK, SOURCE, PlacementProblem
from hetcompile.placement.result import StageUnit
from hetcompile.placement.tables import GroupTable

MAX_PAIR_VARS = 20_000  # n (n - 1) (L - 1) above this: the group-count restriction is used instead


@dataclass(frozen=True)
class NodeTables:
    """Index sets and coefficients of the model (pure, computed once)."""

    L: int
    nodes: tuple[tuple[str, int], ...]  # (node id, table index)
    intervals: tuple[tuple[int, int, int], ...]  # (node position, a, b)
    pairs: tuple[tuple[int, int, int], ...]  # (i, i', l): i may end at l and i' may start at l
    T: dict[tuple[int, int, int], float]
    cap: dict[tuple[int, int], float]
    src: tuple[float, ...]
    snk: tuple[float, ...]
    F_ub: float


def pair_vars(p: PlacementProblem) -> int:
    n = sum(g.count for g in p.groups)
    return n * (n - 1) * max(p.num_layers - 1, 0)


def node_tables(p: PlacementProblem, tables: tuple[GroupTable, ...], F_ub: float) -> NodeTables:
    L = p.num_layers
    nodes = tuple((nid, j) for j, t in enumerate(tables) for nid in p.groups[t.gi].ids)
    intervals, T = [], {}
    for i, (_, j) in enumerate(nodes):
        for k in range(1, tables[j].kmax + 1):
            if tables[j].T[k - 1] <= 0:
                continue
            for a in range(0, L - k + 1):
                intervals.append((i, a, a + k))
                T[i, a, a + k] = min(tables[j].T[k - 1], F_ub)
    ends = {(i, b) for i, _, b in intervals}
    starts = {(i, a) for i, a, _ in intervals}
    cap = {}
    pairs = []
    for i, (u, _) in enumerate(nodes):
        for i2, (v, _) in enumerate(nodes):
            if i == i2:
                continue
            cap[i, i2] = p.edge_capacity(u, v)
            pairs += [(i, i2, l) for l in range(1, L) if (i, l) in ends and (i2, l) in starts]
    src = tuple(p.edge_capacity(SOURCE, u) for u, _ in nodes)
    snk = tuple(p.edge_capacity(u, SINK) for u, _ in nodes)
    return NodeTables(L, nodes, tuple(intervals), tuple(pairs), T, cap, src, snk, F_ub)


def build_model(nt: NodeTables) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="place_shared_nodes")
    m.I = pyo.Set(initialize=list(range(len(nt.nodes))), ordered=True)
    m.Q = pyo.Set(initialize=list(nt.intervals), dimen=3, ordered=True)
    m.P = pyo.Set(initialize=list(nt.pairs), dimen=3, ordered=True)
    m.z = pyo.Var(m.Q, domain=pyo.Binary)
    m.x = pyo.Var(m.Q, domain=pyo.NonNegativeReals)
    m.f = pyo.Var(m.P, domain=pyo.NonNegativeReals,
                  bounds=lambda _, i, i2, l: (0, min(nt.cap[i, i2], nt.F_ub)))
    m.F = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0, nt.F_ub))
    add_ineq_one_interval(m, nt)
    add_ineq_node_capacity(m, nt)
    add_eq_flow_out_in(m, nt)
    add_ineq_coordinator(m, nt)
    add_eq_source_sink(m, nt)
    m.obj = pyo.Objective(expr=m.F, sense=pyo.maximize)
    return m


def _by_node(nt: NodeTables) -> dict[int, list[tuple[int, int, int]]]:
    out: dict[int, list[tuple[int, int, int]]] = {i: [] for i in range(len(nt.nodes))}
    for q in nt.intervals:
        out[q[0]].append(q)
    return out


def add_ineq_one_interval(m: pyo.ConcreteModel, nt: NodeTables) -> None:
    by = _by_node(nt)
    m.ineq_one_interval = pyo.Constraint(m.I, rule=lambda m, i: sum(m.z[q] for q in by[i]) <= 1 if by[i] else pyo.Constraint.Skip)


def add_ineq_node_capacity(m: pyo.ConcreteModel, nt: NodeTables) -> None:
    m.ineq_node_capacity = pyo.Constraint(m.Q, rule=lambda m, i, a, b: m.x[i, a, b] <= nt.T[i, a, b] * m.z[i, a, b])


def add_eq_flow_out_in(m: pyo.ConcreteModel, nt: NodeTables) -> None:
    by = _by_node(nt)
    out_of: dict[tuple[int, int], list] = {}
    into: dict[tuple[int, int], list] = {}
    for (i, i2, l) in nt.pairs:
        out_of.setdefault((i, l), []).append((i, i2, l))
        into.setdefault((i2, l), []).append((i, i2, l))
    keys = [(i, l) for i in range(len(nt.nodes)) for l in range(1, nt.L)]

    def out_rule(m, i, l):
        ending = [q for q in by[i] if q[2] == l]
        if not ending:
            return pyo.Constraint.Skip
        return sum(m.x[q] for q in ending) == sum(m.f[e] for e in out_of.get((i, l), []))

    def in_rule(m, i, l):
        starting = [q for q in by[i] if q[1] == l]
        if not starting:
            return pyo.Constraint.Skip
        return sum(m.x[q] for q in starting) == sum(m.f[e] for e in into.get((i, l), []))

    m.eq_flow_out = pyo.Constraint(keys, rule=out_rule)
    m.eq_flow_in = pyo.Constraint(keys, rule=in_rule)


def add_ineq_coordinator(m: pyo.ConcreteModel, nt: NodeTables) -> None:
    by = _by_node(nt)
    m.ineq_coordinator = pyo.ConstraintList()
    for i in range(len(nt.nodes)):
        first = [q for q in by[i] if q[1] == 0]
        last = [q for q in by[i] if q[2] == nt.L]
        if first and nt.src[i] < nt.F_ub:
            m.ineq_coordinator.add(sum(m.x[q] for q in first) <= nt.src[i])
        if last and nt.snk[i] < nt.F_ub:
            m.ineq_coordinator.add(sum(m.x[q] for q in last) <= nt.snk[i])


def add_eq_source_sink(m: pyo.ConcreteModel, nt: NodeTables) -> None:
    m.eq_source = pyo.Constraint(expr=m.F == sum(m.x[q] for q in nt.intervals if q[1] == 0))
    m.eq_sink = pyo.Constraint(expr=m.F == sum(m.x[q] for q in nt.intervals if q[2] == nt.L))


# -- warm start and extraction ---------------------------------------------------------------


def warm_start(m: pyo.ConcreteModel, nt: NodeTables, units: list[StageUnit], flow: dict, value: float) -> bool:
    """Load a placement and its max flow (networkx) as a full MIP start; False if it does not fit."""
    pos = {u: i for i, (u, _) in enumerate(nt.nodes)}
    for q in nt.intervals:
        m.z[q].set_value(0)
        m.x[q].set_value(0.0)
    for e in nt.pairs:
        m.f[e].set_value(0.0)
    held = {}
    for u in units:
        q = (pos[u.node], u.start, u.end)
        if q not in nt.T:
            return False
        held[u.unit] = q
        m.z[q].set_value(1)
        m.x[q].set_value(min(flow.get((u.unit, "in"), {}).get((u.unit, "out"), 0.0), nt.T[q]))
    for a, nbrs in flow.items():
        for b, fv in nbrs.items():
            if fv <= 0 or isinstance(a, str) or isinstance(b, str) or a[1] != "out" or b[1] != "in":
                continue
            qa, qb = held[a[0]], held[b[0]]
            e = (qa[0], qb[0], qa[2])
            if e in m.f:
                m.f[e].set_value(min(fv, m.f[e].ub))
    m.F.set_value(min(value, nt.F_ub))
    return True


def extract_units(m: pyo.ConcreteModel, nt: NodeTables, tables: tuple[GroupTable, ...]) -> list[StageUnit]:
    units = []
    for (i, a, b) in nt.intervals:
        v = m.z[i, a, b].value
        if v is not None and v > 0.5:
            node, j = nt.nodes[i]
            t = tables[j]
            units.append(StageUnit(node, node, t.gi, t.tp, tuple(range(t.tp)), a, b))
    return units
