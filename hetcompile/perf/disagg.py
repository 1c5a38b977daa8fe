"""Prefill/decode disaggregation: what one prefill instance and one decode instance serve (issue 35).

A disaggregated group runs a workload's prompts on prefill instances and its output tokens on
decode instances (vLLM's `--kv-transfer-config`, NixlConnector): the router sends a request to a
prefill instance with max_tokens 1, the prefill instance's KV cache for the prompt moves to a decode
instance over the link between them, and the decode instance generates every output token. Each side
is a replica model of its own (perf/stepmodel.py; GPU type, TP and PP its own) and is sized here
with the step model every other estimate uses; only the step mix differs.

Notation (a workload of I prompt tokens, of which c are a cached shared prefix, and O output tokens;
q the SLO's quantile; u_max the plan's headroom, perf/tail.py):

  prefill instance (only prompt chunks in its steps)
    P       = capacity.prefill_rate(rm_P)        prompt tokens/s of full chunks, slowest stage
    h_P     = P / (I - c)                        prompts/s at full load
    T_P     = capacity.prefill_time(rm_P, I - c) the request overhead r, then the prompt's chunks
    W_P(l)  = tail.prefill_wait([(l, I - c)], P, q)   the q-quantile wait for the chunk budget (M/D/1)
  KV transfer (the prompt's K and V, every layer, over the link from prefill to decode)
    T_KV    = latency + I L kappa / bandwidth    (kappa: K+V bytes per token per layer)
  decode instance (only decode tokens: no prompt chunk ever stalls a decode step)
    s       = I + O / 2                          mean context of a sequence over its life
    C_max   = min(max_num_seqs, KV_D / s)        sequences it can hold
    t_D(C)  = max(max_i t_i, (sum_i t_i + H) / d), each stage's step over C / d decode tokens of
              context s (the slowest stage, or the pipeline's round trip shared by d micro-batches)
    TPOT(C) = d t_D(C)
    C*      = the largest C <= C_max with TPOT(C) <= the TPOT target (C_max without one): the decode
              instance runs with --max-num-seqs C*, so no load makes its TPOT worse than TPOT(C*)
    h_D     = C* / (O TPOT(C*))                  requests/s at full load
    W_D(l)  = the q-quantile wait for one of the C* slots, M/M/c (Erlang C): a slot frees at
              1 / (O TPOT(C*)) per slot, so P(W > t) = ErlangC(C*, l / mu) exp(-(C* mu - l) t)
  a request's TTFT: the prefill instance's (r, W_P, the prompt), the transfer, then the decode
  instance's own request overhead r (the router's second request), its wait for a slot, and its
  first step: the step in progress (t_D / 2 on average), the one formed ahead of it (vLLM's async
  scheduling, one-stage instances) and its own:
    TTFT_q(l_P, l_D) = T_P + W_P(l_P) + T_KV + r + W_D(l_D) + (1/2 + [async] + 1) t_D(C*)

Sizing (`size`): the largest prefill load l_P <= u_max h_P whose TTFT_q meets the target with the
decode side's share of it at its own sizing, and l_D = u_max h_D (the TPOT target is met by C*
whatever the load). The quantiles of the waits are added, an upper bound of the quantile of the sum.
Prefix caching: the cached prefix is neither prefilled nor, on the decode side, moved (vLLM's prefix
cache on the decode instance holds it too), so T_KV moves I - c tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetcompile.perf.capacity import concurrency, fluid_rate, prefill_rate, prefill_time
from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.perf.tail import DEFAULT_MAX_UTILIZATION, prefill_wait

BISECTIONS = 40  # fixed: the sizing is deterministic


@dataclass(frozen=True)
class PrefillEstimate:
    """One prefill instance for one workload."""

    full_rps: float  # h_P: prompts/s at full load
    requests_per_s: float  # the load the plan may put on it (headroom, TTFT target)
    ttft_s: float  # its part of TTFT at that load: T_P + W_P, the q-quantile
    idle_s: float  # T_P: on an idle instance
    binding: str  # "headroom" | "slo-ttft" | "slo-unmeetable"


@dataclass(frozen=True)
class DecodeEstimate:
    """One decode instance for one workload."""

    full_rps: float  # h_D at C*
    requests_per_s: float  # u_max h_D
    max_num_seqs: int  # C*: the instance's --max-num-seqs
    tpot_s: float  # TPOT(C*): the worst TPOT at any load
    step_s: float  # t_D(C*)
    slot_wait_s: float  # W_D at requests_per_s, the q-quantile
    binding: str  # "headroom" | "kv" | "max-num-seqs" | "slo-tpot" | "slo-unmeetable"


def kv_transfer_s(tokens: float, kv_bytes_per_token: float, latency_s: float, bandwidth: float) -> float:
    """T_KV: `tokens` tokens of K and V (kv_bytes_per_token over every layer) over one link."""
    return latency_s + tokens * kv_bytes_per_token / bandwidth


def decode_step(rm: ReplicaModel, C: float, context: float) -> float:
    """t_D(C): seconds between micro-batch steps of a decode-only replica holding C sequences of mean
    context `context` (module docstring)."""
    C = max(C, 1e-9)
    b = C / rm.depth
    times = rm.stage_times(b, b * context, b * context, b)  # decode tokens only: S = A = b s
    X, _ = fluid_rate(times, rm.hop_time(b), C)  # capacity.py's tau, through its one formula: X = b / tau
    return b / X


def tpot(rm: ReplicaModel, C: float, context: float) -> float:
    """TPOT(C) = d t_D(C): every sequence gets a token once per round of the d micro-batches."""
    return rm.depth * decode_step(rm, C, context)


def erlang_c(c: int, a: float) -> float:
    """The probability that an arrival waits in M/M/c at offered load a = lambda / mu < c (Erlang B by
    its recursion B_k = a B_{k-1} / (k + a B_{k-1}), stable for thousands of servers)."""
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    B = 1.0
    for k in range(1, c + 1):
        B = a * B / (k + a * B)
    return c * B / (c - a * (1.0 - B))


def slot_wait(c: int, mu: float, lam: float, q: float) -> float:
    """W_D: the q-quantile wait for one of c slots each freeing at mu per second, Poisson arrivals
    at lam: P(W > t) = ErlangC exp(-(c mu - lam) t)."""
    if lam <= 0:
        return 0.0
    if lam >= c * mu:
        return math.inf
    pw = erlang_c(c, lam / mu)
    return math.log(pw / (1.0 - q)) / (c * mu - lam) if pw > 1.0 - q else 0.0


def decode_capacity(rm: ReplicaModel, input_tokens: float, output_tokens: float, tpot_target: float | None = None,
                    q: float = 0.99, max_utilization: float = DEFAULT_MAX_UTILIZATION) -> DecodeEstimate:
    """One decode instance (module docstring): C* by bisection on C (TPOT grows with C), h_D, and the
    slot wait at the headroom's load."""
    context = input_tokens + output_tokens / 2.0
    c_max = concurrency(rm, input_tokens, output_tokens)
    binding = "max-num-seqs" if c_max >= rm.max_num_seqs else "kv"
    if tpot_target is not None and tpot(rm, 1.0, context) > tpot_target:
        return DecodeEstimate(0.0, 0.0, 0, tpot(rm, 1.0, context), decode_step(rm, 1.0, context), 0.0, "slo-unmeetable")
    C = float(math.floor(c_max))
    if tpot_target is not None and tpot(rm, C, context) > tpot_target:
        lo, hi = 1.0, C
        for _ in range(BISECTIONS):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if tpot(rm, mid, context) <= tpot_target else (lo, mid)
        C, binding = float(math.floor(lo)), "slo-tpot"
    step = decode_step(rm, C, context)
    t = rm.depth * step
    full = C / (output_tokens * t)
    rate = max_utilization * full
    wait = slot_wait(int(C), 1.0 / (output_tokens * t), rate, q)
    return DecodeEstimate(full, rate, int(C), t, step, wait, binding)


def prefill_capacity(rm: ReplicaModel, prompt_tokens: float, ttft_budget: float | None = None, q: float = 0.99,
                     max_utilization: float = DEFAULT_MAX_UTILIZATION) -> PrefillEstimate:
    """One prefill instance for prompts of `prompt_tokens` uncached tokens: the largest load within
    the headroom whose q-quantile T_P + W_P stays within `ttft_budget` (the TTFT target less the
    transfer and the decode side's part), by bisection (the wait grows with the load)."""
    idle, rate = prefill_time(rm, prompt_tokens), prefill_rate(rm)  # T_P and P: the same at every load

    def ttft(lam: float) -> float:
        return idle + prefill_wait([(lam, prompt_tokens)], rate, q)

    full = rate / prompt_tokens
    hi = max_utilization * full
    if ttft_budget is None or ttft(hi) <= ttft_budget:
        return PrefillEstimate(full, hi, ttft(hi), idle, "headroom")
    if idle > ttft_budget:
        return PrefillEstimate(full, 0.0, idle, idle, "slo-unmeetable")
    lo = 0.0
    for _ in range(BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ttft(mid) <= ttft_budget else (lo, mid)
    return PrefillEstimate(full, lo, ttft(lo), idle, "slo-ttft")


@dataclass(frozen=True)
class GroupEstimate:
    """A prefill type and a decode type for one workload, sized together (`size`)."""

    prefill: PrefillEstimate
    decode: DecodeEstimate
    transfer_s: float  # T_KV
    ttft_s: float  # TTFT_q at the sized loads
    tpot_s: float  # TPOT(C*)

    @property
    def feasible(self) -> bool:
        return self.prefill.requests_per_s > 0 and self.decode.requests_per_s > 0


def decode_first_token(rm: ReplicaModel, d: DecodeEstimate) -> float:
    """The decode instance's part of TTFT before its wait for a slot: its request overhead r, the
    step in progress (half a step on average), the step formed ahead of it under async scheduling
    (one-stage instances) and its own first step."""
    ahead = 1.0 if rm.schedules_ahead else 0.0
    return rm.request_overhead_s + (1.5 + ahead) * d.step_s


def size(rm_p: ReplicaModel, rm_d: ReplicaModel, input_tokens: float, output_tokens: float, cached_tokens: float,
         kv_bytes_per_token: float, link: tuple[float, float], ttft_target: float | None, tpot_target: float | None,
         q: float = 0.99, max_utilization: float = DEFAULT_MAX_UTILIZATION) -> GroupEstimate:
    """The module docstring's sizing: the decode side at its TPOT target and headroom, then the
    prefill side within what the TTFT target leaves it. `link` = (latency s, bytes/s) from the
    prefill instance to the decode instance."""
    uncached = max(1.0, input_tokens - cached_tokens)
    dec = decode_capacity(rm_d, input_tokens, output_tokens, tpot_target, q, max_utilization)
    transfer = kv_transfer_s(uncached, kv_bytes_per_token, *link)
    after = transfer + decode_first_token(rm_d, dec) + dec.slot_wait_s
    budget = None if ttft_target is None else ttft_target - after  # <= 0: below T_P, so unmeetable
    pre = prefill_capacity(rm_p, uncached, budget, q, max_utilization)
    return GroupEstimate(pre, dec, transfer, pre.ttft_s + after, dec.tpot_s)
