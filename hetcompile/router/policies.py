"""Replica-choice policies: the pure math, and one small stateful picker per policy.

Notation (Helix §5.1-§5.2; seed 004 §4, eq. 5-8 and Alg. 2):

  s          a replica (004's "instance"; a first-stage compute node in Helix)
  w_s        plan weight of s for the request's workload class (Helix: the max-flow over the
             edge coordinator -> s; the route pass normalizes them to sum to 1)
  I_r, Õ_r   prompt tokens and predicted output tokens of request r (see classify.py)
  KV_s       KV capacity of s in tokens (`kv_capacity_tokens`, min over its stages)
  kv_s       estimated KV tokens of the unfinished requests the router sent to s
             (004's instRunningReqLen: sum of I_r + Õ_r, released when r completes)
  u_s        kvusage(s): fraction of KV_s in use, kv_s / KV_s corrected by vLLM's
             `vllm:kv_cache_usage_perc` (see `state.corrected_kv_usage`)
  T_r^s      processing time of r on s at full batch: I_r / prefill_s + Õ_r / decode_s
  θ          004's exponent (θ = 2 in its evaluation)
  L_s        004's instLoads[s]: sum of the workloads w_r^s of the unfinished requests on s

Policies (a picker per workload class; every picker only sees the replicas the plan gave the
class a positive weight, that have an endpoint, that are healthy and not excluded by a retry;
when health checks have ejected every such replica, all deployed ones are candidates again,
"panic mode"; a new request (`bounded`) sees only those below their admission bound, see
state.py). A class's candidates may include disaggregated groups, which show a picker the face of
a replica (disagg.py: `GroupState`); a group's own prefill and decode pickers choose among its
members with the table's policy:

- weighted: smooth weighted round robin (nginx's "smooth WRR", an interleaved WRR: every
  replica gets its share w_s of each window of picks, spread out, never in bursts; Helix §5.1).
- kv-aware: Helix §5.2. Mask out every replica whose KV would pass the high-water mark with
  this request (u_s + (I_r + Õ_r)/KV_s > hwm, hwm = 0.95 by default, as vLLM starts preempting
  at 1), or whose vLLM reported waiting requests at the last poll with no completion since;
  run the weighted WRR over the rest. When every replica is masked, send to the one with the
  lowest u_s (vLLM queues it) rather than refuse.
- min-max: 004 Alg. 2. w_r^s = T_r^s · exp(θ · u_s); choose c = argmin_s max(L_1..L_s+w_r^s..L_n);
  L_c += w_r^c, released when r completes. (Alg. 2 line 8 starts minGlobalLoad at 0, which would
  never be beaten; it means +inf.)
- round-robin: the next routable replica in a fixed order (baseline).
- least-outstanding: fewest router-side in-flight requests, ties rotate (baseline).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from hetcompile.router.disagg import GroupState
    from hetcompile.router.state import ReplicaState

    # what a picker chooses among: replicas, and for a class also disaggregated groups (disagg.py)
    Candidate: TypeAlias = "ReplicaState | GroupState"

# exp(θ·u) overflows a float near 709; clamp the exponent, the ordering it encodes is long settled
_MAX_EXPONENT = 60.0


# ---------------------------------------------------------------------------------------------
# pure math


class SmoothWRR:
    """Smooth (interleaved) weighted round robin over a fixed list of weights.

    Each pick adds w_i to the current value c_i of every eligible i, picks the largest c_i
    (first on ties) and subtracts the eligible total from it. Over any window of sum(w)
    picks (integer weights) each i is picked exactly w_i times, spread evenly. An ineligible
    i keeps its c_i frozen, so it resumes its share when it comes back.
    """

    __slots__ = ("weights", "current")

    def __init__(self, weights: Sequence[float]):
        self.weights = [float(w) for w in weights]
        self.current = [0.0] * len(self.weights)

    def pick(self, eligible: Iterable[int]) -> int | None:
        w = self.weights
        cur = self.current
        best = -1
        best_c = -math.inf
        total = 0.0
        for i in eligible:
            c = cur[i] + w[i]
            cur[i] = c
            total += w[i]
            if c > best_c:
                best_c = c
                best = i
        if best < 0:
            return None
        cur[best] -= total
        return best



def kv_masked(usage: float, request_tokens: float, capacity: float, high_water: float, blocked: bool) -> bool:
    """Helix §5.2 mask: this request would push s past the high-water mark, or vLLM is queueing."""
    return blocked or usage + request_tokens / capacity > high_water


def processing_time(prompt_tokens: float, output_tokens: float, prefill_tps: float, decode_tps: float) -> float:
    """T_r^s = I_r / prefill_s + Õ_r / decode_s (004 eq. 6 with the plan's full-batch throughputs)."""
    return prompt_tokens / prefill_tps + output_tokens / decode_tps


def workload(t: float, usage: float, theta: float) -> float:
    """w_r^s = T_r^s · exp(θ · kvusage(s)) (004 eq. 7)."""
    return t * math.exp(min(theta * usage, _MAX_EXPONENT))


def minmax_choose(loads: Sequence[float], costs: Sequence[float]) -> int:
    """004 Alg. 2 mapper: argmin_s max(L_1, .., L_s + w_s, .., L_n).

    Ties go to the smaller L_s + w_s, then to the lower index. O(n) with the two largest loads.
    """
    n = len(loads)
    if n == 0:
        raise ValueError("minmax_choose needs at least one replica")
    # the largest load other than s's own: top1 unless s holds it, then top2
    top1 = top2 = -math.inf
    arg1 = -1
    for i, x in enumerate(loads):
        if x > top1:
            top2, top1, arg1 = top1, x, i
        elif x > top2:
            top2 = x
    best = 0
    best_key = (math.inf, math.inf)
    for s in range(n):
        mine = loads[s] + costs[s]
        others = top2 if s == arg1 else top1
        key = (max(others, mine), mine)
        if key < best_key:
            best_key = key
            best = s
    return best


# ---------------------------------------------------------------------------------------------
# pickers: one per workload class, over that class's candidate replicas


Choice = tuple["Candidate", float, bool]
"""(replica or group, L cost to add for min-max (0 otherwise), whether the kv mask overflowed)."""


class Picker:
    """Chooses a replica for a request among a class's candidates (plan weight > 0)."""

    name = ""

    __slots__ = ("replicas", "weights")

    def __init__(self, replicas: Sequence["Candidate"], weights: Sequence[float], **_: float):
        self.replicas = tuple(replicas)
        self.weights = tuple(weights)

    def eligible(self, exclude: Sequence["Candidate"] | None, bounded: bool = False) -> list[int]:
        """Indexes of the replicas this request may go to; `bounded` keeps only those below their
        admission bound (an empty answer then means every candidate is full: 429)."""
        reps = self.replicas
        n = len(reps)
        if exclude:
            el = [i for i in range(n) if reps[i].routable and reps[i] not in exclude]
        else:
            el = [i for i in range(n) if reps[i].routable]
        if not el:
            # panic mode (Envoy's panic threshold at its extreme): when every deployed candidate
            # is ejected, health checks are more likely wrong (overload, a network blip) than
            # every replica dead, so try them all rather than refuse; a dead one fails over
            el = [i for i in range(n) if reps[i].endpoint is not None and not (exclude and reps[i] in exclude)]
        if bounded:
            # fullness never sends a request to an ejected replica: it is checked after panic mode
            return [i for i in el if reps[i].has_room()]
        return el

    def choose(
        self, kv_tokens: float, prompt_tokens: float, output_tokens: float, exclude: Sequence["Candidate"] | None,
        bounded: bool = False,
    ) -> Choice | None:
        raise NotImplementedError


class WeightedPicker(Picker):
    name = "weighted"
    __slots__ = ("wrr",)

    def __init__(self, replicas, weights, **_):
        super().__init__(replicas, weights)
        self.wrr = SmoothWRR(self.weights)

    def choose(self, kv_tokens, prompt_tokens, output_tokens, exclude, bounded=False):
        i = self.wrr.pick(self.eligible(exclude, bounded))
        return None if i is None else (self.replicas[i], 0.0, False)


class KvAwarePicker(Picker):
    name = "kv-aware"
    __slots__ = ("wrr", "high_water")

    def __init__(self, replicas, weights, *, high_water: float = 0.95, **_):
        super().__init__(replicas, weights)
        self.wrr = SmoothWRR(self.weights)
        self.high_water = high_water

    def choose(self, kv_tokens, prompt_tokens, output_tokens, exclude, bounded=False):
        el = self.eligible(exclude, bounded)
        if not el:
            return None
        reps = self.replicas
        hw = self.high_water
        open_ = [
            i
            for i in el
            if not kv_masked(reps[i].kv_usage(), kv_tokens, reps[i].kv_capacity, hw, reps[i].blocked())
        ]
        if open_:
            i = self.wrr.pick(open_)
            return reps[i], 0.0, False
        # every candidate is full: the least used one queues it (Helix would hold it at the
        # coordinator; vLLM's own waiting queue does that job without a second queue here)
        i = min(el, key=lambda j: reps[j].kv_usage())
        return reps[i], 0.0, True


class MinMaxPicker(Picker):
    name = "min-max"
    __slots__ = ("theta",)

    def __init__(self, replicas, weights, *, theta: float = 2.0, **_):
        super().__init__(replicas, weights)
        self.theta = theta

    def choose(self, kv_tokens, prompt_tokens, output_tokens, exclude, bounded=False):
        el = self.eligible(exclude, bounded)
        if not el:
            return None
        reps = [self.replicas[i] for i in el]
        costs = [
            workload(processing_time(prompt_tokens, output_tokens, r.prefill_tps, r.decode_tps), r.kv_usage(), self.theta)
            for r in reps
        ]
        j = minmax_choose([r.load for r in reps], costs)
        return reps[j], costs[j], False


class RoundRobinPicker(Picker):
    name = "round-robin"
    __slots__ = ("next",)

    def __init__(self, replicas, weights, **_):
        super().__init__(replicas, weights)
        self.next = 0

    def choose(self, kv_tokens, prompt_tokens, output_tokens, exclude, bounded=False):
        el = self.eligible(exclude, bounded)
        if not el:
            return None
        # the first eligible index at or after the cursor, wrapping around
        i = next((j for j in el if j >= self.next), el[0])
        self.next = i + 1
        return self.replicas[i], 0.0, False


class LeastOutstandingPicker(Picker):
    name = "least-outstanding"
    __slots__ = ("next",)

    def __init__(self, replicas, weights, **_):
        super().__init__(replicas, weights)
        self.next = 0

    def choose(self, kv_tokens, prompt_tokens, output_tokens, exclude, bounded=False):
        el = self.eligible(exclude, bounded)
        if not el:
            return None
        reps = self.replicas
        # ties go to the first eligible at or after a rotating cursor, so they spread out
        k = next((p for p, j in enumerate(el) if j >= self.next), 0)
        order = el[k:] + el[:k]
        best = min(order, key=lambda j: reps[j].inflight)
        self.next = (self.next + 1) % len(reps)
        return reps[best], 0.0, False


PICKERS: dict[str, type[Picker]] = {
    p.name: p for p in (WeightedPicker, KvAwarePicker, MinMaxPicker, RoundRobinPicker, LeastOutstandingPicker)
}


def make_picker(policy: str, replicas: Sequence["Candidate"], weights: Sequence[float], *, high_water: float, theta: float) -> Picker:
    """The picker for `policy` over a class's candidates."""
    try:
        cls = PICKERS[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(PICKERS)}") from None
    return cls(replicas, weights, high_water=high_water, theta=theta)
