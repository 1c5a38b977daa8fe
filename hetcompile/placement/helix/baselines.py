"""Baselines in the same evaluator: Swarm, Petals, separate pipelines, and any fixed placement.

Each returns a PlacementResult whose flow is the exact Helix max flow and whose depth-aware
capacity comes from the same model as `place` (evaluate.py), so the bench compares like with
like. Swarm and Petals are shared placements (per-request pipelines); separate pipelines are
chains (deployable).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from hetcompile.placement import heuristics
from hetcompile.placement.evaluate import chain_eval, edge_flows, helix_flow, shared_depth_aware
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.result import ChainInfo, PlacementResult, StageUnit
from hetcompile.placement.tables import group_tables


def evaluate_placement(
    p: PlacementProblem, units: Sequence[StageUnit], *, chains: Sequence[Sequence[str]] | None = None,
    partial: bool = False, source: str = "fixed", time_s: float = 0.0,
) -> PlacementResult:
    """Wrap a fixed placement: shared when `chains` is None, else the given chains (unit ids)."""
    units = tuple(sorted(units, key=lambda u: (u.start, u.unit)))
    value, flow = helix_flow(p, units, chains, partial)
    infos: list[ChainInfo] = []
    if chains is None:
        da = shared_depth_aware(p, units, partial)
    else:
        by_id = {u.unit: u for u in units}
        for c in chains:
            stages = tuple(by_id[x] for x in c)
            ev = chain_eval(p, stages)
            hv, _ = helix_flow(p, stages, [list(c)])
            infos.append(ChainInfo(
                id=f"c{len(infos)}", stages=stages, tp=stages[0].tp, mixed=len({p.groups[s.gi].gpu for s in stages}) > 1,
                split_nodes=tuple(sorted({s.node for s in stages if s.unit != s.node})), depth=len(stages),
                concurrency=ev.concurrency, concurrency_limit=ev.concurrency_limit, micro_batch=ev.micro_batch,
                capacity=ev.capacity, binding=ev.binding, helix_flow=hv,
            ))
        da = sum(c.capacity for c in infos)
    return PlacementResult(
        problem_name=p.name, mode="shared" if chains is None else "chains", objective="helix", units=units,
        chains=tuple(infos), edge_flows=edge_flows(flow), helix_flow=value, depth_aware_capacity=da, bound=None,
        gap=None, incumbent_source=source, solves=(), time_s=time_s, partial_inference=partial, problem=p,
    )


def swarm(p: PlacementProblem, *, partial: bool = False) -> PlacementResult:
    t0 = time.perf_counter()
    units, _ = heuristics.swarm(p, group_tables(p, split=False), partial)
    return evaluate_placement(p, units, partial=partial, source="swarm", time_s=time.perf_counter() - t0)


def petals(p: PlacementProblem, *, partial: bool = False) -> PlacementResult:
    t0 = time.perf_counter()
    units, _ = heuristics.petals(p, group_tables(p, split=False), partial)
    return evaluate_placement(p, units, partial=partial, source="petals", time_s=time.perf_counter() - t0)


def separate_pipelines(p: PlacementProblem) -> PlacementResult:
    """Each group forms its own chains at its native TP (groups that cannot hold L stay idle)."""
    t0 = time.perf_counter()
    units, chains = heuristics.separate_pipelines(p, group_tables(p, split=False))
    return evaluate_placement(p, units, chains=chains, source="separate-pipelines", time_s=time.perf_counter() - t0)
