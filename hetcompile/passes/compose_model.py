"""The composition MILP (seed 003 §4.3, App. E), linearized, in Pyomo.

Notation (seed 003 Table 2, plus what the linearization adds):
    c in C      replica shapes (model m_c, offer o_c, TP t_c, PP depth d_c); gpus_c = t_c * d_c
    w in W      workloads; W_m those of model m; lambda_w demand (req/s, or requests f_w, or share)
    h_{c,w}     requests/s one replica of c serves of w (profile pass)
    o in O      offers (region x GPU type x node size); a_o GPUs available, e_o owned, p_o $/GPU-s
    y_c  in Z+  replicas of shape c                                          (003: y_c)
    r_{c,w} >= 0  requests/s of w served by all copies of c      (003: x_{c,w} * f_w / T)
    theta >= 0  multiple of the demand mix served                            (003: 1 / T)
    g_o  >= 0   rented GPUs of offer o (GPUs used beyond the owned ones)

003's makespan constraint sum_w x_{c,w} f_w / (y_c h_{c,w}) <= T is bilinear; with r = x f / T and
theta = 1/T it becomes linear and exact:
    (capacity)      sum_w r_{c,w} / h_{c,w} <= y_c                   for all c        (003 eq. 3, 4)
    (coverage)      sum_{c: m_c = m_w} r_{c,w} = theta * lambda_w      for all w        (003 eq. 2)
                    (min-cost fixes theta = 1: meet every rate)
    (availability)  sum_{c: o_c = o} gpus_c * y_c <= a_o              for all o        (003 eq. 6)
    (rented)        sum_{c: o_c = o} gpus_c * y_c - e_o <= g_o         for all o
    (budget)        sum_o p_o * g_o <= B                                                (003 eq. 5)
Objectives: max theta (max-throughput, min-makespan: T = 1/theta); min sum_o p_o g_o (min-cost);
max theta - q * cost for Dinkelbach's method (max-throughput-per-dollar). One theta across models
is App. E's shared makespan.

Prefill/decode disaggregation (issue 35; perf/disagg.py): a shape c may run one phase only,
role_c in {prefill, decode}, h_{c,w} then being the prompts (prefill) or the requests (decode) of w
one replica of c serves, and g_c its balance group (the region the KV moves within). A request of
w served disaggregated takes one prefill and one decode in the same group, so
    (coverage)      sum over c with role_c != prefill of r_{c,w} = theta * lambda_w
    (balance)       sum_{c: role_c = prefill, g_c = g} r_{c,w} = sum_{c: role_c = decode, g_c = g} r_{c,w}
                                                                              for every w and g
and capacity and availability are unchanged: the MILP picks, per workload, aggregated replicas,
prefill and decode replicas of any types in one group at whatever ratio P:D is cheapest, or both.

Replanning (003 App. M; `build --previous`): p_c replicas of shape c run now. With
    u_c >= y_c - p_c, v_c >= p_c - y_c, u, v >= 0        replicas launched / torn down
    churn = sum_c (u_c + v_c) + (previous replicas whose shape is no longer a candidate)
the objective is charged kappa * churn: max theta - kappa churn, or min cost + kappa churn, where
kappa = churn_penalty x the previous plan's theta (or $/s). The second stage of max-throughput
keeps churn <= the first stage's churn.

Dominated shapes (`drop_dominated`): a shape b with gpus_b = k gpus_a and k h_{a,w} >= h_{b,w}
for every w, a of the same offer (role and group), is no column: k replicas of a take b's GPUs
and serve at least as much, so the optimum is the same without b.

Scaling: the model's theta variable is theta_hat = theta * sum_w lambda_w (coverage uses
lambda_w / sum lambda), so it is the total served in demand units (req/s for rates) whatever
the unit of lambda: with f_w = 10^7 requests, theta = 1/T would sit below HiGHS's tolerances.
Costs are likewise measured in units of kappa_$ = the dearest offered GPU's price (`cost_unit`):
p_o / kappa_$ is in (0, 1] and the budget row and cost objective are O(1) numbers whatever the
currency scale, so plans $0.001/h apart stay apart at HiGHS's absolute tolerances (1e-6) and a
GPU priced $0.001/h is not "free". `extract` and `model_cost_to_per_s` convert back.

Paper: Jiang et al., "Demystifying Cost-Efficiency in LLM Serving over Heterogeneous GPUs" (seed 003), §4.3 eq. 1-6 and App. E (the scheduling MILP).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pyomo.core as pyo


@dataclass(frozen=True)
class ComposeTables:
    """Pure inputs of the MILP, indexed by sorted string ids."""

    shapes: tuple[str, ...]
    workloads: tuple[str, ...]
    offers: tuple[str, ...]
    shape_offer: dict[str, str]
    shape_gpus: dict[str, int]
    h: dict[tuple[str, str], float]  # (shape, workload) -> req/s, only for matching models
    demand: dict[str, float]
    avail: dict[str, int]
    owned: dict[str, int]
    price: dict[str, float]  # $/GPU-s
    budget: float | None  # $/s
    previous: dict[str, int] | None = None  # p_c: replicas of shape c in the running plan
    churn_weight: float = 0.0  # kappa, in objective units per replica launched or torn down
    removed: int = 0  # previous replicas whose shape is no longer a candidate (forced churn)
    shape_role: dict[str, str] = field(default_factory=dict)  # role_c: "prefill" | "decode"; absent: aggregated
    shape_group: dict[str, str] = field(default_factory=dict)  # g_c of a shape with a role: where its KV may move


def add_var_replicas(m: pyo.ConcreteModel, t: ComposeTables) -> None:
    ub = {c: t.avail[t.shape_offer[c]] // t.shape_gpus[c] for c in t.shapes}
    m.y = pyo.Var(m.C, domain=pyo.NonNegativeIntegers, bounds=lambda _, c: (0, ub[c]))
    m.r = pyo.Var(m.CW, domain=pyo.NonNegativeReals)
    m.theta = pyo.Var(domain=pyo.NonNegativeReals)
    m.g = pyo.Var(m.O, domain=pyo.NonNegativeReals, bounds=lambda _, o: (0, max(0, t.avail[o] - t.owned[o])))


def add_ineq_capacity(m: pyo.ConcreteModel, t: ComposeTables) -> None:
    by_shape: dict[str, list[str]] = {}
    for c, w in m.CW:
        by_shape.setdefault(c, []).append(w)
    m.ineq_capacity = pyo.Constraint(
        m.C, rule=lambda m, c: sum(m.r[c, w] / t.h[c, w] for w in by_shape.get(c, [])) <= m.y[c]
    )


def add_eq_coverage(m: pyo.ConcreteModel, t: ComposeTables, fixed_theta: bool) -> None:
    by_w: dict[str, list[str]] = {}
    for c, w in m.CW:
        by_w.setdefault(w, []).append(c)

    total = sum(t.demand.values())

    def rule(m, w):
        cs = [c for c in by_w.get(w, []) if t.shape_role.get(c) != "prefill"]  # a prefill serves no request alone
        if not cs:  # nothing can serve w: only theta = 0 (or nothing, with theta fixed) is feasible
            return pyo.Constraint.Infeasible if fixed_theta else m.theta == 0
        served = sum(m.r[c, w] for c in cs)
        return served == (t.demand[w] if fixed_theta else m.theta * (t.demand[w] / total))

    m.eq_coverage = pyo.Constraint(m.W, rule=rule)


def add_eq_balance(m: pyo.ConcreteModel, t: ComposeTables) -> None:
    """(balance), module docstring: in each group, every request a decode replica serves of w had
    its prompt prefilled there. No constraint where w has no phase shape in the group."""
    sides: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for c, w in m.CW:
        role = t.shape_role.get(c)
        if role is not None:
            pre, dec = sides.setdefault((w, t.shape_group[c]), ([], []))
            (pre if role == "prefill" else dec).append(c)
    if not sides:
        return
    m.WG = pyo.Set(initialize=sorted(sides), dimen=2, ordered=True)
    m.eq_balance = pyo.Constraint(m.WG, rule=lambda m, w, g: sum(m.r[c, w] for c in sides[(w, g)][0])
                                  == sum(m.r[c, w] for c in sides[(w, g)][1]))


def _gpus_used(m: pyo.ConcreteModel, t: ComposeTables, o: str):
    return sum(t.shape_gpus[c] * m.y[c] for c in t.shapes if t.shape_offer[c] == o)


def add_ineq_availability(m: pyo.ConcreteModel, t: ComposeTables) -> None:
    used = {o for o in t.offers if any(t.shape_offer[c] == o for c in t.shapes)}  # no shape: nothing to bound
    m.ineq_availability = pyo.Constraint(
        m.O, rule=lambda m, o: _gpus_used(m, t, o) <= t.avail[o] if o in used else pyo.Constraint.Skip
    )
    m.ineq_rented = pyo.Constraint(
        m.O, rule=lambda m, o: _gpus_used(m, t, o) - t.owned[o] <= m.g[o] if o in used else pyo.Constraint.Skip
    )


def cost_unit(t: ComposeTables) -> float:
    """kappa_$ ($/GPU-s): the dearest offer's price, the model's unit of cost (1.0 if all are free)."""
    return max((p for p in t.price.values() if p > 0), default=1.0)


def cost_expr(m: pyo.ConcreteModel, t: ComposeTables):
    """Rented cost in units of kappa_$ (the model's cost unit)."""
    k = cost_unit(t)
    return sum((t.price[o] / k) * m.g[o] for o in t.offers if t.price[o] > 0)


def add_ineq_budget(m: pyo.ConcreteModel, t: ComposeTables) -> None:
    # with every offer free the row is 0 <= B: always true (B >= 0 is checked at the spec), and Pyomo
    # refuses a constraint without variables
    if t.budget is not None and any(p > 0 for p in t.price.values()):
        m.ineq_budget = pyo.Constraint(expr=cost_expr(m, t) <= t.budget / cost_unit(t))


def add_churn(m: pyo.ConcreteModel, t: ComposeTables):
    """u_c, v_c and the churn expression (None without a previous plan)."""
    if t.previous is None:
        return None
    p = {c: t.previous.get(c, 0) for c in t.shapes}
    m.u = pyo.Var(m.C, domain=pyo.NonNegativeReals)
    m.v = pyo.Var(m.C, domain=pyo.NonNegativeReals)
    m.ineq_launched = pyo.Constraint(m.C, rule=lambda m, c: m.u[c] >= m.y[c] - p[c])
    m.ineq_torn_down = pyo.Constraint(m.C, rule=lambda m, c: m.v[c] >= p[c] - m.y[c])
    return sum(m.u[c] + m.v[c] for c in t.shapes) + t.removed


def build_model(
    t: ComposeTables, objective: str, q: float = 0.0, theta_min: float | None = None, churn_max: float | None = None,
    ratio_min: float | None = None,
) -> pyo.ConcreteModel:
    """objective: 'theta' (max theta), 'cost' (min cost, theta fixed 1 unless theta_min given),
    'dinkelbach' (max theta - q * cost, q in theta per $/s). With `t.previous`, churn is charged
    (module docstring): `t.churn_weight` is in theta per replica for 'theta', in $/s per replica
    for 'cost'."""
    m = pyo.ConcreteModel(name="compose")
    m.C = pyo.Set(initialize=t.shapes, ordered=True)
    m.W = pyo.Set(initialize=t.workloads, ordered=True)
    m.O = pyo.Set(initialize=t.offers, ordered=True)
    m.CW = pyo.Set(initialize=sorted(t.h), dimen=2, ordered=True)
    add_var_replicas(m, t)
    add_ineq_capacity(m, t)
    add_eq_coverage(m, t, fixed_theta=(objective == "cost" and theta_min is None))
    add_eq_balance(m, t)
    add_ineq_availability(m, t)
    add_ineq_budget(m, t)
    if theta_min is not None:
        m.ineq_theta_min = pyo.Constraint(expr=m.theta >= theta_min * sum(t.demand.values()))
    if ratio_min is not None:  # theta / cost >= ratio_min (theta per $/s), linear as theta - q cost >= 0
        m.ineq_ratio_min = pyo.Constraint(expr=m.theta >= ratio_min * sum(t.demand.values()) * cost_unit(t) * cost_expr(m, t))
    churn = add_churn(m, t)
    kappa = t.churn_weight if churn is not None else 0.0
    if churn is not None and churn_max is not None:
        m.ineq_churn = pyo.Constraint(expr=churn <= churn_max + 1e-6)
    k = cost_unit(t)
    if objective == "theta":
        m.obj = pyo.Objective(expr=m.theta - (kappa * churn if kappa else 0), sense=pyo.maximize)
    elif objective == "cost":
        charge = (kappa / k) * churn if kappa and churn_max is None else 0
        m.obj = pyo.Objective(expr=cost_expr(m, t) + charge, sense=pyo.minimize)
    elif objective == "dinkelbach":
        m.obj = pyo.Objective(expr=m.theta - q * sum(t.demand.values()) * k * cost_expr(m, t), sense=pyo.maximize)
    else:
        raise ValueError(objective)
    return m


@dataclass(frozen=True)
class ComposeSolution:
    y: dict[str, int]
    r: dict[tuple[str, str], float]
    theta: float
    cost: float  # $/s, from y (owned GPUs free)
    churn: int = 0  # replicas launched + torn down against the previous plan


def merge_alike(t: ComposeTables) -> tuple[ComposeTables, dict[str, tuple[str, ...]]]:
    """The tables with workloads of identical columns h_{., w} (the same shapes at the same rates:
    copies of one kind of request) merged into one, of their summed demand; and each merged id
    (the group's first workload) -> the group. Exact: capacity and coverage see such workloads only
    through sum_w r_{c,w} and sum_w lambda_w, so a solution of the merged model split in proportion
    to lambda_w (`split_alike`) is a solution of the original with the same y, theta and cost.
    The model then grows with the kinds of workload, not their count. Unchanged when all differ."""
    cols: dict[str, list] = {w: [] for w in t.workloads}
    for (c, w), h in sorted(t.h.items()):
        cols[w].append((c, h))
    groups: dict[tuple, list[str]] = {}
    for w in t.workloads:
        groups.setdefault(tuple(cols[w]), []).append(w)
    if len(groups) == len(t.workloads):
        return t, {}
    merged = {ws[0]: tuple(ws) for ws in groups.values()}
    keep = set(merged)
    return ComposeTables(
        shapes=t.shapes, workloads=tuple(w for w in t.workloads if w in keep), offers=t.offers,
        shape_offer=t.shape_offer, shape_gpus=t.shape_gpus, h={cw: v for cw, v in t.h.items() if cw[1] in keep},
        demand={w: sum(t.demand[x] for x in ws) for w, ws in merged.items()}, avail=t.avail, owned=t.owned,
        price=t.price, budget=t.budget, previous=t.previous, churn_weight=t.churn_weight, removed=t.removed,
        shape_role=t.shape_role, shape_group=t.shape_group,
    ), {w: ws for w, ws in merged.items() if len(ws) > 1}


def drop_dominated(t: ComposeTables) -> tuple[ComposeTables, dict[str, tuple[str, int]]]:
    """The tables without the shapes that k copies of another shape of the same offer (and role and
    group) replace at no loss, and each dropped shape b -> (a, k): gpus_b = k gpus_a and
    k h_{a,w} >= h_{b,w} for every w that b serves (a serving it too). Exact for the MILP: k replicas
    of a take b's GPUs of b's offer (so availability, rented GPUs and cost are unchanged) and serve
    at least what b does in capacity, so any plan with y_b > 0 has a counterpart without b that is as
    good; the optimum is the same. Two shapes that replace each other (k = 1, equal rates) keep the
    first by id. When replanning, churn counts replicas, so only k = 1 applies there and a shape of
    the running plan is never dropped.

    Why: the shape grid (TP x PP per offer) is mostly dominated where a model fits one GPU or node
    (13B at TP8 on an 8x A100 node serves less than four TP2 replicas on it), and every dominated
    column is a branch HiGHS explores: bench/data/scale1072.yaml drops 177 of 414 shapes, and its
    max-theta MILP reaches its 0.1% gap in 18 s instead of stopping at the 120 s cap at 0.11%."""
    cols: dict[str, dict[str, float]] = {c: {} for c in t.shapes}
    for (c, w), v in t.h.items():
        cols[c][w] = v
    kin: dict[tuple, list[str]] = {}
    for c in t.shapes:
        kin.setdefault((t.shape_offer[c], t.shape_role.get(c), t.shape_group.get(c)), []).append(c)
    dom: dict[str, tuple[str, int]] = {}
    for cs in kin.values():
        for b in cs:
            if (t.previous or {}).get(b, 0) > 0:
                continue
            hb = cols[b]
            for a in cs:
                ga, gb = t.shape_gpus[a], t.shape_gpus[b]
                if a == b or gb % ga or (t.previous is not None and gb != ga):
                    continue
                k, ha = gb // ga, cols[a]
                if not all(w in ha and k * ha[w] >= v for w, v in hb.items()):
                    continue
                mutual = k == 1 and ha.keys() == hb.keys() and all(ha[w] == v for w, v in hb.items())
                if not mutual or a < b:
                    dom[b] = (a, k)
                    break
    if not dom:
        return t, {}
    for b in list(dom):  # resolve chains: b's replacement in shapes that stay (k multiplies)
        a, k = dom[b]
        while a in dom:
            a, k = dom[a][0], k * dom[a][1]
        dom[b] = (a, k)
    keep = tuple(c for c in t.shapes if c not in dom)
    return replace(t, shapes=keep, h={cw: v for cw, v in t.h.items() if cw[0] not in dom}), dom


def restore_dominated(sol: ComposeSolution, t: ComposeTables, dropped: dict[str, tuple[str, int]]) -> ComposeSolution:
    """A solution of drop_dominated's tables as one of `t`: the dropped shapes at y = 0, r = 0."""
    if not dropped:
        return sol
    y = {c: sol.y.get(c, 0) for c in t.shapes}
    r = {cw: sol.r.get(cw, 0.0) for cw in sorted(t.h)}
    return ComposeSolution(y=y, r=r, theta=sol.theta, cost=sol.cost, churn=sol.churn)


def split_alike(sol: ComposeSolution, t: ComposeTables, groups: dict[str, tuple[str, ...]]) -> ComposeSolution:
    """A solution of merge_alike's tables as one of `t`: each group's r_{c,.} split by lambda_w."""
    if not groups:
        return sol
    r = {}
    for (c, w), v in sol.r.items():
        ws = groups.get(w, (w,))
        total = sum(t.demand[x] for x in ws)
        for x in ws:
            r[(c, x)] = v * t.demand[x] / total if total > 0 else v / len(ws)
    return ComposeSolution(y=sol.y, r=dict(sorted(r.items())), theta=sol.theta, cost=sol.cost, churn=sol.churn)


def extract(m: pyo.ConcreteModel, t: ComposeTables, fixed_theta: bool) -> ComposeSolution:
    y = {c: int(round(pyo.value(m.y[c]))) for c in t.shapes}
    r = {cw: max(0.0, float(pyo.value(m.r[cw]))) for cw in sorted(t.h)}
    theta = 1.0 if fixed_theta else float(pyo.value(m.theta)) / sum(t.demand.values())
    return ComposeSolution(y=y, r=r, theta=theta, cost=solution_cost(y, t), churn=solution_churn(y, t))


def solution_churn(y: dict[str, int], t: ComposeTables) -> int:
    if t.previous is None:
        return 0
    return sum(abs(y.get(c, 0) - t.previous.get(c, 0)) for c in t.shapes) + t.removed


def solution_cost(y: dict[str, int], t: ComposeTables) -> float:
    cost = 0.0
    for o in t.offers:
        used = sum(t.shape_gpus[c] * n for c, n in y.items() if t.shape_offer[c] == o)
        cost += t.price[o] * max(0, used - t.owned[o])
    return cost


def model_cost_to_per_s(value: float, t: ComposeTables) -> float:
    """A cost in the model's unit (a 'cost' objective value or bound) in $/s."""
    return value * cost_unit(t)
