"""Layer splits of one chain: Helix's bottleneck split and the depth-aware split.

A chain is an ordered list of stage *slots* (node, group, TP, slice). Both optimizers choose
k_i >= 1 with sum k_i = L and k_i <= K_i.

- `helix_split`: maximize min_i T_i(k_i) (DP over stages and layers; exact for any T).
- `depth_split`: maximize the depth-aware capacity of evaluate.py. For a concurrency candidate c
  (every value min(max_num_seqs, KV_i(k) / (k s)) is a breakpoint) each stage may hold at most
  kcap_i(c) layers (KV keeps c requests); with b = c / d the per-layer step time tau_i(b) (the
  stage's LayerCost at perf/capacity.fluid_batch(b)) is fixed, so the slowest stage is minimized by
  water-filling: the smallest t with sum_i min(kcap_i, floor((t - o) / tau_i)) >= L, o = the
  step's host work / d on every stage. Then cap(c) = (1 + I/O) X with X from
  perf/capacity.fluid_rate; the best c wins. Surplus layers come off the slowest stages. The last
  stage's step carries its lm_head read and the step's other GPU work g (head_s + g, as the step
  model's stage times do): the water level there is t - head, so a last stage on a slow GPU gets
  fewer layers, and the split's value is the fast mode of the chain it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from hetcompile.perf.capacity import fluid_batch, fluid_rate
from hetcompile.perf.stepmodel import Hop, LayerCost, hops_seconds, step_seconds
from hetcompile.placement.chain_model import hop, layer_cost
from hetcompile.placement.problem import PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit


@dataclass(frozen=True)
class Slot:
    """One stage of a chain before its layers are known."""

    node: str
    gi: int
    tp: int
    slice: int  # index of the TP slice on the node (0 for a whole node)
    native: bool

    @cached_property  # a chain's memo key is its slots' units: read ~100 times per slot in a search
    def unit(self) -> str:
        return self.node if self.native else f"{self.node}#{self.slice}"

    def stage(self, start: int, end: int) -> StageUnit:
        gpus = tuple(range(self.slice * self.tp, (self.slice + 1) * self.tp))
        return StageUnit(self.unit, self.node, self.gi, self.tp, gpus, start, end)


def profile(p: PlacementProblem, s: Slot) -> StageProfile:
    return p.groups[s.gi].profile(s.tp)


def stages_from_split(slots: list[Slot], ks: list[int]) -> list[StageUnit]:
    out, a = [], 0
    for s, k in zip(slots, ks):
        out.append(s.stage(a, a + k))
        a += k
    return out


def helix_split(p: PlacementProblem, slots: list[Slot]) -> tuple[float, list[int]]:
    """(min T, layer counts) maximizing the chain's bottleneck T; (0, []) if L does not fit."""
    Ts = tuple(tuple(profile(p, s).throughput) for s in slots)
    return _helix_split(Ts, p.num_layers)


@lru_cache(maxsize=50_000)
def _helix_split(Ts: tuple[tuple[float, ...], ...], L: int) -> tuple[float, list[int]]:
    d = len(Ts)
    if d == 0 or d > L or sum(len(T) for T in Ts) < L:
        return 0.0, []
    NEG = -1.0
    f = [[NEG] * (L + 1) for _ in range(d + 1)]
    arg = [[0] * (L + 1) for _ in range(d + 1)]
    f[0][0] = math.inf
    for i, T in enumerate(Ts, 1):
        for ell in range(i, L + 1):
            best, bk = NEG, 0
            for k in range(1, min(len(T), ell) + 1):
                prev = f[i - 1][ell - k]
                if prev < 0:
                    continue
                val = min(prev, T[k - 1])
                if val > best:
                    best, bk = val, k
            f[i][ell], arg[i][ell] = best, bk
    if f[d][L] <= 0:
        return 0.0, []
    ks, ell = [], L
    for i in range(d, 0, -1):
        ks.append(arg[i][ell])
        ell -= arg[i][ell]
    return float(f[d][L]), ks[::-1]


def _hops(p: PlacementProblem, slots: list[Slot]) -> list[Hop]:
    """The chain's links between consecutive slots (chain_model.py's hops; same host: none)."""
    return [hop(p, a.unit, b.unit) for a, b in zip(slots, slots[1:])]


@dataclass(frozen=True)
class _SlotData:
    """What depth_split reads of a (group, TP) slot, computed once per problem: its profile, layer
    cost, most layers K, concurrency table (sequences a stage of 1..K layers can hold:
    min(max_concurrency, KV token-layers of k layers / (k x context))), whether that table is
    decreasing in k, and its value where it is flat (every layer count holds max_concurrency: the
    KV cache never binds; None otherwise)."""

    prof: StageProfile
    cost: LayerCost
    K: int
    conc: np.ndarray
    decreasing: bool
    flat: float | None


def _slot_data(p: PlacementProblem, s: Slot) -> _SlotData:
    key = ("slot data", s.gi, s.tp)
    found = p.memo.get(key)
    if found is None:
        pr, m = profile(p, s), p.model
        mc = float(m.max_concurrency) if m.max_concurrency is not None else math.inf
        cc = np.minimum(mc, np.array(pr.kv_token_layers) / (np.arange(1, pr.max_layers + 1) * m.context_tokens))
        decreasing = bool(np.all(cc[1:] <= cc[:-1]))
        flat = float(cc[0]) if len(cc) and decreasing and cc[-1] == cc[0] else None
        found = p.memo[key] = _SlotData(pr, layer_cost(pr, m.context_tokens), pr.max_layers, cc, decreasing, flat)
    return found


def _candidates(data: list[_SlotData]) -> tuple[np.ndarray, np.ndarray]:
    """(concurrency candidates c, descending; kcap per candidate and stage): every value of the
    stages' concurrency tables, and per stage how many layer counts keep its concurrency at c or
    more. Where every table is flat at one value (the KV cache binds nowhere), that value alone,
    with kcap = K: what the general computation gives then, without its arrays."""
    flats = {x.flat for x in data}
    c = flats.pop() if len(flats) == 1 else None
    if c is not None and c > 0:
        return np.array([c]), np.array([[x.K for x in data]])
    conc = [x.conc for x in data]
    every = np.unique(np.concatenate(conc))  # ascending, each value once
    cands = every[every > 0][::-1]
    # kcap per candidate c and stage: how many layer counts keep that stage's concurrency at c or more
    # (conc is decreasing in k: a binary search of -conc; a count where a table is not monotone)
    thresholds = cands * (1 - 1e-12)
    kcaps = np.stack([np.searchsorted(-x.conc, -thresholds, side="right") if x.decreasing
                      else (x.conc[None, :] >= thresholds[:, None]).sum(axis=1) for x in data], axis=1)
    return cands, kcaps


def _taus(p: PlacementProblem, slots: list[Slot], costs: list[LayerCost], c: float, n: float, S: float,
          A: float) -> list[float]:
    """Each slot's per-layer step time at the fluid batch (n, S, A) of concurrency c over the chain's
    depth, remembered per (group, TP, c, depth): the search values thousands of chains that share
    their slots' kinds and depth."""
    out = []
    for s, cost in zip(slots, costs):
        key = ("tau", s.gi, s.tp, c, len(slots))
        t = p.memo.get(key)
        if t is None:
            t = p.memo[key] = cost.time(n, S, A)
        out.append(t)
    return out


def depth_split(p: PlacementProblem, slots: list[Slot]) -> tuple[float, list[int]]:
    """(depth-aware tokens/s, layer counts) of the best split; (0, []) if L does not fit."""
    L = p.num_layers
    d = len(slots)
    data = [_slot_data(p, s) for s in slots]
    if d == 0 or d > L or sum(x.K for x in data) < L:
        return 0.0, []
    m = p.model
    profs = [x.prof for x in data]
    cands, kcaps = _candidates(data)
    usable = (kcaps.min(axis=1) >= 1) & (kcaps.sum(axis=1) >= L)
    ratio = m.input_tokens / m.output_tokens
    costs = [x.cost for x in data]
    links = _hops(p, slots)
    # the GPU work a stage does once per step besides its layers: the last stage reads the lm_head
    # and does the step's other GPU work g (perf/stepmodel.StageModel.time, ReplicaModel.stage_terms)
    head = np.zeros(d)
    head[-1] = profs[-1].head_s + m.step_gpu_s
    best, best_ks = 0.0, []
    for j in np.nonzero(usable)[0]:
        c, kcap = float(cands[j]), kcaps[j]
        b = c / d
        n, S, A, seqs = fluid_batch(b, m.input_tokens, m.output_tokens)
        taus = _taus(p, slots, costs, c, n, S, A)
        host, hops_s = m.step_host_s(seqs), hops_seconds(links, n, m.activation_bytes)
        # fluid_rate's tau >= max(host, (sum_i t_i + H) / d) and sum_i t_i >= L min_i tau_i + sum_i
        # head_i at any split, so no split at this c serves more than b / that: skip the split search
        # where it cannot beat the best (1e-9: far above the floats' rounding, so never a skip of a
        # split that would have won)
        floor = max(host, (L * min(taus) + float(head[-1]) + hops_s) / d)
        if floor > 0 and b / floor * (1.0 + ratio) * (1 + 1e-9) <= best:
            continue
        tau = np.array(taus)  # per layer: the step model's fluid step
        steps = np.arange(1, int(kcap.max()) + 1)  # k x tau_i + head_i for k = 1..kcap_i, every stage at once
        grid = np.unique((steps[None, :] * tau[:, None] + head[:, None])[steps[None, :] <= kcap[:, None]])
        fits = np.maximum(0.0, np.floor((grid[:, None] - head[None, :]) / tau[None, :] + 1e-9))
        cover = np.minimum(kcap[None, :], fits).sum(axis=1)
        ok = np.nonzero(cover >= L)[0]
        if not len(ok):
            continue
        t_star = grid[ok[0]]
        ks = np.minimum(kcap, np.maximum(0.0, np.floor((t_star - head) / tau + 1e-9))).astype(int)
        if ks.min() < 1:
            continue
        surplus = int(ks.sum() - L)
        while surplus > 0:  # shave the slowest stages first (keeps the max, shortens the round trip)
            i = int(np.argmax(np.where(ks > 1, ks * tau + head, -1.0)))
            ks[i] -= 1
            surplus -= 1
        times = [step_seconds(float(t), host) for t in ks * tau + head]
        X, _ = fluid_rate(tuple(float(t) for t in times), hops_s, c)
        cap = X * (1.0 + ratio)
        if cap > best * (1 + 1e-12):
            best, best_ks = cap, [int(k) for k in ks]
    return float(best), best_ks
