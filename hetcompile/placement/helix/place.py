"""`shared` mode: Helix's per-request pipelines (one stage may feed several), for comparison only.

Pipeline (each step reports status / objective / bound / gap / time; time comes from the caller):
  1. incumbents: Swarm, Petals, separate pipelines (exact max flow of each)
  2. bound: capped fixed point, then the per-layer pattern LP (bound.py) from the incumbent up,
     with the forced-crossing certificate when no region alone can hold a pipeline
  3. blocks: price-and-branch between incumbent and bound (blocks.py); where inter-region links
     bind, region segments with fans at the crossings (segments.py)
  4. MILP, warm-started from the best placement and capped by the bound, only while the gap
     exceeds the caller's mip_gap and time is left: the group-count model (milp.py), or,
     where links bind on a small cluster, the node-level model (milp_nodes.py) whose objective is
     the max flow of its placement (the group model's pair rows are only a restriction there)
  5. disaggregation to concrete nodes (+ node swaps where links bind); exact flow by networkx
The reported flow is always the exact max flow of the returned placement; the bound is the
smallest valid one (pattern LP, MILP dual bound); a timeout returns the best incumbent and its gap.

Steps 2-5 stop on work, the same on every machine (budget.py): SHARED_WORK LP/MILP solves and
flow evaluations shared out between the steps, MILP_NODES branch-and-bound nodes per MILP, and
no MILP above MILP_MAX_VARS variables (as chains/place.py). The
caller's time limit is a cap; when the cap ends a step the result says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from hetcompile.opt.solve import SolverOptions, solve
from hetcompile.placement import heuristics
from hetcompile.placement.helix import milp_nodes
from hetcompile.placement.helix.blocks import BlockSearch, realize
from hetcompile.opt.budget import Budget
from hetcompile.placement.helix.bound import Crossing, PatternBound, fixed_point_bound
from hetcompile.placement.evaluate import edge_flows, helix_flow, shared_depth_aware
from hetcompile.placement.helix.extract import improve_assignment, units_from_intervals
from hetcompile.placement.helix.milp import build_model, extract_intervals, shared_tables, warm_start
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.result import Objective, PlacementResult, SolveRecord, StageUnit
from hetcompile.placement.helix.segments import SegmentSearch, realize_segments
from hetcompile.placement.tables import group_tables, network

MILP_NODES = 100  # branch-and-bound nodes of the placement MILP (at most the spec's solver.node_limit)
SHARED_WORK = 4000  # LP/MILP solves and flow evaluations of steps 2-5
MILP_MAX_VARS = 5000  # larger placement MILPs are skipped (reported), not started: on the 192-node Helix
# cluster (11.5k vars) 100 nodes took 16 s for +0.1% flow over blocks


class Incumbent:
    """Best placement so far (exact flow), with where it came from."""

    def __init__(self) -> None:
        self.units: list[StageUnit] = []
        self.value = 0.0
        self.source = "none"

    def offer(self, units: list[StageUnit], value: float, source: str) -> bool:
        if value > self.value * (1 + 1e-9) or (not self.units and units):
            self.units, self.value, self.source = list(units), value, source
            return True
        return False


def representative_pair_caps(p: PlacementProblem, net) -> dict[tuple[str, str], float]:
    """Median node-pair capacity per binding region pair: what a crossing can count on per pair."""
    by_region: dict[str, list[str]] = {}
    for g in p.groups:
        by_region.setdefault(g.region, []).extend(g.ids)
    out = {}
    for (r, s) in net.binding:
        caps = sorted(p.edge_capacity(a, b) for a in by_region[r] for b in by_region[s] if a != b)
        out[r, s] = caps[len(caps) // 2]
    return out


def forced_crossing(tables, net, L: int) -> Crossing | None:
    """Every path crosses regions when no region alone holds L layers (bound.py, item 3)."""
    cross = [c for (r, s), c in net.cap_max.items() if r != s]
    if not cross or any(sum(t.count * t.kmax for t in tables if t.region == r) >= L for r in net.regions):
        return None
    return Crossing(pair_cap=max(cross))


def _gap(value: float, bound: float | None) -> float | None:
    if bound is None or value <= 0:
        return None
    return max(0.0, bound - value) / value


def place_shared(p: PlacementProblem, options: SolverOptions, *, partial: bool = False,
                 objective: Objective = "helix") -> PlacementResult:
    """Helix's shared per-request pipelines: heuristics, bounds, block and segment searches, then
    the MILP, each on a share of one work budget, until the incumbent meets the bound."""
    s = _SharedSearch(p, options, partial)
    s.heuristics()
    s.bounds()
    if s.open_gap():
        s.blocks()
    if s.net.binding and s.open_gap():
        s.segments()
    if s.open_gap() and not s.work.timed_out:
        s.milp()
    return s.result(objective)


class _SharedSearch:
    """The state place_shared's stages share: incumbent, bound, solve log and the work budget."""

    def __init__(self, p: PlacementProblem, options: SolverOptions, partial: bool):
        self.t0 = time.perf_counter()
        reserve = min(3.0, 0.05 * float(options.time_limit_s))  # final flow, paths and depth-aware evaluation
        self.work = Budget(SHARED_WORK, deadline=self.t0 + float(options.time_limit_s) - reserve)
        self.p, self.options, self.partial = p, options, partial
        self.L = p.num_layers
        self.tables = group_tables(p, split=False)
        self.net = network(p)
        self.inc = Incumbent()
        self.solves: list[SolveRecord] = []
        self.bound = math.inf
        self.milp_timed_out = False

    def record(self, name: str, status: str, obj: float | None, bnd: float | None, t: float) -> None:
        self.solves.append(SolveRecord(name, status, obj, bnd, _gap(obj or 0.0, bnd), t))
        if self.options.status is not None:
            b = None if math.isinf(self.bound) else self.bound
            gap = _gap(self.inc.value, b)
            self.options.tell(f"{self.p.name} shared: {name} done, incumbent {self.inc.value:.6g}"
                              + (f", bound {b:.6g}" if b is not None else "") + (f", gap {100 * gap:.3g}%" if gap is not None else ""))

    def open_gap(self) -> bool:
        g = _gap(self.inc.value, self.bound)
        return g is None or g > self.options.mip_gap

    def step(self, fraction: float, fn):
        """Run fn(child budget) on `fraction` of the work left; the child's use is charged back."""
        part = self.work.share(fraction)
        try:
            return fn(part)
        finally:
            self.work.absorb(part)

    def polish(self, units: list[StageUnit], fraction: float) -> tuple[list[StageUnit], float]:
        return self.step(fraction, lambda part: improve_assignment(self.p, units, part, partial=self.partial))

    def heuristics(self) -> None:
        """Swarm, Petals and separate pipelines: the incumbents every search starts from."""
        p, partial = self.p, self.partial
        for name, fn in (("swarm", heuristics.swarm), ("petals", heuristics.petals)):
            ts = time.perf_counter()
            units, val = fn(p, self.tables, partial)
            self.inc.offer(units, val, name)
            self.record(name, "feasible" if val > 0 else "no-solution", val, None, time.perf_counter() - ts)
        ts = time.perf_counter()
        units, _ = heuristics.separate_pipelines(p, self.tables)
        val, _ = helix_flow(p, units, partial=partial)
        self.inc.offer(units, val, "separate-pipelines")
        self.record("separate-pipelines", "feasible" if val > 0 else "no-solution", val, None, time.perf_counter() - ts)

    def bounds(self) -> None:
        """The fixed-point bound capped by the coordinator's links, then the pattern bound if the gap is open."""
        tables, net, L = self.tables, self.net, self.L
        ts = time.perf_counter()
        coord = min(sum(net.src_cap.get(t.gi, 0.0) * t.count for t in tables),
                    sum(net.snk_cap.get(t.gi, 0.0) * t.count for t in tables))
        self.bound = min(fixed_point_bound(tables, L), coord)
        self.record("fixed-point-bound", "bound", None, self.bound, time.perf_counter() - ts)
        if self.open_gap():
            pb = self.step(0.3, lambda part: PatternBound(tables, L, forced_crossing(tables, net, L)).bound(
                self.inc.value, self.bound, part, rel_tol=max(1e-6, min(2e-4, self.options.mip_gap / 10))))
            self.bound = min(self.bound, pb.value)
            self.record("pattern-bound", "bound", None, self.bound, pb.time_s)

    def blocks(self) -> None:
        p, tables = self.p, self.tables
        ts = time.perf_counter()
        sol = self.step(0.5, lambda part: BlockSearch(tables, self.L).search(
            self.inc.value, self.bound, part, rel_tol=max(self.options.mip_gap / 4, 1e-4)))
        if sol is not None:
            ids = [list(p.groups[t.gi].ids) for t in tables]
            units = list(realize(tables, sol, ids))
            val, _ = helix_flow(p, units, partial=self.partial)
            if self.net.binding:
                units, val = self.polish(units, 0.2)
            self.inc.offer(units, val, "blocks")
        self.record("blocks", "feasible" if sol else "no-solution", sol.flow_target if sol else None, self.bound,
                    time.perf_counter() - ts)

    def segments(self) -> None:
        p, tables = self.p, self.tables
        ts = time.perf_counter()
        seg = self.step(0.5, lambda part: SegmentSearch(tables, self.L, representative_pair_caps(p, self.net)).search(
            self.inc.value, self.bound, part, rel_tol=max(self.options.mip_gap / 4, 1e-4)))
        if seg is not None:
            units = realize_segments(tables, seg, [list(p.groups[t.gi].ids) for t in tables])
            units, val = self.polish(units, 0.2)
            self.inc.offer(units, val, "segments")
        self.record("segments", "feasible" if seg else "no-solution", seg.flow_target if seg else None, self.bound,
                    time.perf_counter() - ts)

    def milp(self) -> None:
        """The MILP warm-started from the incumbent: per node pair when links bind on a small
        cluster (its objective is the max flow), else the group model."""
        p, tables, net, partial, options = self.p, self.tables, self.net, self.partial, self.options
        exact_nodes = bool(net.binding) and not partial and milp_nodes.pair_vars(p) <= milp_nodes.MAX_PAIR_VARS
        ts = time.perf_counter()
        val, flow = helix_flow(p, self.inc.units, partial=partial)
        if exact_nodes:
            nt = milp_nodes.node_tables(p, tables, self.bound)
            m = milp_nodes.build_model(nt)
            warm = milp_nodes.warm_start(m, nt, self.inc.units, flow, val)
            name = "place-shared-nodes-milp"
        else:
            st = shared_tables(tables, net, self.L, self.bound, partial)
            m = build_model(st)
            warm_start(m, st, self.inc.units, flow, val)
            warm, name = True, "place-shared-milp"
        build_s = time.perf_counter() - ts
        if m.nvariables() > MILP_MAX_VARS:
            self.record(name, "skipped", None, None, build_s)
            return
        opts = replace(options, time_limit_s=self.work.seconds_left(), node_limit=min(options.node_limit or MILP_NODES, MILP_NODES))
        res = solve(m, opts, name=name, warm_start=warm)
        if res.has_solution:
            if exact_nodes:
                units = milp_nodes.extract_units(m, nt, tables)
                v, _ = helix_flow(p, units, partial=partial)
            else:
                units = units_from_intervals(p, tables, extract_intervals(m, st))
                v, _ = helix_flow(p, units, partial=partial)
                if net.binding:
                    units, v = self.polish(units, 1.0)
            self.inc.offer(units, v, "milp")
        if res.bound is not None and (exact_nodes or not net.binding):  # the group model is a restriction where links bind
            self.bound = min(self.bound, res.bound)
        self.solves.append(SolveRecord(res.name, res.status, res.objective, res.bound, res.gap, res.time_s + build_s))
        self.milp_timed_out = res.limit == "time"

    def result(self, objective: Objective) -> PlacementResult:
        p, work = self.p, self.work
        capped = work.timed_out or self.milp_timed_out
        val, flow = helix_flow(p, self.inc.units, partial=self.partial)
        da = shared_depth_aware(p, self.inc.units, self.partial)
        bound = max(self.bound, val)  # round-off: never report a bound below the flow verified
        return PlacementResult(
            problem_name=p.name, mode="shared", objective=objective,
            units=tuple(sorted(self.inc.units, key=lambda u: (u.start, u.unit))),
            chains=(), edge_flows=edge_flows(flow), helix_flow=val, depth_aware_capacity=da, bound=bound,
            gap=_gap(val, bound), incumbent_source=self.inc.source, solves=tuple(self.solves),
            time_s=time.perf_counter() - self.t0, partial_inference=self.partial, problem=p, machine_dependent=capped,
            notes=(f"work: {work.spent} of {work.work} solves and flow evaluations",) + (
                ("stopped by the wall-clock cap before its work budget: this placement may differ on a faster or "
                 "slower machine",) if capped else ()),
        )
