"""Capacity of a replica from its step-time model: the one formula compose and placement share.

Notation (a replica = a chain of d stages; a workload of I prompt and O output tokens):

    s   = I + O/2                         mean context of a sequence over its life
    C   = min(max_num_seqs, KV_min / s)   sequences in flight (vLLM's KV is the minimum over stages)
    b   = C / d                           micro-batch: d batches in flight keep d stages busy
    per engine step a micro-batch carries b decode tokens and, in steady state, b I / O prompt
    tokens (chunked prefill mixes them in):  n = b (1 + I/O) tokens,  S = b s context tokens read,
    A = b s + b (I/O) (I/2) attention pairs (decode over its context; prompts causally)
    t_i = stage i's step time (perf/stepmodel.py);  H = hops for n tokens
    X   = min(b / max_i t_i, C / (sum_i t_i + H))     decode tokens/s: the slowest stage, or the
                                                      round trip when the chain is deep or far
    h   = X / O                           requests/s
    TPOT = C / X                          seconds between a sequence's tokens at full load
    TTFT = o_r + sum over the prompt's chunks of the stage times + H, each chunk's step also
           carrying the micro-batch of the C - 1 other sequences' decode tokens (o_r: the
           per-request overhead; queueing for a slot is the SLO pass's business, not this one's)

Everything is per workload run alone at full load (seed 003's h_{c,w}); compose mixes workloads
linearly through r_{c,w} / h_{c,w}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetcompile.perf.stepmodel import ReplicaModel


@dataclass(frozen=True)
class ChainEstimate:
    """Capacity of one chain for one workload."""

    concurrency: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    requests_per_s: float
    binding: str  # "bottleneck-stage" | "depth" | "max-num-seqs"
    ttft_s: float
    tpot_s: float


def concurrency(rm: ReplicaModel, input_tokens: float, output_tokens: float) -> float:
    s = input_tokens + output_tokens / 2.0
    return max(min(float(rm.max_num_seqs), rm.kv_capacity_tokens / s), 1e-9)


def decode_rate(rm: ReplicaModel, C: float, input_tokens: float, output_tokens: float) -> tuple[float, bool]:
    """(X decode tokens/s at C sequences in flight, True if the slowest stage binds)."""
    d = rm.depth
    b = C / d
    s = input_tokens + output_tokens / 2.0
    ratio = input_tokens / output_tokens
    prompt = b * ratio
    times = rm.stage_times(b + prompt, b * s, b * s + prompt * input_tokens / 2.0)
    stage = b / max(times)
    depth = C / (sum(times) + rm.hop_time(b * (1.0 + ratio)))
    return min(stage, depth), stage <= depth


def prefill_time(rm: ReplicaModel, prompt_tokens: float, others: float = 0.0, context: float = 0.0) -> float:
    """TTFT of one request: the per-request overhead, then its prompt in chunks of `chunk_tokens`,
    each chunk's attention over the prompt so far, through every stage, plus the hops. `others`
    decode sequences of mean context `context` share each chunk's step (0: an idle replica)."""
    total, done = rm.request_overhead_s, 0.0
    while done < prompt_tokens - 1e-9:
        n = min(float(rm.chunk_tokens), prompt_tokens - done)
        pairs = n * done + n * n / 2.0 + others * context
        total += sum(rm.stage_times(n + others, done + others * context, pairs)) + rm.hop_time(n + others)
        done += n
    return total


def prefill_rate(rm: ReplicaModel) -> float:
    """Prompt tokens/s of full chunks through the slowest stage."""
    n = float(rm.chunk_tokens)
    return n / max(rm.stage_times(n, 0.0, n * n / 2.0))


def chain_capacity(rm: ReplicaModel, input_tokens: float, output_tokens: float, max_concurrency: float | None = None) -> ChainEstimate:
    """The module docstring's formulas; `max_concurrency` caps C below the engine's (SLO sizing)."""
    C = concurrency(rm, input_tokens, output_tokens)
    kv_bound = C < rm.max_num_seqs
    if max_concurrency is not None and max_concurrency < C:
        C, kv_bound = max(max_concurrency, 1e-9), False
    X, stage_bound = decode_rate(rm, C, input_tokens, output_tokens)
    if not kv_bound and C >= rm.max_num_seqs:
        binding = "max-num-seqs"
    else:
        binding = "bottleneck-stage" if stage_bound else "depth"
    return ChainEstimate(
        concurrency=C, decode_tokens_per_s=X, prefill_tokens_per_s=prefill_rate(rm),
        requests_per_s=X / output_tokens if X > 0 and math.isfinite(X) else 0.0, binding=binding,
        ttft_s=prefill_time(rm, input_tokens, max(C - 1.0, 0.0) / rm.depth, input_tokens + output_tokens / 2.0),
        tpot_s=C / X,
    )


# --- SLO sizing -------------------------------------------------------------------------------
# A replica meets a workload's SLO at a lower load than its full-load capacity:
#   TPOT: the sequences in decode fluctuate around the mean C (Poisson arrivals: about Poisson(C));
#         the p99-ish TPOT is the TPOT at C99 = C + Z99 sqrt(C) in flight, which must be <= target.
#   TTFT: per-request overhead + the prompt's chunks (with the other sequences' decode tokens mixed
#         in) + the wait for the prefill: an M/D/1 queue of service S (the prompt's step time) at
#         utilization rho of the replica, W = rho S / (2 (1 - rho)). rho <= SLO_MAX_UTILIZATION.
#   capacity h_slo = rho * X(C) / O, maximized over C on a fixed geometric grid (deterministic).
Z99 = 2.33
SLO_MAX_UTILIZATION = 0.9
SLO_GRID = 48


@dataclass(frozen=True)
class SloEstimate:
    """Capacity of one chain for one workload under its SLO (requests_per_s 0: cannot meet it)."""

    requests_per_s: float
    concurrency: float
    ttft_s: float  # predicted, including queueing at rho
    tpot_s: float  # predicted p99-ish (at C99)
    utilization: float
    binding: str  # "slo-tpot" | "slo-ttft" | "slo-unmeetable"
    reason: str = ""


def slo_capacity(rm: ReplicaModel, input_tokens: float, output_tokens: float,
                 ttft_target: float | None, tpot_target: float | None) -> SloEstimate:
    """The largest requests/s at which the chain's predicted TTFT and p99 TPOT meet the targets."""
    c_max = concurrency(rm, input_tokens, output_tokens)
    grid = sorted({min(c_max, c_max ** (i / (SLO_GRID - 1))) for i in range(SLO_GRID)} | {min(1.0, c_max)})
    best: SloEstimate | None = None
    first: tuple[float, float] | None = None  # (tpot p99, ttft) at the smallest C: what the reason quotes
    for C in grid:
        c99 = min(c_max, C + Z99 * math.sqrt(C))
        tpot99 = chain_capacity(rm, input_tokens, output_tokens, max_concurrency=c99).tpot_s
        est = chain_capacity(rm, input_tokens, output_tokens, max_concurrency=C)
        service = est.ttft_s - rm.request_overhead_s
        if first is None:
            first = (tpot99, est.ttft_s)
        if tpot_target is not None and tpot99 > tpot_target:
            break  # TPOT grows with C: larger C only gets worse
        rho, bind = SLO_MAX_UTILIZATION, "slo-tpot" if tpot_target is not None else "slo-ttft"
        if ttft_target is not None:
            slack = ttft_target - est.ttft_s
            if slack <= 0:
                continue
            rho_ttft = 2.0 * slack / (service + 2.0 * slack) if service > 0 else 1.0
            if rho_ttft < rho:
                rho, bind = rho_ttft, "slo-ttft"
        wait = rho * service / (2.0 * (1.0 - rho))
        h = rho * est.requests_per_s
        if best is None or h > best.requests_per_s:
            best = SloEstimate(requests_per_s=h, concurrency=C, ttft_s=est.ttft_s + wait, tpot_s=tpot99,
                               utilization=rho, binding=bind)
    if best is not None:
        return best
    tpot1, ttft1 = first if first is not None else (math.inf, math.inf)
    why = []
    if tpot_target is not None and tpot1 > tpot_target:
        why.append(f"TPOT {tpot1 * 1e3:.0f} ms at one sequence > target {tpot_target * 1e3:.0f} ms")
    if ttft_target is not None and ttft1 >= ttft_target:
        why.append(f"TTFT {ttft1:.3g} s on an idle replica >= target {ttft_target:.3g} s")
    return SloEstimate(requests_per_s=0.0, concurrency=0.0, ttft_s=ttft1, tpot_s=tpot1, utilization=0.0,
                       binding="slo-unmeetable", reason="; ".join(why) or "no concurrency meets both targets")
