"""compose_model's prefill/decode rows (issue 35): coverage counts decodes and aggregated replicas, and
in each balance group every request a decode replica serves had its prompt prefilled there. Small
tables, solved by HiGHS; no spec."""

from __future__ import annotations

import pytest

from hetcompile.opt.solve import SolverOptions, solve
from hetcompile.passes.compose_model import ComposeTables, build_model, extract


def _tables(groups: dict[str, str], h_agg: float = 1.0, budget: float | None = None, **more) -> ComposeTables:
    """One workload w at 10 req/s on one offer (1 $/GPU-s, 40 GPUs): an aggregated shape `a` of
    h_agg req/s, a prefill shape `p` (4 prompts/s) and a decode shape `d` (2 req/s), one GPU each."""
    shapes = ("a", "d", "p")
    return ComposeTables(
        shapes=shapes, workloads=("w",), offers=("o",), shape_offer={c: "o" for c in shapes},
        shape_gpus={c: 1 for c in shapes}, h={("a", "w"): h_agg, ("p", "w"): 4.0, ("d", "w"): 2.0},
        demand={"w": 10.0}, avail={"o": 40}, owned={"o": 0}, price={"o": 1.0}, budget=budget,
        shape_role={"p": "prefill", "d": "decode"}, shape_group=groups, **more)


def _solve(t: ComposeTables, objective: str):
    m = build_model(t, objective)
    res = solve(m, SolverOptions(time_limit_s=30), name="compose-pd")
    assert res.has_solution
    return extract(m, t, fixed_theta=objective == "cost")


def test_min_cost_takes_the_split_where_it_is_cheaper_at_the_ratio_it_needs() -> None:
    # per req/s: aggregated 1 GPU, split 1/4 + 1/2 = 0.75 GPU: 3 prefill (10/4 rounded up) + 5 decode
    sol = _solve(_tables({"p": "r1", "d": "r1"}), "cost")
    assert sol.y == {"a": 0, "d": 5, "p": 3}
    assert sol.r[("p", "w")] == pytest.approx(10.0) and sol.r[("d", "w")] == pytest.approx(10.0)
    assert sol.cost == pytest.approx(8.0)


def test_phases_in_different_groups_cannot_pair() -> None:
    # the KV may not move between groups: with the prefill shape in another region, only `a` serves
    sol = _solve(_tables({"p": "r1", "d": "r2"}), "cost")
    assert sol.y == {"a": 10, "d": 0, "p": 0}


def test_the_aggregated_shape_wins_where_it_is_cheaper() -> None:
    sol = _solve(_tables({"p": "r1", "d": "r1"}, h_agg=2.0), "cost")  # 0.5 GPU per req/s against 0.75
    assert sol.y == {"a": 5, "d": 0, "p": 0}


def test_max_throughput_mixes_both_under_a_budget() -> None:
    # 9 $/s: the split alone would serve 9 GPUs' worth at 0.75 GPU per req/s = 12 req/s, but integrality
    # decides the mix; whatever it is, every decode request had its prompt prefilled
    sol = _solve(_tables({"p": "r1", "d": "r1"}, budget=9.0), "theta")
    assert sum(sol.y.values()) <= 9
    assert sol.r.get(("p", "w"), 0.0) == pytest.approx(sol.r.get(("d", "w"), 0.0))
    assert sol.r[("p", "w")] <= 4.0 * sol.y["p"] + 1e-6 and sol.r[("d", "w")] <= 2.0 * sol.y["d"] + 1e-6
    served = sol.r.get(("a", "w"), 0.0) + sol.r[("d", "w")]
    assert served == pytest.approx(10.0 * sol.theta) and sol.theta > 1.1  # more than 9 aggregated replicas serve


def test_a_workload_with_only_a_prefill_shape_is_not_served() -> None:
    t = ComposeTables(shapes=("p",), workloads=("w",), offers=("o",), shape_offer={"p": "o"}, shape_gpus={"p": 1},
                      h={("p", "w"): 4.0}, demand={"w": 1.0}, avail={"o": 4}, owned={"o": 0}, price={"o": 1.0},
                      budget=10.0, shape_role={"p": "prefill"}, shape_group={"p": "r1"})
    sol = _solve(t, "theta")
    assert sol.theta == pytest.approx(0.0)
