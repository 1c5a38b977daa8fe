"""Placement stops on work budgets, not on the clock: the same problem gives the same placement
whatever the time limit, and a search cut by its work budget says so (no timing asserted)."""

from __future__ import annotations

import pytest

from hetcompile.placement import SolverOptions, place
from hetcompile.placement.chains import place as chains
from hetcompile.opt.budget import Budget
from hetcompile.placement.helix.artifact import load_setup


def _key(res):
    return ([(c.id, tuple((s.unit, s.start, s.end) for s in c.stages)) for c in res.chains], res.depth_aware_capacity,
            res.helix_flow, res.incumbent_source)


def test_time_limit_does_not_change_the_placement(monkeypatch):
    # a tenth of the default work budget: the same search, stopped by work sooner (7 s -> 2 s a run)
    monkeypatch.setattr(chains, "SEARCH_WORK", chains.SEARCH_WORK // 10)
    p = load_setup("highhet42")
    a = place(p, mode="chains", options=SolverOptions(time_limit_s=120, mip_gap=1e-3))
    b = place(p, mode="chains", options=SolverOptions(time_limit_s=10_000, mip_gap=1e-3))
    assert not a.machine_dependent and not b.machine_dependent
    assert _key(a) == _key(b)


def test_the_work_budget_decides_where_the_search_stops(monkeypatch):
    p = load_setup("cluster10")
    monkeypatch.setattr(chains, "SEARCH_WORK", 40)
    runs = [place(p, mode="chains", options=SolverOptions(time_limit_s=10_000, mip_gap=1e-3)) for _ in range(2)]
    assert _key(runs[0]) == _key(runs[1])
    assert "local search: 40 of 40 neighbour evaluations" in runs[0].notes
    assert not runs[0].machine_dependent
    monkeypatch.setattr(chains, "SEARCH_WORK", 4000)
    more = place(p, mode="chains", options=SolverOptions(time_limit_s=10_000, mip_gap=1e-3))
    assert more.depth_aware_capacity >= runs[0].depth_aware_capacity * (1 - 1e-9)


def test_budget_reports_which_limit_stopped_it():
    b = Budget(3)
    assert [b.take() for _ in range(4)] == [True, True, True, False]
    assert b.stopped_by == "work" and not b.timed_out
    capped = Budget(10, deadline=float("-inf"))  # a cap already past: refused, and reported as time
    assert not capped.take() and capped.timed_out and capped.spent == 0
    parent = Budget(100)
    child = parent.share(0.5)
    assert child.work == 50
    child.take(7)
    parent.absorb(child)
    assert parent.spent == 7 and parent.left == 93


@pytest.mark.parametrize("mode", ["chains", "shared"])
def test_two_runs_give_identical_results(mode):
    p = load_setup("cluster10")
    runs = [place(p, mode=mode, options=SolverOptions(time_limit_s=10_000, mip_gap=1e-3)) for _ in range(2)]
    assert _key(runs[0]) == _key(runs[1])
    assert sorted((u.unit, u.start, u.end) for u in runs[0].units) == sorted((u.unit, u.start, u.end) for u in runs[1].units)


def test_shared_mode_stops_on_its_work_budget_not_the_clock(monkeypatch):
    """geo24 (binding links: bound, blocks, segments and node swaps all run) cut to 60 units of
    work: the same placement under any time limit, reported as a work stop, not a clock stop."""
    from hetcompile.placement.helix import place as shared

    p = load_setup("geo24")
    monkeypatch.setattr(shared, "SHARED_WORK", 60)
    runs = [place(p, mode="shared", options=SolverOptions(time_limit_s=t, mip_gap=1e-3)) for t in (120, 10_000)]
    assert _key(runs[0]) == _key(runs[1])
    assert sorted((u.unit, u.start, u.end) for u in runs[0].units) == sorted((u.unit, u.start, u.end) for u in runs[1].units)
    assert not any(r.machine_dependent for r in runs)
    spent = int(runs[0].notes[0].split()[1])
    assert runs[0].notes[0] == f"work: {spent} of 60 solves and flow evaluations" and 0 < spent <= 60
    monkeypatch.setattr(shared, "SHARED_WORK", 4000)
    full = place(p, mode="shared", options=SolverOptions(time_limit_s=10_000, mip_gap=1e-3))
    assert full.helix_flow >= runs[0].helix_flow * (1 - 1e-9)


def test_shared_mode_reports_a_clock_stop():
    """A time limit too small for the work (the reserve eats it all) is reported, not hidden."""
    p = load_setup("geo24")
    res = place(p, mode="shared", options=SolverOptions(time_limit_s=0.01, mip_gap=1e-3))
    assert res.machine_dependent and res.helix_flow > 0
    assert any("stopped by the wall-clock cap" in n for n in res.notes)


def test_a_build_reuses_an_identical_placement_and_only_inside_remembering(monkeypatch):
    """The build's verification re-solves with new tail factors (passes/verify.py): inside
    `remembering()` an identical problem returns the earlier result, whatever time cap its share
    is; outside, every call solves, so a work budget changed between calls is seen."""
    from hetcompile.placement import remembering

    p = load_setup("cluster10")
    with remembering():
        a = place(p, mode="chains", options=SolverOptions(time_limit_s=100, mip_gap=1e-3))
        b = place(p, mode="chains", options=SolverOptions(time_limit_s=7, mip_gap=1e-3))
        c = place(p, mode="chains", options=SolverOptions(time_limit_s=100, mip_gap=1e-2))
    assert b is a and c is not a
    monkeypatch.setattr(chains, "SEARCH_WORK", 40)
    d = place(p, mode="chains", options=SolverOptions(time_limit_s=100, mip_gap=1e-3))
    assert d is not a and "local search: 40 of 40 neighbour evaluations" in d.notes
