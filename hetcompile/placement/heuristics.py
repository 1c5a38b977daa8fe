"""Constructive placements: Swarm (equal stages), Petals (greedy), separate pipelines per group.

They are the baselines of the bench and the first incumbents of `place` (a bound-based early
stop needs a good incumbent early). Each returns concrete stage units at native TP; the flow is
always the exact max flow of evaluate.py, never the heuristic's own estimate.

- Swarm (Ryabinin et al.): the model is cut into S equal stages; every node serves one stage
  and nodes are spread so that the stages' summed capacities balance (largest node first onto
  the weakest stage it can hold). S is chosen as the best of the feasible stage counts.
- Petals (Borzunov et al.): nodes join one by one (strongest first), load as many layers as
  they can hold and start where the swarm is weakest: the window whose sorted per-layer
  throughputs are lexicographically smallest (Petals' `_choose_best_start`).
- Separate pipelines: every group forms its own chains (the number of chains that maximizes the
  group's summed bottleneck capacity); groups that cannot hold L layers stay idle.
"""

from __future__ import annotations

from hetcompile.placement.evaluate import helix_flow
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.result import StageUnit
from hetcompile.placement.tables import GroupTable, best_split


def _nodes(p: PlacementProblem, tables: tuple[GroupTable, ...]) -> list[tuple[str, int]]:
    """(node id, table index) for every node, deterministic order."""
    return [(n, j) for j, t in enumerate(tables) for n in p.groups[t.gi].ids]


def _unit(t: GroupTable, node: str, a: int, b: int) -> StageUnit:
    return StageUnit(node, node, t.gi, t.tp, tuple(range(t.tp)), a, b)


def swarm_layout(p: PlacementProblem, tables: tuple[GroupTable, ...], stages: int) -> list[StageUnit]:
    L = p.num_layers
    bounds = [round(i * L / stages) for i in range(stages + 1)]
    lens = [bounds[i + 1] - bounds[i] for i in range(stages)]
    load = [0.0] * stages
    units = []
    order = sorted(_nodes(p, tables), key=lambda nj: (-max(tables[nj[1]].T), nj[0]))
    for node, j in order:
        t = tables[j]
        ok = [s for s in range(stages) if lens[s] <= t.kmax and t.T[lens[s] - 1] > 0]
        if not ok:
            continue
        s = min(ok, key=lambda s: (load[s], s))
        load[s] += t.T[lens[s] - 1]
        units.append(_unit(t, node, bounds[s], bounds[s + 1]))
    return units


def swarm(p: PlacementProblem, tables: tuple[GroupTable, ...], partial: bool = False) -> tuple[list[StageUnit], float]:
    """Best equal-stage layout over the stage counts every node type can serve, or any at all: the
    first of the largest flows in order of S. A layout's flow is at most its weakest stage's summed
    T (each stage is a cut: every path crosses one unit of it), so the max flows are computed in
    order of that bound and stop where it falls below the best flow found: the same layout as
    computing every one (a pool of hundreds of nodes has dozens of S, and each flow graph is
    quadratic in the nodes: 2 minutes per model at 1,072 nodes)."""
    L = p.num_layers
    n = sum(t.count for t in tables)
    kmax = max(t.kmax for t in tables)
    counts = range(-(-L // kmax), min(L, n) + 1)
    layouts = [swarm_layout(p, tables, stages) for stages in counts]
    bounds = [_stage_cut(p, units, stages) for units, stages in zip(layouts, counts)]
    vals: dict[int, float] = {}
    top = 0.0
    for i in sorted(range(len(layouts)), key=lambda i: (-bounds[i], i)):
        # 1e-9: a layout skipped here is below the best by more than the 1e-12 the choice below
        # breaks ties by, so it could not have been chosen, nor kept a later one from being
        if bounds[i] * (1 + 1e-9) < top:
            break
        vals[i], _ = helix_flow(p, layouts[i], partial=partial)
        top = max(top, vals[i])
    best: tuple[list[StageUnit], float] = ([], 0.0)
    for i in sorted(vals):
        if vals[i] > best[1] * (1 + 1e-12):
            best = (layouts[i], vals[i])
    return best


def _stage_cut(p: PlacementProblem, units: list[StageUnit], stages: int) -> float:
    """min over the layout's stages of the summed T of their units: an upper bound on its max flow
    (0 where a stage has no unit: no path crosses it)."""
    by_stage: dict[int, float] = {}
    for u in units:
        by_stage[u.start] = by_stage.get(u.start, 0.0) + p.groups[u.gi].profile(u.tp).T(u.layers)
    return min(by_stage.values()) if len(by_stage) == stages else 0.0


def petals(p: PlacementProblem, tables: tuple[GroupTable, ...], partial: bool = False) -> tuple[list[StageUnit], float]:
    L = p.num_layers
    thr = [0.0] * L
    units = []
    order = sorted(_nodes(p, tables), key=lambda nj: (-tables[nj[1]].kmax * tables[nj[1]].T[-1], nj[0]))
    for node, j in order:
        t = tables[j]
        k = min(t.kmax, L)
        a = min(range(0, L - k + 1), key=lambda a: (sorted(thr[a:a + k]), a))
        for l in range(a, a + k):
            thr[l] += t.T[k - 1]
        units.append(_unit(t, node, a, a + k))
    val, _ = helix_flow(p, units, partial=partial)
    return units, val


def group_chains(t: GroupTable, L: int) -> list[tuple[int, ...]]:
    """Layer splits of the chains one group forms on its own (max summed bottleneck)."""
    n = t.count * t.units_per_node
    best: tuple[float, list[tuple[int, ...]]] = (0.0, [])
    for c in range(1, n + 1):
        sizes = [n // c + (1 if i < n % c else 0) for i in range(c)]
        splits = [best_split(t.T, L, m) for m in sizes]
        if any(v <= 0 for v, _ in splits):
            # fewer nodes per chain than L needs: drop the smallest chains' surplus
            usable = [(v, s) for v, s in splits if v > 0]
            if not usable:
                continue
            splits = usable
        val = sum(v for v, _ in splits)
        if val > best[0]:
            best = (val, [s for _, s in splits])
    return best[1]


def separate_pipelines(p: PlacementProblem, tables: tuple[GroupTable, ...]) -> tuple[list[StageUnit], list[list[str]]]:
    """Per-group chains: (units, chains as lists of unit ids)."""
    L = p.num_layers
    units, chains = [], []
    for t in tables:
        if t.units_per_node != 1:
            continue
        ids = list(p.groups[t.gi].ids)
        for split in group_chains(t, L):
            chain, a = [], 0
            for k in split:
                node = ids.pop(0)
                units.append(_unit(t, node, a, a + k))
                chain.append(node)
                a += k
            chains.append(chain)
    return units, chains
