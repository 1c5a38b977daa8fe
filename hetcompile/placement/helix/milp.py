"""The group-count MILP for shared (Helix) placement: no big-M, flow conserved at layer boundaries.

Helix's MILP (seed 000 Tables 5-6) gives every node an integer start s_i, binaries per (node, k)
and per directed edge, and big-M validity rows; its LP bound is 30-600x the optimum. Nodes of one
group are interchangeable, so this model counts them per layer interval instead.

Notation (see tables.py): j a group table (group at its native TP), N_j, T_j(k), K_j, region r(j);
intervals q = (j, a, b) with 1 <= b - a <= K_j; boundaries l = 1..L-1; F_ub the pattern bound.

Variables
    n_q in {0..N_j}        nodes of j holding [a, b)
    x_q >= 0               flow through those nodes (tokens/s)
    e_{q,l} >= 0           (partial inference only) flow entering q at boundary l, a <= l < b
    y_{r,s,l} >= 0         flow handed from region r to region s at boundary l (multi-region)
    F                      total flow
Constraints (one add_* each)
    eq_node_count        sum_q n_q <= N_j                                    (Table 6 row 1, per group)
    ineq_node_capacity   x_q <= min(T_j(b-a), F_ub) n_q     (row 4; a node carries <= F: cap at F_ub)
    eq_source / eq_sink  F = flow entering layer 0 = flow leaving layer L
    ineq_coordinator     sum_b x_{j,0,b} <= src_j sum_b n_{j,0,b}   (and sink): links to the coordinator
    eq_flow_conservation at every l: flow of intervals ending at l = flow entering at l (row 3),
                         split by region r -> s through y when there are several regions
    ineq_pair_capacity   where links bind: y_{r,s,l} <= cap_rs * min(E + S - 1 + u, N_s E, N_r S), with
                         E = nodes of r ending at l and S = nodes of s starting (accepting) at l,
                         u_{r,s,l} in {0,1} allowed only when E = S = 0 (ineq_pair_idle_*).
                         The true limit is cap_rs * E * S (E * S node pairs); E + S - 1 <= E * S for
                         E, S >= 1, so this linear row is a *restriction*: every solution is
                         realizable when every pair carries cap_rs (rows 5-6 of Table 6 without
                         big-M). An exact product (binary digits of E) left HiGHS without an
                         incumbent for minutes on the geo cluster; the restriction finds one at
                         the root. Where links bind the model's dual bound is therefore not used.
Objective: max F. Links that never bind (cap >= the largest T(1) they join) need no row: a flow
that conserves at a boundary routes over the complete bipartite graph. cap_rs is chosen by the
caller (place uses the weakest pair: realizable as is; extraction then picks the best nodes and
evaluate.py gives the exact flow).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import pyomo.core as pyo

from hetcompile.placement.result import StageUnit
from hetcompile.placement.tables import GroupTable, Network

Interval = tuple[int, int, int]


@dataclass(frozen=True)
class SharedTables:
    """Index sets and coefficients of the model (pure, computed once)."""

    L: int
    tables: tuple[GroupTable, ...]
    intervals: tuple[Interval, ...]
    regions: tuple[str, ...]
    binding: tuple[tuple[str, str], ...]
    cap: dict[tuple[str, str], float]
    src: dict[int, float]
    snk: dict[int, float]
    F_ub: float
    partial: bool

    def region_of(self, j: int) -> str:
        return self.tables[j].region

    def n_region(self, r: str) -> int:
        return sum(t.count for t in self.tables if t.region == r)

    @property
    def use_y(self) -> bool:
        """Region-to-region flow variables: several regions, or a binding link inside one."""
        return len(self.regions) > 1 or bool(self.binding)


def shared_tables(tables: tuple[GroupTable, ...], net: Network, L: int, F_ub: float, partial: bool,
                  pair_cap: dict[tuple[str, str], float] | None = None) -> SharedTables:
    """Index sets; `pair_cap` per region pair defaults to the weakest node pair (realizable)."""
    intervals = tuple(
        (j, a, a + k) for j, t in enumerate(tables) if t.count for k in range(1, t.kmax + 1) if t.T[k - 1] > 0
        for a in range(0, L - k + 1)
    )
    src = {j: net.src_cap.get(t.gi, math.inf) for j, t in enumerate(tables)}
    snk = {j: net.snk_cap.get(t.gi, math.inf) for j, t in enumerate(tables)}
    return SharedTables(L, tables, intervals, net.regions, tuple(sorted(net.binding)), dict(pair_cap or net.cap_min), src, snk,
                        F_ub, partial)


def build_model(st: SharedTables) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="place_shared")
    m.Q = pyo.Set(initialize=list(st.intervals), dimen=3, ordered=True)
    m.J = pyo.Set(initialize=list(range(len(st.tables))), ordered=True)
    m.Lb = pyo.Set(initialize=list(range(1, st.L)), ordered=True)
    m.n = pyo.Var(m.Q, domain=pyo.NonNegativeIntegers, bounds=lambda _, j, a, b: (0, st.tables[j].count))
    m.x = pyo.Var(m.Q, domain=pyo.NonNegativeReals)
    m.F = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0, st.F_ub))
    if st.partial:
        m.E = pyo.Set(initialize=[(j, a, b, l) for (j, a, b) in st.intervals for l in range(a, b)], dimen=4, ordered=True)
        m.e = pyo.Var(m.E, domain=pyo.NonNegativeReals)
    add_eq_node_count(m, st)
    add_ineq_node_capacity(m, st)
    add_eq_source_sink(m, st)
    add_ineq_coordinator(m, st)
    add_eq_flow_conservation(m, st)
    if st.binding:
        add_ineq_pair_capacity(m, st)
    m.obj = pyo.Objective(expr=m.F, sense=pyo.maximize)
    return m


def _inflow(m: pyo.ConcreteModel, st: SharedTables, j: int, a: int, b: int, l: int):
    """Flow entering interval (j, a, b) at boundary l (only l == a without partial inference)."""
    return m.e[j, a, b, l] if st.partial else m.x[j, a, b]


def _accepting(st: SharedTables, l: int) -> list[Interval]:
    if st.partial:
        return [q for q in st.intervals if q[1] <= l < q[2]]
    return [q for q in st.intervals if q[1] == l]


def add_eq_node_count(m: pyo.ConcreteModel, st: SharedTables) -> None:
    by_j = defaultdict(list)
    for q in st.intervals:
        by_j[q[0]].append(q)
    m.eq_node_count = pyo.Constraint(m.J, rule=lambda m, j: sum(m.n[q] for q in by_j[j]) <= st.tables[j].count
                                     if by_j[j] else pyo.Constraint.Skip)


def add_ineq_node_capacity(m: pyo.ConcreteModel, st: SharedTables) -> None:
    def rule(m, j, a, b):
        return m.x[j, a, b] <= min(st.tables[j].T[b - a - 1], st.F_ub) * m.n[j, a, b]

    m.ineq_node_capacity = pyo.Constraint(m.Q, rule=rule)
    if st.partial:
        m.eq_partial_split = pyo.Constraint(
            m.Q, rule=lambda m, j, a, b: m.x[j, a, b] == sum(m.e[j, a, b, l] for l in range(a, b)))


def add_eq_source_sink(m: pyo.ConcreteModel, st: SharedTables) -> None:
    first = [q for q in st.intervals if q[1] == 0]
    last = [q for q in st.intervals if q[2] == st.L]
    m.eq_source = pyo.Constraint(expr=m.F == sum(_inflow(m, st, *q, 0) for q in first))
    m.eq_sink = pyo.Constraint(expr=m.F == sum(m.x[q] for q in last))


def add_ineq_coordinator(m: pyo.ConcreteModel, st: SharedTables) -> None:
    rows = []
    for j in range(len(st.tables)):
        first = [q for q in st.intervals if q[0] == j and q[1] == 0]
        last = [q for q in st.intervals if q[0] == j and q[2] == st.L]
        if first and math.isfinite(st.src[j]) and st.src[j] < st.F_ub:
            rows.append(sum(m.x[q] for q in first) <= st.src[j] * sum(m.n[q] for q in first))
        if last and math.isfinite(st.snk[j]) and st.snk[j] < st.F_ub:
            rows.append(sum(m.x[q] for q in last) <= st.snk[j] * sum(m.n[q] for q in last))
    m.ineq_coordinator = pyo.ConstraintList()
    for r in rows:
        m.ineq_coordinator.add(r)


def add_eq_flow_conservation(m: pyo.ConcreteModel, st: SharedTables) -> None:
    ends = defaultdict(list)
    for q in st.intervals:
        ends[q[2]].append(q)
    acc = {l: _accepting(st, l) for l in range(1, st.L)}
    if not st.use_y:
        m.eq_flow_conservation = pyo.Constraint(
            m.Lb, rule=lambda m, l: sum(m.x[q] for q in ends[l]) == sum(_inflow(m, st, *q, l) for q in acc[l]))
        return
    R = list(st.regions)
    m.R = pyo.Set(initialize=R, ordered=True)
    m.y = pyo.Var(m.R, m.R, m.Lb, domain=pyo.NonNegativeReals)

    def out_rule(m, r, l):
        return sum(m.x[q] for q in ends[l] if st.region_of(q[0]) == r) == sum(m.y[r, s, l] for s in R)

    def in_rule(m, s, l):
        return sum(_inflow(m, st, *q, l) for q in acc[l] if st.region_of(q[0]) == s) == sum(m.y[r, s, l] for r in R)

    m.eq_flow_conservation = pyo.Constraint(m.R, m.Lb, rule=out_rule)
    m.eq_flow_conservation_in = pyo.Constraint(m.R, m.Lb, rule=in_rule)


def add_ineq_pair_capacity(m: pyo.ConcreteModel, st: SharedTables) -> None:
    """y_rsl <= cap_rs * min(E + S - 1, N_s E, N_r S): a linear under-estimate of cap * E * S."""
    ends = defaultdict(list)
    for q in st.intervals:
        ends[q[2]].append(q)
    acc = {l: _accepting(st, l) for l in range(1, st.L)}

    def E(r, l):
        return sum(m.n[q] for q in ends[l] if st.region_of(q[0]) == r)

    def S(s, l):
        return sum(m.n[q] for q in acc[l] if st.region_of(q[0]) == s)

    idx = [(r, s, l) for (r, s) in st.binding for l in range(1, st.L)]
    # u = 1 only when nobody ends or starts there (E = S = 0), where E + S - 1 would be negative
    m.PB = pyo.Set(initialize=idx, dimen=3, ordered=True)
    m.u = pyo.Var(m.PB, domain=pyo.Binary)
    m.ineq_pair_idle_end = pyo.Constraint(m.PB, rule=lambda m, r, s, l: st.n_region(r) * m.u[r, s, l] <= st.n_region(r) - E(r, l))
    m.ineq_pair_idle_start = pyo.Constraint(m.PB, rule=lambda m, r, s, l: st.n_region(s) * m.u[r, s, l] <= st.n_region(s) - S(s, l))
    m.ineq_pair_capacity = pyo.Constraint(
        m.PB, rule=lambda m, r, s, l: m.y[r, s, l] <= st.cap[r, s] * (E(r, l) + S(s, l) - 1 + m.u[r, s, l]))
    m.ineq_pair_capacity_end = pyo.Constraint(
        idx, rule=lambda m, r, s, l: m.y[r, s, l] <= st.cap[r, s] * st.n_region(s) * E(r, l))
    m.ineq_pair_capacity_start = pyo.Constraint(
        idx, rule=lambda m, r, s, l: m.y[r, s, l] <= st.cap[r, s] * st.n_region(r) * S(s, l))


# -- warm start and extraction ---------------------------------------------------------------


def warm_start(m: pyo.ConcreteModel, st: SharedTables, units: list[StageUnit], flow: dict, value: float) -> None:
    """Load a concrete placement and its max flow into the variables (a full MIP start)."""
    j_of = {(t.gi, t.tp): j for j, t in enumerate(st.tables)}
    for q in st.intervals:
        m.n[q].set_value(0)
        m.x[q].set_value(0.0)
    if st.partial:
        for idx in m.E:
            m.e[idx].set_value(0.0)
    unit_j = {}
    for u in units:
        j = j_of[(u.gi, u.tp)]
        unit_j[u.unit] = (j, u)
        q = (j, u.start, u.end)
        m.n[q].set_value(m.n[q].value + 1)
        m.x[q].set_value(m.x[q].value + flow.get((u.unit, "in"), {}).get((u.unit, "out"), 0.0))
    m.F.set_value(min(value, st.F_ub))
    regions = list(st.regions)
    if st.use_y:
        for r in regions:
            for s in regions:
                for l in range(1, st.L):
                    m.y[r, s, l].set_value(0.0)
    for a, nbrs in flow.items():
        for b, f in nbrs.items():
            if f <= 0 or isinstance(a, str) or isinstance(b, str) or a[1] != "out" or b[1] != "in":
                continue
            ja, ua = unit_j[a[0]]
            jb, ub = unit_j[b[0]]
            l = ua.end
            if st.partial:
                m.e[jb, ub.start, ub.end, l].set_value(m.e[jb, ub.start, ub.end, l].value + f)
            if st.use_y:
                y = m.y[st.region_of(ja), st.region_of(jb), l]
                y.set_value(y.value + f)
    warm_start_pairs(m, st, units)
    if st.partial:
        for a, nbrs in flow.items():
            if a == "source":
                for b, f in nbrs.items():
                    jb, ub = unit_j[b[0]]
                    m.e[jb, ub.start, ub.end, 0].set_value(m.e[jb, ub.start, ub.end, 0].value + f)


def warm_start_pairs(m: pyo.ConcreteModel, st: SharedTables, units: list[StageUnit]) -> None:
    j_of = {(t.gi, t.tp): j for j, t in enumerate(st.tables)}
    for (r, s, l) in getattr(m, "PB", []):
        E = sum(1 for u in units if u.end == l and st.region_of(j_of[(u.gi, u.tp)]) == r)
        S = sum(1 for u in units if (u.start <= l < u.end if st.partial else u.start == l)
                and st.region_of(j_of[(u.gi, u.tp)]) == s)
        m.u[r, s, l].set_value(1 if E == 0 and S == 0 else 0)


def extract_intervals(m: pyo.ConcreteModel, st: SharedTables) -> dict[int, list[tuple[int, int]]]:
    """Group table j -> the [a, b) intervals of its used nodes (with multiplicity)."""
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for (j, a, b) in st.intervals:
        v = m.n[j, a, b].value
        cnt = int(round(v)) if v is not None else 0
        out[j] += [(a, b)] * cnt
    return dict(out)
