"""opt/solve.py: the one place HiGHS is called."""

from __future__ import annotations

import io
import sys

import pyomo.environ as pyo
import pytest

from hetcompile.opt.solve import SolverOptions, solve


def _knapsack() -> pyo.ConcreteModel:
    m = pyo.ConcreteModel()
    m.x = pyo.Var(range(6), domain=pyo.Binary)
    w = [3, 4, 5, 6, 7, 8]
    m.cap = pyo.Constraint(expr=sum(w[i] * m.x[i] for i in range(6)) <= 17)
    m.obj = pyo.Objective(expr=sum((w[i] + i % 2) * m.x[i] for i in range(6)), sense=pyo.maximize)
    return m


@pytest.mark.parametrize("stderr", ["buffer", "real"])
def test_progress_callback_works_with_any_stderr(monkeypatch: pytest.MonkeyPatch, stderr: str) -> None:
    """A stderr without a file descriptor (click's CliRunner, pytest capture) must not break a solve."""
    if stderr == "buffer":
        monkeypatch.setattr(sys, "stderr", io.StringIO())
    lines: list[str] = []
    res = solve(_knapsack(), SolverOptions(progress=lines.append), name="knapsack")
    assert res.status == "optimal" and res.objective == pytest.approx(19)


def test_explaining_re_solves_run_without_the_root_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """compose's what-if and alternatives re-solves (50 nodes) turn HiGHS's root restart off; the
    plan's own solves keep it. The option reaches HiGHS, and the optimum is the same without it."""
    from pyomo.contrib.appsi.solvers import Highs

    from hetcompile.passes.compose import SolveLog

    seen: list[dict] = []
    real = Highs.solve

    def spy(self, model, *a, **kw):
        seen.append(dict(self.highs_options))
        return real(self, model, *a, **kw)

    monkeypatch.setattr(Highs, "solve", spy)
    plan = SolveLog(SolverOptions())
    explain = plan.explainer()
    assert plan.options.restarts and not explain.options.restarts and explain.options.node_limit == 50
    for log in (plan, explain):
        res = solve(_knapsack(), log.options, name="knapsack")
        assert res.status == "optimal" and res.objective == pytest.approx(19)
    assert "mip_allow_restart" not in seen[0] and seen[1]["mip_allow_restart"] is False
    # and without RINS / RENS sub-MIPs, which the plan's own solves keep
    assert plan.options.submips and not explain.options.submips
    assert "mip_heuristic_run_rins" not in seen[0]
    assert seen[1]["mip_heuristic_run_rins"] is False and seen[1]["mip_heuristic_run_rens"] is False
