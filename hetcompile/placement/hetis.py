"""Hetis primary-worker selection (seed 001, §4.1 "Primary Worker Parallelism", the Parallelizer).

Hetis keeps a GPU in a serving instance's dense computation (a *primary worker*) only if it pulls
its weight; the others become Attention workers (§4.2), which vLLM 0.33 cannot run (hetcompile
reports what they would add: placement/attention.py). This module is the search, on plain
numbers; passes/place_hetis.py applies it to the placed chains.

Notation (per serving instance, a *group*):
    t = 1..T   GPU types, ordered by compute power (FLOP/s), lowest end first
    N_t        units of type t in the group; a unit is one stage slot of TP GPUs (TP 1: one GPU),
               units of one type are interchangeable
    n_t        units of type t kept as primary workers, 0 <= n_t <= N_t  (n: the count vector)
    c_t        dense seconds per layer per engine step on one unit of type t: perf/stepmodel's
               roofline without its attention terms (w + f x tokens), i.e. what §4.1 calls the
               dense-module cost (QKV/O projections and MLP)
    m_t        layers one unit can hold with KV for one max-length sequence (the KV filter:
               "configurations without sufficient KV cache spaces ... are filtered out")
    L          decoder layers;  l_t layers on type t's unified stage, sum_t l_t = L, l_t <= n_t m_t
    C(n)       = min_l max_t l_t c_t / n_t   dense cost (§4.1: GPUs of one type form a unified
               pipeline stage, layers mapped to minimise the maximum stage cost under perfect
               latency scaling, communication ignored); +inf when sum_t n_t m_t < L
    delta      the selection threshold (§4.1, 0.05 by default; spec `placement.delta`)

Stage mapping. C(n) is the L-th smallest value of the multiset {j c_t / n_t : 1 <= j <= n_t m_t}:
the cost of one more layer on stage t is increasing in l_t, so min-max water-filling picks the L
cheapest increments (exact; the brute-force tests enumerate every split to check it).

Removal criterion (§4.1; the paper's equation did not survive text extraction, this is its
wording: GPUs are removed "while removing them raises the dense cost by less than delta"), with
N the group's full count vector:
    (Δ)   C(n) < (1 + delta) C(N)        n is an admissible primary-worker set.
C never rises when a unit is added (more units, cheaper increments), so the admissible sets are
closed upwards and the paper's procedure, lowest-end type first, one unit at a time while (Δ)
still holds after the removal, then the next type, ends at the criterion's exhaustive optimum:
the admissible n with the fewest units of the lowest-end type, then of the next type, and so on
(lexicographic; each type's count is minimised with every later type still at its maximum, which
by upward closure is the best any choice of the later types allows). The brute-force tests check
this against every subset. Measuring against C(N), not against the previous step, bounds what
the kept set loses: removing 1 of 160 GPUs always costs < 5%, and step-relative removals would
compound without limit.

Grouping (§4.1, Fig. 4): for k = 1, 2, ... instances, type t's N_t units are divided evenly (the
first N_t mod k instances get one more); a configuration with an instance that fails the KV
filter is dropped. Each instance is selected as above; the configuration with the highest
sum_i 1 / C_i (dense steps per second over the instances, load balanced by data parallelism)
wins, ties to fewer instances.

TP x PP inside each stage (§4.1, last step): `tp_pp` picks, per unified stage, the TP degree t
dividing n_t (the rest is PP) that minimises the stage's time with the stage-time model's TP
terms. In the compiler's chains the TP is one per replica (vLLM 0.33), so place_hetis.py instead
re-splits the kept units with placement's depth-aware split (placement/chains/splits.py).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEFAULT_DELTA = 0.05


@dataclass(frozen=True)
class UnitType:
    """One GPU type of a group (see the module notation)."""

    name: str
    count: int  # N_t
    cost: float  # c_t, s per layer per step on one unit
    max_layers: int  # m_t
    power: float  # FLOP/s of one unit: orders removal, lowest end first


@dataclass(frozen=True)
class Removal:
    """One unit taken out by (Δ): C before and after."""

    type: str
    before: float
    after: float

    @property
    def raise_(self) -> float:
        """(C(n - e_t) - C(n)) / C(n): what the unit added to the dense cost's inverse."""
        return self.after / self.before - 1.0 if self.before > 0 else math.inf


@dataclass(frozen=True)
class Selection:
    """The primary workers of one group: kept counts n_t per type and the removals, in order."""

    types: tuple[UnitType, ...]
    kept: tuple[int, ...]
    removals: tuple[Removal, ...]
    cost: float  # C(kept)
    full_cost: float  # C(N)
    layers: int  # L

    def removed(self) -> dict[str, int]:
        return {t.name: t.count - k for t, k in zip(self.types, self.kept) if t.count > k}

    def raise_by_type(self) -> dict[str, float]:
        """Per type left out: C(kept) / C(kept + that type's removed units) - 1, i.e. what those
        units together would add to the kept set (the number plan.md quotes)."""
        out = {}
        for i, t in enumerate(self.types):
            if t.count > self.kept[i]:
                back = list(self.kept)
                back[i] = t.count
                with_them = dense_cost(self.types, back, self.layers)
                out[t.name] = self.cost / with_them - 1.0 if with_them > 0 else math.inf
        return out


def dense_cost(types: Sequence[UnitType], counts: Sequence[int], layers: int) -> float:
    """C(n): the L-th smallest of {j c_t / n_t}, +inf when the kept units cannot hold L layers."""
    if sum(n * t.max_layers for t, n in zip(types, counts)) < layers or layers <= 0:
        return math.inf if layers > 0 else 0.0
    # heap of the next increment of each stage; L pops give the L-th smallest
    heap = [(t.cost / n, i, 1) for i, (t, n) in enumerate(zip(types, counts)) if n > 0 and t.max_layers > 0]
    heapq.heapify(heap)
    value = 0.0
    for _ in range(layers):
        value, i, j = heapq.heappop(heap)
        if j < counts[i] * types[i].max_layers:
            heapq.heappush(heap, (types[i].cost * (j + 1) / counts[i], i, j + 1))
    return value


def stage_layers(types: Sequence[UnitType], counts: Sequence[int], layers: int) -> tuple[int, ...]:
    """l_t of the min-max mapping (ties to the lower-cost stage); zeros when infeasible."""
    c = dense_cost(types, counts, layers)
    if not math.isfinite(c):
        return tuple(0 for _ in types)
    ls = [min(n * t.max_layers, math.floor(c * n / t.cost + 1e-9)) if n > 0 else 0 for t, n in zip(types, counts)]
    surplus = sum(ls) - layers
    for i in sorted(range(len(types)), key=lambda i: -types[i].cost / max(counts[i], 1)):
        take = min(surplus, ls[i])
        ls[i] -= take
        surplus -= take
    return tuple(ls)


def select(types: Sequence[UnitType], layers: int, delta: float = DEFAULT_DELTA) -> Selection:
    """The module docstring's removal, lowest-end type first, on one group (N_t = `types[i].count`)."""
    types = tuple(types)
    n = [t.count for t in types]
    full = cur = dense_cost(types, n, layers)
    removals: list[Removal] = []
    if not math.isfinite(full):
        return Selection(types, tuple(n), (), full, full, layers)
    for i in sorted(range(len(types)), key=lambda i: (types[i].power, types[i].name)):
        while n[i] > 0:
            n[i] -= 1
            after = dense_cost(types, n, layers)
            if not after < (1.0 + delta) * full:
                n[i] += 1
                break
            removals.append(Removal(types[i].name, cur, after))
            cur = after
    return Selection(types, tuple(n), tuple(removals), cur, full, layers)


def divide(counts: Sequence[int], k: int) -> list[tuple[int, ...]]:
    """Type counts divided evenly over k instances (the first N_t mod k get one more)."""
    return [tuple(c // k + (1 if i < c % k else 0) for c in counts) for i in range(k)]


@dataclass(frozen=True)
class ClusterSelection:
    """Hetis's Parallelizer over a whole cluster: k instances and each one's selection."""

    instances: tuple[Selection, ...]
    score: float  # sum_i 1 / C_i
    configs_tried: int


def select_cluster(types: Sequence[UnitType], layers: int, delta: float = DEFAULT_DELTA,
                   max_instances: int | None = None) -> ClusterSelection | None:
    """Grouping + stage mapping + (Δ) over every instance count k (module docstring)."""
    types = tuple(types)
    total = sum(t.count for t in types)
    best: ClusterSelection | None = None
    tried = 0
    memo: dict[tuple[int, ...], Selection | None] = {}
    for k in range(1, (max_instances or total) + 1):
        groups = divide([t.count for t in types], k)
        if any(sum(g) == 0 for g in groups):
            break  # more instances than units
        tried += 1
        sels: list[Selection] = []
        for g in groups:
            if g not in memo:  # even division leaves at most two distinct instances per k
                gt = tuple(UnitType(t.name, c, t.cost, t.max_layers, t.power) for t, c in zip(types, g))
                memo[g] = select(gt, layers, delta) if math.isfinite(dense_cost(gt, g, layers)) else None
            sel = memo[g]
            if sel is None:
                break  # KV filter: this configuration is dropped
            sels.append(sel)
        else:
            score = sum(1.0 / s.cost for s in sels)
            if best is None or score > best.score * (1 + 1e-12):
                best = ClusterSelection(tuple(sels), score, tried)
    return None if best is None else ClusterSelection(best.instances, best.score, tried)


def tp_pp(n: int, layers: int, layer_time: Callable[[int], float]) -> tuple[int, int, float]:
    """(TP, PP, stage time) of a unified stage of n GPUs holding `layers` layers: TP t a power of two
    (it must divide the model's attention heads), PP = min(layers, n // t) sub-stages (t x PP <= n:
    GPUs beyond that idle, e.g. an odd n at TP 2), time = ceil(layers / PP) x layer_time(t), the
    slowest sub-stage (layer_time carries the TP terms)."""
    best = (1, min(n, layers), math.inf)
    for t in (2**i for i in range(n.bit_length())):
        pp = min(layers, n // t)
        if pp < 1:
            continue
        time = math.ceil(layers / pp) * layer_time(t)
        if time < best[2] * (1 - 1e-12):
            best = (t, pp, time)
    return best
