"""Pure tables the placement solvers share: capacities per group, network classes, chain splits.

Nothing here solves anything. Notation (used by every module of the package):

    L              layers of the model;  l = 1..L-1 a layer boundary, 0 / L the coordinator
    g in G         node group (one GPU type, region, profile set); N_g nodes
    T_g(k)         tokens/s of one node of g holding k layers (native TP);  k <= K_g = max layers
    r in R         region;  cap_rs = max over node pairs of region r -> s of bandwidth / activation
    src_g, snk_g   coordinator link capacity of the best node of g (tokens/s)
    T*_g(l, m)     best bottleneck capacity of a *branch*: m nodes of g in series covering l layers
    A pair of regions (r, s) is *binding* when some node pair between them has a link slower than
    the largest T_g(1) of the groups it joins; otherwise any flow that conserves at a boundary can
    be routed over the complete bipartite graph (each arc carries at most min(supply, demand)),
    and the network drops out of the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hetcompile.placement.problem import SINK, SOURCE, PlacementProblem, StageProfile


def interp(table: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear interpolation, linear extrapolation past the last two points."""
    xs = [p[0] for p in table]
    ys = [p[1] for p in table]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]
        return y1 + (y1 - y0) * (x - x1) / (x1 - x0) if x1 > x0 else y1
    j = int(np.searchsorted(xs, x))
    x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class GroupTable:
    """One group at one TP: the numbers the MILPs read."""

    gi: int
    tp: int
    units_per_node: int  # stages a node provides at this TP (G / tp)
    region: str
    gpu: str
    count: int
    T: tuple[float, ...]
    profile: StageProfile

    @property
    def kmax(self) -> int:
        return len(self.T)


@dataclass(frozen=True)
class Network:
    """Region-level view of the links, in tokens/s (activations) / tokens/s (coordinator)."""

    regions: tuple[str, ...]
    cap_max: dict[tuple[str, str], float]  # best node pair r -> s
    cap_min: dict[tuple[str, str], float]  # worst node pair r -> s
    binding: frozenset[tuple[str, str]]  # ordered region pairs whose links may bind
    src_cap: dict[int, float]  # group -> best source -> node capacity
    snk_cap: dict[int, float]


def group_tables(p: PlacementProblem, *, split: bool) -> tuple[GroupTable, ...]:
    """Native profiles only (Helix semantics), or every TP a group offers (`split`)."""
    out = []
    for gi, g in enumerate(p.groups):
        for prof in sorted(g.profiles, key=lambda q: -q.tp):
            if not split and prof.tp != g.gpus_per_node:
                continue
            out.append(
                GroupTable(
                    gi=gi, tp=prof.tp, units_per_node=g.gpus_per_node // prof.tp, region=g.region, gpu=g.gpu,
                    count=g.count, T=tuple(float(t) for t in prof.throughput), profile=prof,
                )
            )
    return tuple(out)


def network(p: PlacementProblem) -> Network:
    regions = tuple(sorted({g.region for g in p.groups}))
    ids_by_region = {r: [i for g in p.groups if g.region == r for i in g.ids] for r in regions}
    tmax = {r: max((g.native.T(1) for g in p.groups if g.region == r), default=0.0) for r in regions}
    cmax: dict[tuple[str, str], float] = {}
    cmin: dict[tuple[str, str], float] = {}
    binding = set()
    for r in regions:
        for s in regions:
            caps = [p.edge_capacity(u, v) for u in ids_by_region[r] for v in ids_by_region[s] if u != v]
            if not caps:
                continue
            cmax[r, s], cmin[r, s] = max(caps), min(caps)
            if cmin[r, s] < max(tmax[r], tmax[s]):
                binding.add((r, s))
    # the strongest node of the group: the models using these are relaxations (exact flow later)
    src = {gi: max(p.edge_capacity(SOURCE, i) for i in g.ids) for gi, g in enumerate(p.groups) if g.count}
    snk = {gi: max(p.edge_capacity(i, SINK) for i in g.ids) for gi, g in enumerate(p.groups) if g.count}
    return Network(regions, cmax, cmin, frozenset(binding), src, snk)


def best_split(T: tuple[float, ...], layers: int, m: int) -> tuple[float, tuple[int, ...]]:
    """T*(l, m): split `layers` over m nodes in series maximizing the smallest T(k_j)."""
    return _best_split(tuple(T), layers, m)


@lru_cache(maxsize=200_000)
def _best_split(T: tuple[float, ...], layers: int, m: int) -> tuple[float, tuple[int, ...]]:
    K = len(T)
    if m < 1 or layers < m or layers > m * K:
        return 0.0, ()
    if m == 1:
        return T[layers - 1], (layers,)
    best = 0.0
    arg: tuple[int, ...] = ()
    for k in range(1, min(K, layers - m + 1) + 1):
        if T[k - 1] <= best:
            continue
        rest, split = _best_split(T, layers - k, m - 1)
        val = min(T[k - 1], rest)
        if val > best:
            best, arg = val, (k,) + split
    return best, arg


def layers_at_level(T: tuple[float, ...], theta: float) -> tuple[int, ...]:
    """Layer counts k with T(k) >= theta (not an interval when T is not monotone)."""
    return tuple(k for k in range(1, len(T) + 1) if T[k - 1] >= theta - 1e-9)


def node_pair_cap(p: PlacementProblem, u: str, v: str) -> float:
    """Capacity u -> v in tokens/s; two stage units of one machine are joined at no cost."""
    hu, hv = host(u), host(v)
    if hu == hv and u not in (SOURCE, SINK):
        return math.inf
    return p.edge_capacity(hu, hv)


def host(unit: str) -> str:
    """The machine a stage unit lives on: units of split nodes are `<node>#<j>`."""
    return unit.split("#", 1)[0]
