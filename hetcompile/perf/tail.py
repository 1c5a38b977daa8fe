"""Latency percentiles of a replica at a planned load, and the load at which a percentile SLO holds.

perf/capacity.py gives what a replica does with n sequences in flight (throughput, TTFT, TPOT of
the one capacity formula). This module adds the queueing around it: how many sequences an arriving
request finds, how long it waits for a KV slot and for the chunk budget, and so the q-quantile of
TTFT and TPOT at an offered load, not only their values at the mean (issue 18).

Notation (one replica, one workload of I prompt / O output tokens, Poisson arrivals at lambda req/s):

    C_max      concurrency(rm, I, O): KV slots (the KV minimum over stages, --max-num-seqs)
    c          floor(C_max): requests that can be in flight; the next one waits for a slot
    h(n)       requests/s completed with n sequences in flight: chain_capacity(max_concurrency=n)
               for n < C_max, h_full = chain_capacity(rm, I, O) (KV full, preemption) from c on
    N          requests in the replica (in flight + waiting for a slot): a birth-death chain with
               births lambda and deaths mu(n) = h(min(n, C_max)), the capacity model's own
               state-dependent service rate (Kleinrock, Queueing Systems vol. 1, §3.1):
               pi(n) = pi(0) prod_{k=1..n} lambda / mu(k); past c a geometric tail of ratio
               lambda / h_full. With mu(n) = n / T (infinite servers) it is Poisson(lambda T), the
               sqrt(C) spread of the earlier Z99 rule; near C_max it also holds the admission queue.
    N_q        the q-quantile of N as an arrival sees it (PASTA: the stationary pi)
    n_q        min(N_q + 1, C_max): sequences in flight during its life (the others and itself)
    TPOT_q     chain_capacity's TPOT (d tau) at n_q sequences in flight
    W_adm      (N_q - c + 1)^+ / h_full: FCFS wait for a slot; the requests ahead leave at h_full
    W_pre      prompts queue for the chunk budget, FCFS: a prompt holds it S_p (`prompt_hold`),
               rho_p = lambda S_p: an M/D/1 queue whose wait is about
               rho_p exp(-2 (1 - rho_p) t / S_p) beyond t (the exponential approximation of the
               M/G/1 wait with c_s^2 = 0: Kingman 1962; Abate, Choudhury & Whitt 1995), so
               W_pre = S_p ln(rho_p / (1 - q))^+ / (2 (1 - rho_p)); on a replica that serves several
               workloads the queue is M/G/1 over all their prompts (prompt_wait): a short prompt
               waits behind the long ones
    S_p        one stage: I / P, the chunk budget's rate (capacity.prefill_rate: full chunks); a
               pipeline (d >= 2): the convoy, max(I / P, sum over the prompt's chunks of
               sum_i (T_i - t_i)^+ + (H - h)^+), T_i and H a chunk on stage i and the hops, t_i and h
               a decode batch of ceil(C_max / d) sequences at the mean context. vLLM fills the next
               batch with every waiting prompt up to the token budget and forms a batch only when
               the oldest of the d in flight completes, and the stages serve batches in launch
               order: a prompt that arrives while another's chunk is in flight waits until that chunk
               has crossed every stage and hop, and merged prompts do not share the trip (a chunk's
               stage times grow with its tokens). On the Helix chains and the PP-2 replicas of the
               examples the service time that reproduces the simulator's p99 is 0.62-0.97 of the
               prompt's whole trip (I / P was 0.05-0.5 of it), and on the chains at 66% of h_full
               within 10% of the convoy (bench/pipeline_ttft.py)
    TTFT_q     chain_capacity's TTFT at n_q in flight (overhead, the step in progress, the prompt's
               chunks beside the others' decode) + max(W_adm, W_pre): the two queues are in series
               but rarely both long (a full KV admits a prompt at a time, so the chunk budget is
               then idle); bench/tail_fidelity.py measures what this leaves out

Sizing (`tail_capacity`): the largest lambda <= u_max h_full whose TTFT_q and TPOT_q meet the
targets, by bisection on lambda (both grow with it) with a fixed number of steps: deterministic.
u_max is the plan's headroom (`max_utilization`, DEFAULT_MAX_UTILIZATION): no plan loads a
replica past it, SLO or not. With `max_ttft_slowdown` = s_max set, a workload without an SLO gets
one on its queueing (`default_ttft_bound`): TTFT_0.99 <= s_max TTFT_idle, TTFT_idle the TTFT of a
request that finds the replica idle. The build
then replays the plan in the simulator and tightens where this model was optimistic (simulate/verify.py).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hetcompile.perf.capacity import chain_capacity, concurrency, prefill_rate
from hetcompile.perf.stepmodel import ReplicaModel

PERCENTILES = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99}
DEFAULT_PERCENTILE = "p99"
DEFAULT_MAX_UTILIZATION = 0.85  # the headroom every plan keeps: no replica planned past 85% of h_full
# `max_ttft_slowdown` (the spec's default, `null` turns it off): without an SLO, a workload's p99
# TTFT on a replica stays within this multiple of the TTFT it sees on the idle replica. 85% busy
# alone leaves a replica with few, long requests (a 13B model on T4s holding 17 RAG requests of 30 s
# each) queueing arrivals for tens of seconds, and the Helix plans' deep chains for minutes; with 5
# every example's stated p99 was within 25% of an hour's simulation on 2026-11-26, and 8 of the 10
# workloads of the examples with pipelines on 2026-11-29 (helix-geo24's TTFT 33% below its statement,
# three-regions' rag 2.6x above it: preemption excursions on a replica mixing chat and rag;
# bench/tail_fidelity.py, bench/README.md)
DEFAULT_TTFT_SLOWDOWN = 5.0
GRID = 40  # points of h(n) computed exactly; the rest interpolated (h is smooth in n)
BISECTIONS = 32
TAIL_EPS = 1e-12  # mass of the geometric tail left out


def percentile_name(q: float) -> str:
    """0.99 -> 'p99'."""
    return f"p{round(q * 100):d}"


@dataclass(frozen=True)
class TailPoint:
    """Latency q-quantiles of one replica and workload at an offered load."""

    requests_per_s: float  # lambda
    utilization: float  # lambda / h_full
    in_flight: float  # n_q
    ttft_s: float  # TTFT_q (inf: the load is past what the replica can serve)
    tpot_s: float  # TPOT_q


@dataclass(frozen=True)
class TailEstimate:
    """The load a replica may carry for one workload under its headroom and percentile SLO."""

    requests_per_s: float  # 0: the SLO cannot be met on this replica
    concurrency: float  # n_q at that load
    ttft_s: float  # TTFT_q at that load
    tpot_s: float  # TPOT_q at that load
    utilization: float  # requests_per_s / h_full
    binding: str  # "headroom" | "slo-ttft" | "slo-tpot" | "slo-unmeetable"
    reason: str = ""


class TailModel:
    """The birth-death chain of one replica and workload (module docstring), built once: h(n), TTFT(n)
    and TPOT(n) of chain_capacity on a geometric grid of n (interpolated between), log mu cumulated
    over n = 1..c, so each load costs one vector operation."""

    def __init__(self, rm: ReplicaModel, input_tokens: float, output_tokens: float) -> None:
        self.rm, self.I, self.O = rm, input_tokens, output_tokens
        self.c_max = concurrency(rm, input_tokens, output_tokens)
        self.full = chain_capacity(rm, input_tokens, output_tokens)
        self.h_full = self.full.requests_per_s
        self.c = max(1, int(math.floor(self.c_max + 1e-9)))
        grid = sorted({min(self.c_max, self.c_max ** (i / (GRID - 1))) for i in range(GRID)} | {min(1.0, self.c_max)})
        ests = [chain_capacity(rm, input_tokens, output_tokens, max_concurrency=g) if g < self.c_max else self.full
                for g in grid]
        hs = [e.requests_per_s for e in ests]
        self._grid = np.asarray(grid, dtype=float)
        self._ttft = np.asarray([e.ttft_s for e in ests], dtype=float)
        self._tpot = np.asarray([e.tpot_s for e in ests], dtype=float)
        n = np.arange(1, self.c + 1, dtype=float)
        mu = np.interp(n, grid, hs)
        mu[-1] = self.h_full  # at c sequences the KV is as full as it gets: preemption included
        self.log_mu_cum = np.cumsum(np.log(np.maximum(mu, 1e-300)))
        self.prefill_rate = prefill_rate(rm)
        self._holds: dict[float, float] = {}  # S_p by prompt tokens

    def hold(self, prompt_tokens: float) -> float:
        """S_p of a prompt of this many tokens on this replica, beside this workload's decode batch."""
        s = self._holds.get(prompt_tokens)
        if s is None:
            s = self._holds[prompt_tokens] = prompt_hold(self.rm, prompt_tokens, self.prefill_rate,
                                                         self.c_max, self.I + self.O / 2.0)
        return s

    def quantile_in_system(self, rate: float, q: float) -> float:
        """N_q: the q-quantile of the requests an arrival finds (inf when rate >= h_full)."""
        return self.quantiles_in_system(rate, [q])[0]

    def quantiles_in_system(self, rate: float, qs: Sequence[float]) -> list[float]:
        """N_q for each q in qs, from one stationary distribution."""
        if rate <= 0:
            return [0.0 for _ in qs]
        if rate >= self.h_full:
            return [math.inf for _ in qs]
        n = np.arange(0, self.c + 1, dtype=float)
        logp = n * math.log(rate) - np.concatenate(([0.0], self.log_mu_cum))
        top = float(logp.max())
        p = np.exp(logp - top)
        r = rate / self.h_full  # past c: pi(c + k) = pi(c) r^k
        tail = float(p[-1]) * r / (1.0 - r)
        total = float(p.sum()) + tail
        cdf = np.cumsum(p) / total
        p_c = float(p[-1]) / total
        out = []
        for q in qs:
            k = int(np.searchsorted(cdf, q - 1e-12))
            if k <= self.c:
                out.append(float(k))
                continue
            # inside the geometric tail: P(N > c + k) = p_c r^(k + 1) / (1 - r)
            beyond = 1.0 - q
            k_tail = math.log(beyond * (1.0 - r) / p_c) / math.log(r) - 1.0 if beyond * (1.0 - r) < p_c * r else 0.0
            out.append(self.c + max(0.0, math.ceil(k_tail - 1e-9)))
        return out

    def _at(self, n: float) -> tuple[float, float]:
        """(TTFT, TPOT) of chain_capacity with n sequences in flight, interpolated between the grid
        points it was computed at (both are smooth in n; the grid's last point is full load)."""
        return float(np.interp(n, self._grid, self._ttft)), float(np.interp(n, self._grid, self._tpot))

    def point(self, rate: float, q: float, prompts: Sequence[tuple[float, float]] | None = None) -> TailPoint:
        """TTFT_q and TPOT_q at `rate` req/s (module docstring). `prompts`: every (req/s, prompt
        tokens) flow that shares the replica's chunk budget, this workload's included (default: this
        workload alone at `rate`), for a replica that serves several workloads."""
        return self.points(rate, [q], prompts)[0]

    def points(self, rate: float, qs: Sequence[float], prompts: Sequence[tuple[float, float]] | None = None) -> list[TailPoint]:
        """`point` at each quantile of qs (one stationary distribution for all)."""
        util = rate / self.h_full if self.h_full > 0 else math.inf
        flows = prompts if prompts is not None else [(rate, self.I)]
        out = []
        for q, nq in zip(qs, self.quantiles_in_system(rate, qs)):
            if math.isinf(nq):
                out.append(TailPoint(rate, util, math.inf, math.inf, math.inf))
                continue
            n = max(min(nq + 1.0, self.c_max), min(1.0, self.c_max))
            ttft, tpot = self._at(n)
            wait_slot = max(0.0, nq - self.c + 1.0) / self.h_full
            wait_prefill = prompt_wait([(lam, self.hold(tokens)) for lam, tokens in flows], q)
            out.append(TailPoint(rate, util, n, ttft + max(wait_slot, wait_prefill) if math.isfinite(wait_prefill)
                                 else math.inf, tpot))
        return out


def prompt_hold(rm: ReplicaModel, prompt_tokens: float, prefill_tokens_per_s: float, c_max: float,
                context: float) -> float:
    """S_p (module docstring): I / P on one stage; on a pipeline the convoy of the prompt's chunks
    behind which a decode batch of ceil(c_max / d) sequences of mean context `context` would have run."""
    base = prompt_tokens / prefill_tokens_per_s if prefill_tokens_per_s > 0 else math.inf
    if rm.depth < 2 or not math.isfinite(base):
        return base
    m = float(max(1, math.ceil(c_max / rm.depth - 1e-9)))
    decode = rm.stage_times(m, m * context, m * context, m)
    hop = rm.hop_time(m)
    convoy, done = 0.0, 0.0
    while done < prompt_tokens - 1e-9:
        n = min(float(rm.chunk_tokens), prompt_tokens - done)
        chunk = rm.stage_times(n, done, n * done + n * n / 2.0, 1.0)
        convoy += sum(max(0.0, a - b) for a, b in zip(chunk, decode)) + max(0.0, rm.hop_time(n) - hop)
        done += n
    return max(base, convoy)


def prompt_wait(prompts: Sequence[tuple[float, float]], q: float) -> float:
    """W_pre at quantile q: the M/G/1 queue of prompts (module docstring). With flows (lambda_i, S_i):
    rho = sum lambda_i S_i, E[W] = sum lambda_i S_i^2 / (2 (1 - rho)) (Pollaczek-Khinchine),
    P(W > t) ~ rho exp(-rho t / E[W]), so W_q = E[W] / rho ln(rho / (1 - q))^+. One flow:
    S ln(rho / (1 - q)) / (2 (1 - rho)), the M/D/1 form."""
    if any(not math.isfinite(s) for _, s in prompts):
        return math.inf
    rho = sum(lam * s for lam, s in prompts)
    if rho >= 1.0:
        return math.inf
    if rho <= 1.0 - q or rho <= 0:
        return 0.0
    mean = sum(lam * s * s for lam, s in prompts) / (2.0 * (1.0 - rho))
    return mean / rho * math.log(rho / (1.0 - q))


def prefill_wait(prompts: Sequence[tuple[float, float]], prefill_tokens_per_s: float, q: float) -> float:
    """prompt_wait with flows (lambda_i, I_i) held I_i / P each: the chunk budget of one stage
    (a disaggregated group's prefill replica, perf/disagg.py)."""
    if prefill_tokens_per_s <= 0:
        return math.inf
    return prompt_wait([(lam, tokens / prefill_tokens_per_s) for lam, tokens in prompts], q)


def _meets(p: TailPoint, ttft_target: float | None, tpot_target: float | None) -> bool:
    return (ttft_target is None or p.ttft_s <= ttft_target) and (tpot_target is None or p.tpot_s <= tpot_target)


def tail_capacity(rm: ReplicaModel, input_tokens: float, output_tokens: float, q: float = PERCENTILES[DEFAULT_PERCENTILE],
                  ttft_target: float | None = None, tpot_target: float | None = None,
                  max_utilization: float = DEFAULT_MAX_UTILIZATION, model: TailModel | None = None) -> TailEstimate:
    """The largest req/s of the workload on this replica within the headroom whose q-quantile TTFT
    and TPOT meet the targets (module docstring, "Sizing")."""
    tm = model or TailModel(rm, input_tokens, output_tokens)
    hi = max_utilization * tm.h_full
    top = tm.point(hi, q)
    if _meets(top, ttft_target, tpot_target):
        return TailEstimate(hi, top.in_flight, top.ttft_s, top.tpot_s, top.utilization, "headroom")
    low = tm.point(hi * 1e-6, q)
    if not _meets(low, ttft_target, tpot_target):
        why = []
        if tpot_target is not None and low.tpot_s > tpot_target:
            why.append(f"TPOT {low.tpot_s * 1e3:.0f} ms at one sequence > target {tpot_target * 1e3:.0f} ms")
        if ttft_target is not None and low.ttft_s > ttft_target:
            why.append(f"TTFT {low.ttft_s:.3g} s on an idle replica > target {ttft_target:.3g} s")
        return TailEstimate(0.0, 0.0, low.ttft_s, low.tpot_s, 0.0, "slo-unmeetable", "; ".join(why))
    lo, best = hi * 1e-6, low
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        p = tm.point(mid, q)
        if _meets(p, ttft_target, tpot_target):
            lo, best = mid, p
        else:
            hi = mid
    over = tm.point(hi, q)  # just past the bound: which target it crosses
    ttft_over = over.ttft_s / ttft_target if ttft_target is not None else 0.0
    tpot_over = over.tpot_s / tpot_target if tpot_target is not None else 0.0
    binding = "slo-ttft" if ttft_over >= tpot_over else "slo-tpot"
    return TailEstimate(lo, best.in_flight, best.ttft_s, best.tpot_s, best.utilization, binding)


def idle_ttft(rm: ReplicaModel, input_tokens: float, output_tokens: float) -> float:
    """TTFT_idle: the TTFT of a request that finds the replica idle, chain_capacity at one sequence
    in flight (the point TailModel's grid starts at)."""
    one = concurrency(rm, input_tokens, output_tokens) > 1.0
    return (chain_capacity(rm, input_tokens, output_tokens, max_concurrency=1.0) if one
            else chain_capacity(rm, input_tokens, output_tokens)).ttft_s


def default_ttft_bound(rm: ReplicaModel, input_tokens: float, output_tokens: float,
                       slowdown: float = DEFAULT_TTFT_SLOWDOWN) -> float:
    """The p99 TTFT a workload without an SLO may see on this replica: slowdown x TTFT_idle."""
    return slowdown * idle_ttft(rm, input_tokens, output_tokens)


def tail_at_load(rm: ReplicaModel, input_tokens: float, output_tokens: float, rate: float,
                 q: float = PERCENTILES[DEFAULT_PERCENTILE]) -> TailPoint:
    """TTFT_q and TPOT_q of one replica offered `rate` req/s of one workload."""
    return TailModel(rm, input_tokens, output_tokens).point(rate, q)


# quantiles each replica's tail is tabulated at: 0, then 1 - 10^(-k/20) up to 1 - 1e-9 (dense in the tail)
P_GRID = np.concatenate(([0.0], 1.0 - 10.0 ** (-np.arange(1, 181) / 20.0)))
MIXTURE_BISECTIONS = 60
_P_LIST = P_GRID.tolist()


def _ascending(v) -> list[float]:
    a = np.maximum.accumulate(np.asarray(v, dtype=float))
    return np.where(np.isnan(a), np.inf, a).tolist()


def mixture_quantile(parts: list[tuple[float, np.ndarray]], q: float) -> float:
    """The q-quantile of a mixture: `parts` = (share s_r, the q-quantiles of part r on P_GRID).
    P_r(T > t) = 1 - the largest grid p whose quantile is <= t; t solves sum_r s_r P_r(T > t) = 1 - q
    by bisection between the parts' smallest and largest q-quantile. inf when no finite t does (a
    saturated replica taking more than 1 - q of the requests)."""
    # plain lists and bisect: the bisection below asks `beyond` 60 times per call, and numpy's
    # searchsorted on one scalar costs 10x bisect's (a plan of 3,000 workloads: 730,000 calls)
    # non-decreasing, NaN as inf: numpy's searchsorted sorts NaN last, and so does bisect inf (t is finite)
    curves = [(share, _ascending(v)) for share, v in parts]

    def quantile(v: list[float], p: float) -> float:
        k = bisect.bisect_left(_P_LIST, p - 1e-12)
        return float(v[min(k, len(v) - 1)])

    def beyond(t: float) -> float:
        mass = 0.0
        for share, v in curves:
            k = bisect.bisect_right(v, t) - 1
            mass += share * (1.0 - (_P_LIST[k] if k >= 0 else 0.0))
        return mass

    ends = [quantile(v, q) for _, v in curves]
    if len(curves) == 1:
        return ends[0]
    finite = [e for e in ends if math.isfinite(e)]
    if not finite:
        return math.inf
    lo, hi = min(finite), max(finite)
    if beyond(hi) > 1.0 - q:
        if len(finite) == len(ends):
            return hi
        # a saturated part (its q-quantile inf) with less than 1 - q of the requests: the quantile lies
        # above every finite part's q-quantile, at most where the finite curves end
        top = max(x for _, v in curves for x in v if math.isfinite(x))
        if beyond(top) > 1.0 - q:
            return math.inf
        lo, hi = hi, top
    for _ in range(MIXTURE_BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if beyond(mid) > 1.0 - q else (lo, mid)
    return hi
