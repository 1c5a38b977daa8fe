"""Disaggregation: from per-group layer intervals to concrete nodes, and the pick of nodes.

The group models decide how many nodes of a group hold each [a, b); which concrete node takes
which interval matters only where links bind (node pairs differ, e.g. the Helix geo cluster).
There a first-improvement local search swaps the nodes of two intervals of one group (or an
interval and an idle node) while the exact max flow (networkx) grows; one unit of work
(budget.py) per flow evaluated.
"""

from __future__ import annotations

from hetcompile.opt.budget import Budget
from hetcompile.placement.evaluate import helix_flow
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.result import StageUnit
from hetcompile.placement.tables import GroupTable


def units_from_intervals(
    p: PlacementProblem, tables: tuple[GroupTable, ...], intervals: dict[int, list[tuple[int, int]]]
) -> list[StageUnit]:
    """Assign the nodes of each group to its intervals in id order (intervals sorted by start)."""
    units = []
    for j, ivs in sorted(intervals.items()):
        t = tables[j]
        ids = p.groups[t.gi].ids
        if len(ivs) > len(ids):
            raise ValueError(f"group {p.groups[t.gi].id_prefix}: {len(ivs)} intervals for {len(ids)} nodes")
        for node, (a, b) in zip(ids, sorted(ivs)):
            units.append(StageUnit(node, node, t.gi, t.tp, tuple(range(t.tp)), a, b))
    return units


def improve_assignment(
    p: PlacementProblem, units: list[StageUnit], budget: Budget, *, partial: bool
) -> tuple[list[StageUnit], float]:
    """Swap nodes within groups while the exact Helix flow improves (binding links only matter)."""
    best, _ = helix_flow(p, units, partial=partial)
    units = list(units)
    improved = True
    while improved and not budget.exhausted:
        improved = False
        for i in range(len(units)):
            ui = units[i]
            used = {u.node for u in units}
            idle = [n for n in p.groups[ui.gi].ids if n not in used]
            # a candidate is unit k (swap the two nodes) or an idle node's id (move there)
            cands: list[int | str] = [k for k in range(i + 1, len(units)) if units[k].gi == ui.gi and units[k].tp == ui.tp
                                      and (units[k].start, units[k].end) != (ui.start, ui.end)]
            cands += idle
            for c in cands:
                if not budget.take():
                    break
                trial = list(units)
                if isinstance(c, int):
                    uk = units[c]
                    trial[i] = StageUnit(uk.node, uk.node, ui.gi, ui.tp, ui.gpus, ui.start, ui.end)
                    trial[c] = StageUnit(ui.node, ui.node, uk.gi, uk.tp, uk.gpus, uk.start, uk.end)
                else:
                    trial[i] = StageUnit(c, c, ui.gi, ui.tp, ui.gpus, ui.start, ui.end)
                val, _ = helix_flow(p, trial, partial=partial)
                if val > best * (1 + 1e-9):
                    best, units, improved = val, trial, True
                    ui = units[i]
                    break
    return units, best
