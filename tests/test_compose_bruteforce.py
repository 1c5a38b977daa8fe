"""The composition MILP is tested on instances whose optimum a brute force in the test finds.

Small `ComposeTables` (2-3 offers, 2-4 replica shapes of 1, 2 or 4 GPUs, 1-3 workloads, one or
two models, budgets, owned GPUs), hand-made ones and ones drawn from a fixed-seed
`random.Random`. The brute force enumerates every integer replica vector y within availability
and budget; for each y the best theta is a small LP in r (the integer part is what is brute
forced), solved exactly by HiGHS through `highspy` (warm-started, one model per instance; for a
single workload it is cross-checked against the closed form theta = sum_c y_c h_c / lambda).
From the (y, theta(y), cost(y)) table it reads off the max theta, the min cost at theta = 1,
the min cost at theta >= theta*, the max theta / cost ratio and max theta - q cost, and the
tests compare these with `build_model` + `solve` and with the `Compose` pass (all four
objectives) on a `Problem` built around the same tables, to a relative 1e-6 (the pass's
max-throughput-per-dollar only where no GPU is owned: free GPUs make the ratio unbounded, and then
the pass's plan rents nothing, see the last section).

Seed 003 App. C (three GPU types, budget 8 $/h, 80 + 20 requests, a TP config on 2x t2) is
checked exactly: the paper's hand-made Case 3 plan finishes in 28.67 s; the MILP must find a
makespan <= 28.67 s that equals the brute force's (it is 28.43 s: same composition, a better
split of w1).

Units as in `ComposeTables`: prices in $/GPU-second, budget in $/s (the $/h numbers below are
divided by 3600).

The last section holds minimal tests of bugs these brute forces found (tiny prices, Dinkelbach
with owned GPUs, the per-dollar note's unit), now fixed.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import highspy
import numpy as np
import pytest

from hetcompile.driver import compile_spec
from hetcompile.errors import InfeasibleError
from hetcompile.ir.problem import (
    Engine,
    GpuType,
    Model,
    ModelArch,
    Offer,
    Problem,
    Shape,
    ShapeEstimate,
    SolverConfig,
    Workload,
)
from hetcompile.passes.base import PassContext
from hetcompile.passes.compose import THETA_KEEP, Compose, tables
from hetcompile.passes.compose_model import ComposeTables, build_model, extract, solution_cost
from hetcompile.opt.solve import SolverOptions, solve

H = 3600.0
REL = 1e-6
# mip_gap ~0 so the MILP answers are the optima the brute force finds, not within 0.01 % of them
SOLVER = SolverOptions(time_limit_s=60.0, mip_gap=1e-9, threads=1, seed=0)


# ---- instances ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    t: ComposeTables
    model_of: dict[str, str]  # workload -> model name

    def shape_model(self, c: str) -> str:
        return next(self.model_of[w] for (s, w) in self.t.h if s == c)

    @property
    def has_owned(self) -> bool:
        return any(self.t.owned[o] > 0 for o in self.t.offers)

    def __repr__(self) -> str:  # pytest ids
        return self.name


def make_tables(
    offers: dict[str, tuple[int, int, float]],
    shapes: dict[str, tuple[str, int, dict[str, float]]],
    demand: dict[str, float],
    budget_per_h: float | None,
) -> ComposeTables:
    """offers: id -> (available GPUs, owned GPUs, $/GPU-h); shapes: id -> (offer, GPUs, {w: h})."""
    return ComposeTables(
        shapes=tuple(sorted(shapes)),
        workloads=tuple(sorted(demand)),
        offers=tuple(sorted(offers)),
        shape_offer={c: v[0] for c, v in shapes.items()},
        shape_gpus={c: v[1] for c, v in shapes.items()},
        h={(c, w): x for c, v in sorted(shapes.items()) for w, x in sorted(v[2].items())},
        demand=dict(demand),
        avail={o: v[0] for o, v in offers.items()},
        owned={o: v[1] for o, v in offers.items()},
        price={o: v[2] / H for o, v in offers.items()},
        budget=None if budget_per_h is None else budget_per_h / H,
    )


def app_c_tables(requests_scale: float = 1.0) -> ComposeTables:
    """Seed 003 App. C: t1..t3 two GPUs each at 4/2/2 $/h, budget 8 $/h, f = (80, 20) requests."""
    return make_tables(
        offers={"t1": (2, 0, 4.0), "t2": (2, 0, 2.0), "t3": (2, 0, 2.0)},
        shapes={
            "t1|tp1": ("t1", 1, {"w1": 1.0, "w2": 1.2}),
            "t2|tp1": ("t2", 1, {"w1": 0.9, "w2": 0.9}),
            "t2|tp2": ("t2", 2, {"w1": 2.4, "w2": 1.5}),
            "t3|tp1": ("t3", 1, {"w1": 0.3, "w2": 0.5}),
        },
        demand={"w1": 80.0 * requests_scale, "w2": 20.0 * requests_scale},
        budget_per_h=8.0,
    )


def hand_cases() -> list[Case]:
    one = {"w1": "m"}
    two = {"w1": "m", "w2": "m"}
    return [
        Case("app-c", app_c_tables(), two),
        Case(
            "one-workload-tp-shapes",  # closed form: theta = sum y_c h_c / lambda
            make_tables(
                offers={"a": (4, 0, 1.1), "b": (4, 0, 3.0)},
                shapes={
                    "a|g1": ("a", 1, {"w1": 1.0}),
                    "a|g2": ("a", 2, {"w1": 2.3}),
                    "a|g4": ("a", 4, {"w1": 4.1}),
                    "b|g1": ("b", 1, {"w1": 3.2}),
                },
                demand={"w1": 2.0},
                budget_per_h=9.5,
            ),
            one,
        ),
        Case(
            "two-models-one-budget",  # App. E: one theta across models, shared offers and budget
            make_tables(
                offers={"a": (4, 0, 0.8), "b": (3, 0, 2.5)},
                shapes={
                    "a|small": ("a", 1, {"s1": 2.0, "s2": 1.1}),
                    "a|big": ("a", 4, {"l1": 0.9}),
                    "b|small": ("b", 1, {"s1": 4.0, "s2": 3.1}),
                    "b|big": ("b", 2, {"l1": 1.7}),
                },
                demand={"s1": 1.0, "s2": 2.0, "l1": 0.5},
                budget_per_h=12.0,
            ),
            {"s1": "small", "s2": "small", "l1": "big"},
        ),
        Case(
            "owned-gpus-are-free",
            make_tables(
                offers={"a": (3, 2, 2.0), "b": (3, 0, 1.0)},
                shapes={
                    "a|g1": ("a", 1, {"w1": 1.5, "w2": 0.7}),
                    "a|g2": ("a", 2, {"w1": 3.4, "w2": 1.2}),
                    "b|g1": ("b", 1, {"w1": 0.8, "w2": 1.0}),
                },
                demand={"w1": 1.0, "w2": 1.0},
                budget_per_h=3.0,
            ),
            two,
        ),
        Case(
            "no-budget",
            make_tables(
                offers={"a": (3, 0, 1.0), "b": (2, 0, 2.0), "c": (4, 0, 0.5)},
                shapes={
                    "a|g1": ("a", 1, {"w1": 1.0, "w2": 2.0}),
                    "b|g2": ("b", 2, {"w1": 5.0, "w2": 1.0}),
                    "c|g2": ("c", 2, {"w1": 0.6, "w2": 0.9}),
                },
                demand={"w1": 3.0, "w2": 1.0},
                budget_per_h=None,
            ),
            two,
        ),
        Case(
            "demand-out-of-reach",  # min-cost is infeasible: theta* < 1
            make_tables(
                offers={"a": (2, 0, 1.0), "b": (2, 0, 1.5)},
                shapes={"a|g1": ("a", 1, {"w1": 1.0, "w2": 0.5}), "b|g2": ("b", 2, {"w1": 2.5, "w2": 2.0})},
                demand={"w1": 4.0, "w2": 3.0},
                budget_per_h=5.0,
            ),
            two,
        ),
        Case(
            "budget-below-any-replica",  # theta* = 0: max-theta plans nothing, the pass refuses
            make_tables(
                offers={"a": (2, 0, 1.0), "b": (2, 0, 1.5)},
                shapes={"a|g1": ("a", 1, {"w1": 1.0}), "b|g2": ("b", 2, {"w1": 2.5})},
                demand={"w1": 1.0},
                budget_per_h=0.5,
            ),
            one,
        ),
        Case(
            "workload-nothing-serves",  # no h_{c,w2}: theta* = 0, min-cost infeasible (not a crash)
            make_tables(
                offers={"a": (2, 0, 1.0)},
                shapes={"a|g1": ("a", 1, {"w1": 1.0})},
                demand={"w1": 1.0, "w2": 1.0},
                budget_per_h=None,
            ),
            two,
        ),
    ]


def random_case(seed: int) -> Case:
    rng = random.Random(seed)
    offers = {}
    owner = rng.choice("abcdef")  # in about 40 % of the cases one offer has owned GPUs
    for o in "abc"[: rng.randint(2, 3)]:
        avail = rng.randint(2, 6)
        owned = rng.randint(1, avail // 2) if o == owner else 0
        offers[o] = (avail, owned, round(rng.uniform(0.3, 4.0), 2))
    models = ["m"] if rng.random() < 0.7 else ["m", "n"]
    n_w = rng.randint(len(models), 3)
    model_of = {f"w{i + 1}": models[0] if i == 0 else models[-1] if i == 1 else rng.choice(models) for i in range(n_w)}
    demand = {w: round(rng.uniform(0.5, 3.0), 2) for w in model_of}
    shapes: dict[str, tuple[str, int, dict[str, float]]] = {}
    n_s = rng.randint(3, 4)
    for i in range(n_s):
        # every offer gets a shape (an offer no shape uses: test_unused_offer_*)
        o = sorted(offers)[i] if i < len(offers) else rng.choice(sorted(offers))
        g = rng.choice([g for g in (1, 1, 2, 2, 4) if g <= offers[o][0]])
        m = models[i] if i < len(models) else rng.choice(models)
        mine = [w for w in model_of if model_of[w] == m]
        served = [w for w in mine if rng.random() > 0.2] or [rng.choice(mine)]
        h = {w: round(rng.uniform(0.2, 2.5) * g**0.8, 3) for w in served}
        shapes[f"s{i}|{o}|g{g}"] = (o, g, h)
    for w, m in model_of.items():  # every workload served somewhere (else theta* = 0: a hand case)
        if not any(w in h for _, _, h in shapes.values()):
            c = rng.choice(sorted(c for c, (_, _, h) in shapes.items() if set(h) <= {x for x in model_of if model_of[x] == m}))
            shapes[c][2][w] = round(rng.uniform(0.2, 2.5) * shapes[c][1] ** 0.8, 3)
    # budget: None, or a multiple of 0.5 $/h, 30-90 % of renting every GPU (prices are cents, so
    # no plan costs within solver tolerance of the budget unless exactly equal)
    full = sum(a * p for a, _, p in offers.values())
    budget = None if rng.random() < 0.15 else max(0.5, 0.5 * round(rng.uniform(0.3, 0.9) * full / 0.5))
    return Case(f"random-{seed}", make_tables(offers, shapes, demand, budget), model_of)


def priced(case: Case, k: float) -> Case:
    """The same instance with every price and the budget times k: $0.001/GPU-h GPUs must neither
    look free to the solver nor tie with plans a tenth of their price dearer (nor $1000/GPU-h
    ones overflow its tolerances)."""
    t = case.t
    t2 = ComposeTables(**{**t.__dict__, "price": {o: p * k for o, p in t.price.items()},
                          "budget": None if t.budget is None else t.budget * k})
    return Case(f"{case.name}-x{k:g}", t2, case.model_of)


RANDOM_CASES = [random_case(s) for s in range(20)]
PRICED_CASES = [priced(c, k) for k in (1e-3, 1e3) for c in hand_cases() + RANDOM_CASES[:8]]
CASES = hand_cases() + RANDOM_CASES + PRICED_CASES


# ---- brute force ---------------------------------------------------------------------------------


class ThetaLP:
    """max theta over r for a fixed y, as one warm-started HiGHS LP whose row bounds are y."""

    def __init__(self, t: ComposeTables):
        self.t = t
        self.cw = sorted(t.h)
        inf = highspy.kHighsInf
        lp = highspy.Highs()
        lp.setOptionValue("output_flag", False)
        n = len(self.cw)
        for _ in range(n + 1):  # r_{c,w} ..., theta
            lp.addVar(0.0, inf)
        lp.changeColCost(n, -1.0)  # minimize -theta
        for c in t.shapes:  # capacity rows 0..|C|-1: sum_w r_cw / h_cw <= y_c
            idx = [j for j, (s, _) in enumerate(self.cw) if s == c]
            lp.addRow(-inf, 0.0, len(idx), np.array(idx, dtype=np.int32), np.array([1.0 / t.h[self.cw[j]] for j in idx]))
        for w in t.workloads:  # coverage: sum_c r_cw - lambda_w theta = 0
            idx = [j for j, (_, v) in enumerate(self.cw) if v == w]
            vals = [1.0] * len(idx) + [-t.demand[w]]
            lp.addRow(0.0, 0.0, len(idx) + 1, np.array(idx + [n], dtype=np.int32), np.array(vals))
        self.lp = lp

    def theta(self, y: tuple[int, ...]) -> float:
        for i, n in enumerate(y):
            self.lp.changeRowBounds(i, -highspy.kHighsInf, float(n))
        self.lp.run()
        assert self.lp.getModelStatus() == highspy.HighsModelStatus.kOptimal
        return max(0.0, -self.lp.getInfo().objective_function_value)


def closed_form_theta(t: ComposeTables, y: tuple[int, ...]) -> float:
    (w,) = t.workloads
    return sum(n * t.h.get((c, w), 0.0) for c, n in zip(t.shapes, y)) / t.demand[w]


class BruteForce:
    """Every integer y within availability and budget, with its best theta (LP) and its cost."""

    def __init__(self, t: ComposeTables):
        self.t = t
        per_offer = []
        for o in t.offers:
            mine = [c for c in t.shapes if t.shape_offer[c] == o]
            ranges = [range(t.avail[o] // t.shape_gpus[c] + 1) for c in mine]
            fits = lambda ns: sum(n * t.shape_gpus[c] for c, n in zip(mine, ns)) <= t.avail[o]  # noqa: E731, B023 (used in this iteration only)
            ok = [dict(zip(mine, ns)) for ns in itertools.product(*ranges) if fits(ns)]
            per_offer.append(ok)
        lp = ThetaLP(t)
        self.plans: list[tuple[tuple[int, ...], float, float]] = []  # (y, theta, cost)
        for parts in itertools.product(*per_offer):
            y = {c: 0 for c in t.shapes}
            for p in parts:
                y.update(p)
            cost = solution_cost(y, t)
            if t.budget is not None and cost > t.budget + 1e-12:
                continue
            vec = tuple(y[c] for c in t.shapes)
            self.plans.append((vec, lp.theta(vec), cost))
        assert 1 <= len(self.plans) <= 20000, len(self.plans)

    def theta_of(self, y: dict[str, int]) -> float:
        return ThetaLP(self.t).theta(tuple(y[c] for c in self.t.shapes))

    def max_theta(self) -> float:
        return max(th for _, th, _ in self.plans)

    def min_cost(self, theta_min: float = 1.0) -> float | None:
        ok = [cost for _, th, cost in self.plans if th >= theta_min * (1 - 1e-9)]
        return min(ok) if ok else None

    def max_ratio(self) -> float:
        return max((th / cost for _, th, cost in self.plans if cost > 0), default=0.0)

    def max_dinkelbach(self, q: float) -> float:
        return max(th - q * cost for _, th, cost in self.plans)


_BF: dict[str, BruteForce] = {}


def brute(case: Case) -> BruteForce:
    if case.name not in _BF:
        _BF[case.name] = BruteForce(case.t)
    return _BF[case.name]


# ---- MILP and pass helpers -------------------------------------------------------------------------


def milp(t: ComposeTables, objective: str, **kw):
    model = build_model(t, objective, **kw)
    res = solve(model, SOLVER, name=f"test/{objective}")
    if not res.has_solution:
        return res, None
    return res, extract(model, t, fixed_theta=(objective == "cost" and kw.get("theta_min") is None))


def assert_valid_plan(t: ComposeTables, y: dict[str, int], r: dict[tuple[str, str], float] | None, theta: float) -> None:
    """y fits availability and budget, r fits y and serves theta x demand, and y really gives theta."""
    assert all(isinstance(n, int) and n >= 0 for n in y.values())
    for o in t.offers:
        assert sum(t.shape_gpus[c] * n for c, n in y.items() if t.shape_offer[c] == o) <= t.avail[o]
    if t.budget is not None:
        assert solution_cost(y, t) <= t.budget * (1 + 1e-9)
    if r is not None:
        for c in t.shapes:
            used = sum(v / t.h[c, w] for (s, w), v in r.items() if s == c)
            assert used <= y.get(c, 0) + 1e-6
        for w in t.workloads:
            served = sum(v for (_, x), v in r.items() if x == w)
            assert served == pytest.approx(theta * t.demand[w], rel=1e-6, abs=1e-9)
    full = {c: y.get(c, 0) for c in t.shapes}
    assert ThetaLP(t).theta(tuple(full[c] for c in t.shapes)) >= theta * (1 - 1e-6)


ARCH = ModelArch(
    layers=2, hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, vocab=128, max_context=2048, tie_embeddings=False
)


def problem_of(case: Case, objective: str) -> Problem:
    """A Problem whose `tables()` are exactly `case.t`: one GPU type and one 1-GPU-node offer per
    offer id, and shapes that are pp-chains of t.shape_gpus nodes with h as their estimate."""
    t = case.t
    kind = "requests" if objective == "min-makespan" else "rate"
    shapes = []
    for c in t.shapes:
        m = case.shape_model(c)
        ws = [w for w in t.workloads if (c, w) in t.h]
        g = t.shape_gpus[c]
        est = ShapeEstimate(
            kv_capacity_tokens=4096, prefill_tokens_per_s=1e4, decode_tokens_per_s=1e3,
            throughput_rps=tuple((w, t.h[c, w]) for w in ws), concurrency=tuple((w, 8.0) for w in ws),
            binding=tuple((w, "measured") for w in ws), source="measured",
        )
        shapes.append(
            Shape(
                id=c, model=m, offer=t.shape_offer[c], gpu=t.shape_offer[c], region="r", tp=1, pp=g,
                partition=(1,) * g, price_per_s=g * t.price[t.shape_offer[c]], estimate=est,
            )
        )
    models = sorted(set(case.model_of.values()))
    ir = Problem(
        name="bruteforce",
        spec_hash="0" * 64,
        models=tuple(
            Model(name=m, served_name=m, weights=f"test/{m}", dtype="bfloat16", arch=ARCH, max_model_len=2048) for m in models
        ),
        workloads=tuple(
            Workload(
                name=w, model=case.model_of[w], input_tokens=512.0, output_tokens=128.0, demand=t.demand[w], demand_kind=kind
            )
            for w in t.workloads
        ),
        gpus=tuple(
            GpuType(name=o, sky_name=o, memory=48e9, flops=1e14, mem_bw=1e12, interconnect=32e9, bf16=True) for o in t.offers
        ),
        offers=tuple(
            Offer(
                id=o, region="r", cloud="ssh", gpu=o, gpus_per_node=1, max_nodes=t.avail[o], owned_nodes=t.owned[o],
                price_per_gpu_s=t.price[o],
            )
            for o in t.offers
        ),
        links=(),
        budget_per_s=t.budget,
        objective=objective,
        solver=SolverConfig(time_limit_s=SOLVER.time_limit_s, mip_gap=SOLVER.mip_gap, threads=1, seed=0),
        engine=Engine(image="x", gpu_memory_utilization=0.9, max_num_seqs=256, port=8000, router_port=8080, disk_size=64),
        shapes=tuple(shapes),
    )
    assert tables(ir) == t  # the pass sees exactly the instance the brute force sees
    return ir


def run_pass(case: Case, objective: str):
    out = Compose().run(problem_of(case, objective), PassContext(solver=SOLVER))
    comp = out.composition
    y = {c: 0 for c in case.t.shapes} | dict(comp.counts)
    r = {(c, w): v for c, w, v in comp.rates}
    return comp, y, r, out.reports[-1]


# ---- the brute force itself ------------------------------------------------------------------------


def test_random_cases_cover_the_intended_variety():
    ts = [c.t for c in RANDOM_CASES]
    assert {len(t.offers) for t in ts} == {2, 3}
    assert {len(t.workloads) for t in ts} >= {1, 2, 3}
    assert {g for t in ts for g in t.shape_gpus.values()} == {1, 2, 4}
    assert any(t.budget is None for t in ts) and any(t.budget is not None for t in ts)
    assert any(c.has_owned for c in RANDOM_CASES)
    assert any(len(set(c.model_of.values())) == 2 for c in RANDOM_CASES)
    feasible = [brute(c).min_cost() is not None for c in CASES]
    assert any(feasible) and not all(feasible)  # min-cost both feasible and infeasible somewhere


@pytest.mark.parametrize("case", [c for c in CASES if len(c.t.workloads) == 1], ids=repr)
def test_lp_matches_closed_form_for_one_workload(case):
    bf = brute(case)
    for y, th, _ in bf.plans:
        assert th == pytest.approx(closed_form_theta(case.t, y), rel=1e-9, abs=1e-12)


# ---- MILP (build_model + solve) against the brute force -------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_milp_max_theta_is_the_brute_force_optimum(case):
    bf = brute(case)
    res, sol = milp(case.t, "theta")
    assert res.status == "optimal"
    assert sol.theta == pytest.approx(bf.max_theta(), rel=REL, abs=1e-12)
    assert_valid_plan(case.t, sol.y, sol.r, sol.theta)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_milp_min_cost_is_the_brute_force_optimum(case):
    best = brute(case).min_cost(1.0)
    res, sol = milp(case.t, "cost")
    if best is None:
        assert res.status == "infeasible" and sol is None
        return
    assert res.status == "optimal"
    assert sol.cost == pytest.approx(best, rel=REL, abs=1e-15)
    assert_valid_plan(case.t, sol.y, sol.r, 1.0)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_milp_min_cost_at_max_theta(case):
    bf = brute(case)
    theta_min = bf.max_theta() * THETA_KEEP
    res, sol = milp(case.t, "cost", theta_min=theta_min)
    assert res.status == "optimal"
    assert sol.cost == pytest.approx(bf.min_cost(theta_min), rel=REL, abs=1e-15)
    assert sol.theta >= theta_min * (1 - 1e-9)
    assert_valid_plan(case.t, sol.y, sol.r, sol.theta)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_milp_dinkelbach_objective(case):
    bf = brute(case)
    q_star = bf.max_ratio()
    for q in (0.5 * q_star, q_star):
        res, sol = milp(case.t, "dinkelbach", q=q)
        assert res.status == "optimal"
        best = bf.max_dinkelbach(q)
        assert sol.theta - q * sol.cost == pytest.approx(best, rel=REL, abs=1e-6 * max(1.0, bf.max_theta()))
        assert_valid_plan(case.t, sol.y, sol.r, sol.theta)
    if not case.has_owned:  # without free GPUs F(q*) = 0: no plan beats the best ratio
        assert bf.max_dinkelbach(q_star) == pytest.approx(0.0, abs=1e-9)


# ---- the Compose pass against the brute force -------------------------------------------------------


@pytest.mark.parametrize(
    "case,objective",
    [(c, "max-throughput") for c in CASES] + [(c, "min-makespan") for c in hand_cases()],  # same MILP
    ids=lambda x: repr(x) if isinstance(x, Case) else x,
)
def test_pass_max_theta_then_cheapest(case, objective):
    bf = brute(case)
    best = bf.max_theta()
    if best <= 0:
        with pytest.raises(InfeasibleError):
            run_pass(case, objective)
        return
    comp, y, r, report = run_pass(case, objective)
    assert report.status == "optimal"
    assert report.objective == pytest.approx(best, rel=REL)
    assert comp.scale == pytest.approx(best, rel=2 * REL)  # second stage keeps theta to 1e-6
    assert solution_cost(y, case.t) == pytest.approx(bf.min_cost(best * THETA_KEEP), rel=REL, abs=1e-15)
    assert_valid_plan(case.t, y, r, comp.scale * (1 - 1e-8))


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_pass_min_cost(case):
    best = brute(case).min_cost(1.0)
    if best is None:
        with pytest.raises(InfeasibleError):
            run_pass(case, "min-cost")
        return
    comp, y, r, report = run_pass(case, "min-cost")
    assert report.status == "optimal"
    assert comp.scale == 1.0
    assert solution_cost(y, case.t) == pytest.approx(best, rel=REL, abs=1e-15)
    assert_valid_plan(case.t, y, r, 1.0 - 1e-8)


@pytest.mark.parametrize("case", [c for c in CASES if not c.has_owned], ids=repr)
def test_pass_max_throughput_per_dollar_is_the_best_ratio(case):
    bf = brute(case)
    if bf.max_theta() <= 0:
        with pytest.raises(InfeasibleError):
            run_pass(case, "max-throughput-per-dollar")
        return
    comp, y, r, _ = run_pass(case, "max-throughput-per-dollar")
    cost = solution_cost(y, case.t)
    assert cost > 0
    assert comp.scale / cost == pytest.approx(bf.max_ratio(), rel=REL)
    assert_valid_plan(case.t, y, r, comp.scale * (1 - 1e-8))


# ---- seed 003 App. C --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in CASES if c.has_owned], ids=repr)
def test_pass_max_throughput_per_dollar_with_owned_gpus(case):
    """Owned GPUs are free: if they alone serve anything, the ratio is unbounded at $0/h and the
    plan is the best owned-only one; otherwise it is the best ratio, as without owned GPUs."""
    bf = brute(case)
    if bf.max_theta() <= 0:
        with pytest.raises(InfeasibleError):
            run_pass(case, "max-throughput-per-dollar")
        return
    comp, y, r, report = run_pass(case, "max-throughput-per-dollar")
    cost = solution_cost(y, case.t)
    free = max(th for _, th, c in bf.plans if c == 0)
    if free > 1e-9:
        assert cost == 0 and comp.scale == pytest.approx(free, rel=REL)
        assert any(n.startswith("owned GPUs alone serve") for n in report.notes)
    else:
        assert comp.scale / cost == pytest.approx(bf.max_ratio(), rel=REL)
    assert_valid_plan(case.t, y, r, comp.scale * (1 - 1e-8))


def test_app_c_case_3_hand_plan_is_28_67_s():
    """The paper's Case 3: 1x t1 + TP on 2x t2 (8 $/h); t1 takes 15 % of w1 and all of w2."""
    t = app_c_tables()
    y = {"t1|tp1": 1, "t2|tp1": 0, "t2|tp2": 1, "t3|tp1": 0}
    assert solution_cost(y, t) == pytest.approx(8.0 / H)
    t1 = 0.15 * 80 / 1.0 + 20 / 1.2
    tp = 0.85 * 80 / 2.4
    assert max(t1, tp) == pytest.approx(28.67, abs=0.005)
    # the LP over the same composition balances the two replicas: w1 split 40/3.4 : 80 - 40/3.4
    best_split = 1.0 / BruteForce(t).theta_of(y)
    assert best_split == pytest.approx(40 / 3.4 + 20 / 1.2, rel=1e-9)
    assert best_split < max(t1, tp)


@pytest.mark.parametrize("objective", ["theta", "min-makespan"])
def test_app_c_makespan(objective):
    t = app_c_tables()
    bf = BruteForce(t)
    brute_makespan = 1.0 / bf.max_theta()
    if objective == "theta":
        res, sol = milp(t, "theta")
        y, theta = sol.y, sol.theta
    else:
        comp, y, _, _ = run_pass(Case("app-c", t, {"w1": "m", "w2": "m"}), "min-makespan")
        theta = comp.scale
    makespan = 1.0 / theta
    assert makespan <= 28.67
    tol = REL if objective == "theta" else 2 * REL  # the pass's second stage keeps theta to 1e-6
    assert makespan == pytest.approx(brute_makespan, rel=tol)
    assert makespan == pytest.approx(40 / 3.4 + 20 / 1.2, rel=tol)  # 28.431 s
    assert {c: n for c, n in y.items() if n} == {"t1|tp1": 1, "t2|tp2": 1}  # Case 2/3's composition
    assert solution_cost(y, t) == pytest.approx(8.0 / H)  # the budget binds


def test_app_c_makespan_does_not_depend_on_the_request_unit():
    """Same instance with every f_w x 1e5 (8,000,000 + 2,000,000 requests): the makespan scales by
    1e5 and the plan stays 1x t1 + TP on 2x t2. (Before compose_model scaled theta by sum(lambda),
    theta = 1/T ~ 3.5e-7 sat below HiGHS's tolerances and it returned 2x t1, T 1.7x too long.)"""
    k = 1e5
    t = app_c_tables(requests_scale=k)
    res, sol = milp(t, "theta")
    assert res.status == "optimal"
    assert 1.0 / sol.theta == pytest.approx((40 / 3.4 + 20 / 1.2) * k, rel=REL)
    assert {c: n for c, n in sol.y.items() if n} == {"t1|tp1": 1, "t2|tp2": 1}


def test_workload_nothing_serves_is_named():
    case = next(c for c in CASES if c.name == "workload-nothing-serves")
    with pytest.raises(InfeasibleError, match="w2"):
        run_pass(case, "min-cost")


# ---- regressions: bugs these brute forces found (once strict-xfail, now fixed) --------------------


def _with_unused_offer() -> ComposeTables:
    """App. C plus offer t4 (2 GPUs at 1 $/h) that no shape uses, as when no replica fits its GPU."""
    t = app_c_tables()
    return ComposeTables(
        **{
            **t.__dict__,
            "offers": (*t.offers, "t4"),
            "avail": {**t.avail, "t4": 2},
            "owned": {**t.owned, "t4": 0},
            "price": {**t.price, "t4": 1.0 / H},
        }
    )


def test_unused_offer_is_ignored():
    t = _with_unused_offer()
    res, sol = milp(t, "theta")
    assert res.status == "optimal"
    assert 1.0 / sol.theta == pytest.approx(40 / 3.4 + 20 / 1.2, rel=REL)


def test_unused_offer_in_a_spec(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: unused-offer\n"
        "models: [{name: llama-3-70b}]\n"
        "workloads: [{name: chat, model: llama-3-70b, input_tokens: 512, output_tokens: 128, rate: 1/s}]\n"
        "regions:\n"
        "  - name: r1\n"
        "    cloud: vast\n"
        "    offers:\n"
        "      - {gpu: A100-80GB, gpus_per_node: 2, max_nodes: 2}\n"
        "      - {gpu: T4, max_nodes: 1}\n"
        "budget: $10/h\n"
    )
    ir = compile_spec(spec, stop_after="compose").ir
    assert ir.composition.scale > 0
    assert all("T4" not in c for c, _ in ir.composition.counts)


def test_min_cost_separates_plans_a_tenth_of_a_cent_apart():
    """a: 2 GPUs at 0.690 $/h, 1.0 req/s each; b: 2 GPUs at 0.691 $/h, 1.9 req/s; demand 2.5 req/s.
    1a + 1b (2.9 req/s, 1.381 $/h) is the cheapest; 2b (3.8 req/s, 1.382 $/h) is what HiGHS returns."""
    t = make_tables(
        offers={"a": (2, 0, 0.690), "b": (2, 0, 0.691)},
        shapes={"a|g1": ("a", 1, {"w": 1.0}), "b|g1": ("b", 1, {"w": 1.9})},
        demand={"w": 2.5},
        budget_per_h=None,
    )
    assert brute(Case("tenth-cent", t, {"w": "m"})).min_cost() == pytest.approx(1.381 / H)
    res, sol = milp(t, "cost")
    assert res.status == "optimal"
    assert sol.cost == pytest.approx(1.381 / H, rel=REL)
    unit = res.objective / sol.cost  # the model's cost unit per $/s, whatever it is
    assert res.bound <= 1.381 / H * unit * (1 + REL)  # the dual bound must not exceed the optimum


def test_per_dollar_with_owned_gpus_is_at_least_the_best_paid_ratio():
    """owned-gpus-are-free: 0.95x demand is free (ratio infinite), 1.64 per $/h the best paid ratio,
    3.10x demand at 3 $/h the max-theta plan (which the pass used to return). Whatever the
    semantics, the ratio must be at least the best paid one; ours: the best owned-only plan."""
    case = next(c for c in CASES if c.name == "owned-gpus-are-free")
    comp, y, _, _ = run_pass(case, "max-throughput-per-dollar")
    cost = solution_cost(y, case.t)
    ratio = comp.scale / cost if cost > 0 else math.inf
    assert ratio >= brute(case).max_ratio() * (1 - REL)
    free = max(th for _, th, c in brute(case).plans if c == 0)
    assert cost == 0 and comp.scale == pytest.approx(free, rel=REL)


def test_dinkelbach_note_is_per_dollar_per_hour():
    case = next(c for c in CASES if c.name == "one-workload-tp-shapes")
    comp, y, _, report = run_pass(case, "max-throughput-per-dollar")
    per_h = comp.scale / (solution_cost(y, case.t) * H)  # x demand per $/h
    note = next(n for n in report.notes if n.startswith("dinkelbach converged"))
    shown = float(note.split(" at ")[1].split(" x demand")[0])
    assert shown == pytest.approx(per_h, rel=1e-3)


# ---- work budgets: a node limit stops every machine at the same plan ----------------------------


def hard_case() -> Case:
    """30 shapes of odd GPU counts over 6 offers under a budget: HiGHS must branch (seed 5)."""
    rng = random.Random(5)
    offers = {f"o{i}": (rng.randint(5, 23), 0, 0.0) for i in range(6)}
    shapes = {}
    for i in range(30):
        o, g = rng.choice(sorted(offers)), rng.choice([1, 2, 3, 4, 5, 7])
        shapes[f"s{i}"] = (o, g, {w: round(rng.uniform(0.3, 3.0) * g**0.9, 3) for w in ("w1", "w2", "w3") if rng.random() < 0.8})
    offers = {o: (a, e, round(rng.uniform(0.5, 4.0), 2)) for o, (a, e, _) in offers.items()}
    t = make_tables(offers, shapes, {"w1": 1.0, "w2": 2.0, "w3": 0.7}, budget_per_h=37.3)
    return Case("hard", t, {"w1": "m", "w2": "m", "w3": "m"})


def test_node_limit_is_a_reproducible_work_budget():
    case = hard_case()
    opts = SolverOptions(time_limit_s=600.0, mip_gap=1e-9, node_limit=1)
    runs = [solve(build_model(case.t, "theta"), opts, name="compose/max-theta") for _ in range(2)]
    assert [r.limit for r in runs] == ["nodes", "nodes"] and runs[0].status == "feasible"
    assert runs[0].objective == runs[1].objective and runs[0].gap > 0
    full = solve(build_model(case.t, "theta"), SOLVER, name="full")
    assert full.status == "optimal" and full.limit is None and full.objective >= runs[0].objective
    out = Compose().run(problem_of(case, "max-throughput"), PassContext(solver=opts))
    notes = out.reports[-1].notes
    assert any("stopped at its work budget (solver.node_limit 1 nodes)" in n for n in notes), notes


def test_progress_lines_during_a_solve_do_not_change_it(monkeypatch):
    import hetcompile.opt.solve as solve_mod

    monkeypatch.setattr(solve_mod, "PROGRESS_EVERY_S", 0.0)  # every interrupt callback reports
    heard: list[str] = []
    case = hard_case()
    quiet = solve(build_model(case.t, "theta"), SOLVER, name="compose/max-theta")
    loud = solve(build_model(case.t, "theta"), SolverOptions(time_limit_s=60.0, mip_gap=1e-9, progress=heard.append),
                 name="compose/max-theta")
    assert heard and all(h.startswith("compose/max-theta: ") and " nodes, " in h for h in heard)
    assert (loud.status, loud.objective) == (quiet.status, quiet.objective)


# ---- dominated shapes (compose_model.drop_dominated) -----------------------------------------------


def test_dominated_shapes_are_dropped_and_the_optima_do_not_move():
    """k copies of a shape of the same offer replace a shape of k x its GPUs that serves no more:
    the MILP without such columns has the same max theta and min cost (`drop_dominated`'s claim)."""
    from hetcompile.passes.compose_model import drop_dominated, restore_dominated

    dropped_somewhere = 0
    for case in CASES + [hard_case()]:
        reduced, dropped = drop_dominated(case.t)
        for b, (a, k) in dropped.items():
            t = case.t
            assert a in reduced.shapes and b not in reduced.shapes and t.shape_offer[a] == t.shape_offer[b]
            assert t.shape_gpus[b] == k * t.shape_gpus[a]
            assert all(k * t.h[a, w] >= h for (c, w), h in t.h.items() if c == b)
        if not dropped:
            assert reduced is case.t
            continue
        dropped_somewhere += 1
        for objective in ("theta", "cost"):
            full, _ = milp(case.t, objective)
            res, sol = milp(reduced, objective)
            assert res.status == full.status
            if full.objective is not None:
                assert res.objective == pytest.approx(full.objective, rel=REL, abs=1e-12)
                back = restore_dominated(sol, case.t, dropped)
                assert set(back.y) == set(case.t.shapes) and all(back.y[b] == 0 for b in dropped)
    assert dropped_somewhere >= 5  # the random cases have dominated shapes to drop


def test_dominance_needs_the_same_offer_a_divisor_and_no_running_replica():
    from dataclasses import replace

    from hetcompile.passes.compose_model import drop_dominated

    t = ComposeTables(
        shapes=("a1", "a2", "a4", "b2", "c3"), workloads=("w",), offers=("A", "B"),
        shape_offer={"a1": "A", "a2": "A", "a4": "A", "b2": "B", "c3": "A"},
        shape_gpus={"a1": 1, "a2": 2, "a4": 4, "b2": 2, "c3": 3},
        h={("a1", "w"): 1.0, ("a2", "w"): 2.5, ("a4", "w"): 4.5, ("b2", "w"): 0.1, ("c3", "w"): 0.5},
        demand={"w": 1.0}, avail={"A": 8, "B": 8}, owned={"A": 0, "B": 0}, price={"A": 1.0, "B": 1.0}, budget=None,
    )
    # a1 (1 GPU, 1.0) is beaten by nothing; a2 (2.5) beats 2 x a1; a4 (4.5) beats 4 x a1 but loses to 2 x a2;
    # b2 is on another offer; c3 (3 GPUs) is no multiple of a2 and 3 x a1 (3.0) beats it
    assert drop_dominated(t)[1] == {"a4": ("a2", 2), "c3": ("a1", 3)}
    # replanning: a running a4 stays, and churn counts replicas, so only k = 1 replaces
    assert drop_dominated(replace(t, previous={"a4": 1}))[1] == {}
    # two equal shapes replace each other: the first by id stays
    twin = replace(t, shapes=("a2", "a2x"), shape_offer={"a2": "A", "a2x": "A"}, shape_gpus={"a2": 2, "a2x": 2},
                   h={("a2", "w"): 2.5, ("a2x", "w"): 2.5})
    assert drop_dominated(twin)[1] == {"a2x": ("a2", 1)}


def test_a_start_on_dropped_shapes_becomes_their_replacements():
    """A warm start that uses a dropped shape is handed to HiGHS as k replicas of its replacement,
    so a solve started from it still never reports less than the start."""
    from hetcompile.passes.compose import SolveLog, solve_composition
    from hetcompile.passes.compose_model import ComposeSolution

    t = ComposeTables(
        shapes=("a2", "a4"), workloads=("w",), offers=("A",), shape_offer={"a2": "A", "a4": "A"},
        shape_gpus={"a2": 2, "a4": 4}, h={("a2", "w"): 2.5, ("a4", "w"): 4.0}, demand={"w": 1.0},
        avail={"A": 8}, owned={"A": 0}, price={"A": 1.0}, budget=None,
    )
    start = ComposeSolution(y={"a2": 0, "a4": 2}, r={("a2", "w"): 0.0, ("a4", "w"): 8.0}, theta=8.0, cost=8.0)
    log = SolveLog(SolverOptions(mip_gap=1e-9, node_limit=1))
    res, sol = solve_composition(t, log, "test/max-theta", "theta", start=start)
    assert sol is not None and sol.y == {"a2": 4, "a4": 0} and sol.theta == pytest.approx(10.0)


def test_the_second_stage_only_breaks_ties_within_its_work_budget(monkeypatch):
    """max-throughput's cheapest plan at theta* gets TIEBREAK_NODES at most, starts from the first
    stage's plan and says so when it stops there; the plan keeps the first stage's theta."""
    import hetcompile.passes.compose as compose_mod

    case = hard_case()
    monkeypatch.setattr(compose_mod, "TIEBREAK_NODES", 1)
    out = Compose().run(problem_of(case, "max-throughput"), PassContext(solver=SOLVER))
    notes = out.reports[-1].notes
    best = solve(build_model(case.t, "theta"), SOLVER, name="full")
    assert best.status == "optimal" and out.composition.scale == pytest.approx(best.objective / sum(case.t.demand.values()), rel=2 * REL)
    stopped = [n for n in notes if n.startswith("compose/min-cost-at-theta stopped at its work budget (1 nodes; it only breaks ties)")]
    assert stopped, notes
