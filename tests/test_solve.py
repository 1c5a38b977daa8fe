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
