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
