"""The chain-level MILP: deployable replicas (chains with one TP) maximizing Helix flow.

A chain's Helix flow is the smallest T over its stages and capacities over its links, so a
level theta in Theta_t = {T_j(k) of the TP-t kinds} u {best pair capacity between two regions}
at least as large as the flow always describes it. A stage of kind j can
join a chain at level theta holding k layers iff T_j(k) >= theta; K_j(theta) is the largest
such k. Split nodes: a node of group g with G GPUs used at TP t gives G / t stages of kind (g, t).

Notation: c = 1..C chain slots (C = the most chains the layer capacity allows), t a TP size,
theta in Theta_t, j a stage kind (table) of TP t, u_j = G_g / t stages per node, comp a region
component: regions joined by node pairs whose link carries theta (a chain at level theta
cannot cross a slower link; every component is one region where no inter-region link binds).

Variables
    z_{c,t,theta,comp} in {0,1}   chain c runs at level theta, TP t, inside component comp
    v_{c,t,theta,comp,j} in Z+    stages of kind j in chain c
    s_{g,t} in Z+                 nodes of group g used at TP t
Constraints
    ineq_one_level      sum_{t,theta,comp} z_c <= 1
    ineq_chain_cover    sum_j K_j(theta) v_{c..j} >= L z_c     (the chain reaches L layers)
    ineq_stage_link     v_{c..j} <= (u_j N_g) z_c
    ineq_stage_supply   sum_{c,theta,comp} v_{..j} <= u_j s_{g,t}
    ineq_node_mode      sum_t s_{g,t} <= N_g                    (a node runs at one TP)
    ineq_symmetry       level(c) >= level(c + 1)
Objective: max sum_c theta z_c. The cover row is exact per chain (no bin-covering relaxation);
it ignores only holes in {k : T_j(k) >= theta} for non-monotone T, which realization handles by
DP (and the exact flow is evaluated afterwards).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pyomo.core as pyo

from hetcompile.placement.tables import GroupTable, Network, layers_at_level

Key = tuple[int, int, float, int]  # (chain slot, tp, level, component)


@dataclass(frozen=True)
class ChainTables:
    L: int
    tables: tuple[GroupTable, ...]
    slots: int
    keys: tuple[Key, ...]  # (c, t, theta, comp) with at least one usable kind
    comps: dict[tuple[float, int], tuple[str, ...]]  # (theta, comp) -> regions
    K: dict[tuple[int, float], int]  # (table, theta) -> K_j(theta)
    groups: dict[int, int]  # group index -> N_g


def _components(net: Network, theta: float) -> list[tuple[str, ...]]:
    import networkx as nx  # here: a build without placement never needs its import

    G = nx.Graph()
    G.add_nodes_from(net.regions)
    for (r, s), cap in net.cap_max.items():
        if r != s and cap >= theta:
            G.add_edge(r, s)
    return sorted(tuple(sorted(c)) for c in nx.connected_components(G))


def chain_tables(tables: tuple[GroupTable, ...], net: Network, L: int, max_slots: int | None = None) -> ChainTables:
    groups = {t.gi: t.count for t in tables}
    per_group_best: defaultdict[int, float] = defaultdict(float)
    for t in tables:
        per_group_best[t.gi] = max(per_group_best[t.gi], t.count * t.units_per_node * t.kmax)
    slots = int(sum(per_group_best.values()) // L)
    if max_slots is not None:
        slots = min(slots, max_slots)
    keys, comps, K = [], {}, {}
    for tp in sorted({t.tp for t in tables}):
        # a chain's flow is min(its stages' T, its links): with the best inter-region pairs as
        # levels too, every chain has a representable level >= its flow (a valid relaxation)
        levels = sorted({v for t in tables if t.tp == tp for v in t.T if v > 0}
                        | {c for (r, s), c in net.cap_max.items() if r != s})
        for theta in levels:
            for ci, comp in enumerate(_components(net, theta)):
                kinds = [j for j, t in enumerate(tables) if t.tp == tp and t.region in comp and t.count]
                cover = 0
                for j in kinds:
                    ks = layers_at_level(tables[j].T, theta)
                    if ks:
                        K[j, theta] = max(ks)
                        cover += K[j, theta] * tables[j].count * tables[j].units_per_node
                if cover < L:
                    continue
                comps[theta, ci] = comp
                for c in range(slots):
                    keys.append((c, tp, theta, ci))
    return ChainTables(L, tables, slots, tuple(keys), comps, K, groups)


def _kinds(ct: ChainTables, key: Key) -> list[int]:
    _, tp, theta, ci = key
    comp = ct.comps[theta, ci]
    return [j for j, t in enumerate(ct.tables) if t.tp == tp and t.region in comp and (j, theta) in ct.K]


def num_variables(ct: ChainTables) -> int:
    """|z| + |v| + |s|: the variables build_model would create, counted without building it (on
    pools of hundreds of nodes the model has hundreds of thousands of rows, and building it took
    minutes only for the count to skip it)."""
    kinds: dict[tuple[int, float, int], int] = {}
    n = 0
    for k in ct.keys:
        if k[1:] not in kinds:
            kinds[k[1:]] = len(_kinds(ct, k))
        n += 1 + kinds[k[1:]]
    return n + len({(t.gi, t.tp) for t in ct.tables})


def build_model(ct: ChainTables) -> pyo.ConcreteModel:
    m = pyo.ConcreteModel(name="place_chains")
    m.Z = pyo.Set(initialize=list(ct.keys), dimen=4, ordered=True)
    m.V = pyo.Set(initialize=[k + (j,) for k in ct.keys for j in _kinds(ct, k)], dimen=5, ordered=True)
    modes = sorted({(t.gi, t.tp) for t in ct.tables})
    m.M = pyo.Set(initialize=modes, dimen=2, ordered=True)
    m.z = pyo.Var(m.Z, domain=pyo.Binary)
    m.v = pyo.Var(m.V, domain=pyo.NonNegativeIntegers)
    m.s = pyo.Var(m.M, domain=pyo.NonNegativeIntegers, bounds=lambda _, g, t: (0, ct.groups[g]))
    add_ineq_one_level(m, ct)
    add_ineq_chain_cover(m, ct)
    add_ineq_stage_supply(m, ct)
    add_ineq_node_mode(m, ct)
    add_ineq_symmetry(m, ct)
    m.obj = pyo.Objective(expr=sum(k[2] * m.z[k] for k in m.Z), sense=pyo.maximize)
    return m


def add_ineq_one_level(m: pyo.ConcreteModel, ct: ChainTables) -> None:
    by_c = defaultdict(list)
    for k in ct.keys:
        by_c[k[0]].append(k)
    m.ineq_one_level = pyo.Constraint(sorted(by_c), rule=lambda m, c: sum(m.z[k] for k in by_c[c]) <= 1)


def add_ineq_chain_cover(m: pyo.ConcreteModel, ct: ChainTables) -> None:
    def cover(m, *k):
        return sum(ct.K[j, k[2]] * m.v[k + (j,)] for j in _kinds(ct, k)) >= ct.L * m.z[k]

    def link(m, *kj):
        j = kj[4]
        t = ct.tables[j]
        return m.v[kj] <= t.units_per_node * t.count * m.z[kj[:4]]

    m.ineq_chain_cover = pyo.Constraint(m.Z, rule=cover)
    m.ineq_stage_link = pyo.Constraint(m.V, rule=link)


def add_ineq_stage_supply(m: pyo.ConcreteModel, ct: ChainTables) -> None:
    by_j = defaultdict(list)
    for kj in m.V:
        by_j[kj[4]].append(kj)

    def rule(m, j):
        t = ct.tables[j]
        if not by_j[j]:
            return pyo.Constraint.Skip
        return sum(m.v[kj] for kj in by_j[j]) <= t.units_per_node * m.s[t.gi, t.tp]

    m.ineq_stage_supply = pyo.Constraint(range(len(ct.tables)), rule=rule)


def add_ineq_node_mode(m: pyo.ConcreteModel, ct: ChainTables) -> None:
    m.ineq_node_mode = pyo.Constraint(sorted(ct.groups), rule=lambda m, g: sum(m.s[g, t] for (gg, t) in m.M if gg == g) <= ct.groups[g])


def add_ineq_symmetry(m: pyo.ConcreteModel, ct: ChainTables) -> None:
    by_c = defaultdict(list)
    for k in ct.keys:
        by_c[k[0]].append(k)
    cs = sorted(by_c)
    m.ineq_symmetry = pyo.Constraint(
        cs[:-1], rule=lambda m, c: sum(k[2] * m.z[k] for k in by_c[c]) >= sum(k[2] * m.z[k] for k in by_c[c + 1]))


def extract_chains(m: pyo.ConcreteModel, ct: ChainTables) -> list[tuple[int, float, dict[int, int]]]:
    """[(tp, level, {table: stages})] for every chain slot in use."""
    out = []
    for k in ct.keys:
        if (m.z[k].value or 0) > 0.5:
            kinds = {j: int(round(m.v[k + (j,)].value or 0)) for j in _kinds(ct, k)}
            out.append((k[1], k[2], {j: n for j, n in kinds.items() if n > 0}))
    return out


def warm_start(m: pyo.ConcreteModel, ct: ChainTables, chains: list[tuple[int, float, dict[int, int]]]) -> bool:
    """Load chains [(tp, level, {table: stages})] as a MIP start; False if one does not fit the keys."""
    for k in m.Z:
        m.z[k].set_value(0)
    for kj in m.V:
        m.v[kj].set_value(0)
    used: defaultdict[int, int] = defaultdict(int)
    for c, (tp, theta, kinds) in enumerate(sorted(chains, key=lambda x: -x[1])):
        key = next((k for k in ct.keys if k[0] == c and k[1] == tp and abs(k[2] - theta) <= 1e-9
                    and all(j in _kinds(ct, k) for j in kinds)), None)
        if key is None:
            return False
        m.z[key].set_value(1)
        for j, n in kinds.items():
            m.v[key + (j,)].set_value(n)
            used[j] += n
    for (g, t) in m.M:
        need = max((-(-used[j] // ct.tables[j].units_per_node) for j, tt in enumerate(ct.tables)
                    if tt.gi == g and tt.tp == t and used[j]), default=0)
        m.s[g, t].set_value(need)
    return True
