"""What GPUs would add as Hetis Attention workers (seed 001 §4.2, §5.1 eq. 3-4): analysis only.

vLLM 0.33 cannot offload attention heads to other GPUs, so nothing here is ever deployed; it lets
a user judge whether an engine that can (Hetis) is worth it for the GPUs primary-worker selection
left out (placement/hetis.py). The replica is the step-time model of perf/stepmodel.py and its
capacity is perf/capacity.py's `chain_capacity`: this module only changes the model's coefficients
the way head-wise offload would, it does not write another throughput formula.

Notation (one replica, model with L layers, n_h query heads, n_kv KV heads, g = n_h / n_kv, head
dim d_h, b bytes per element, kappa = 2 n_kv d_h b K+V bytes per token per layer):
    K      the replica's KV capacity in tokens (minimum over its stages)
    K_A    = sum_a (u M_a - R) / (L kappa)     tokens the workers' memory holds (no weights on them:
           every layer's heads of the offloaded share; u = --gpu-memory-utilization, R reserve)
    rho    share of every sequence's query heads (and their KV) on the workers
    K'     = min(K / (1 - rho), K_A / rho)     KV capacity with offload (each side holds its share)
    eq. 3  attention time on a device ~ linear in its cached tokens: per layer k S on the primary
           (perf/stepmodel's k) and k_A S on the workers, k_A = kappa / (sum_a B_a eta_a)
           (their aggregate memory bandwidth), so per layer per step the KV read costs
           max((1 - rho) k, rho k_A) S (the two sides run in parallel)
    eq. 4  transfer per layer per step = alpha + beta V: alpha the link latency (there and back:
           2 alpha), beta = 1 / bandwidth, V = rho n_h d_h b (2 + 2 / g) bytes per decode token
           (q and the attention output of the offloaded heads, the new token's k and v)
The offload share rho is searched on a grid (0 is "no workers") for the highest decode tokens/s.
The transfer is charged to every token of a step (prompt tokens included, although Hetis offloads
decode attention only): the estimate errs on the side of not recommending offload.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetcompile.perf.types import GpuType, ModelArch
from hetcompile.perf.analytic import RESERVE_BYTES, efficiencies
from hetcompile.perf.capacity import chain_capacity
from hetcompile.perf.stepmodel import ReplicaModel

RHO_GRID = tuple(i / 20 for i in range(1, 20))  # offload shares tried: 5% .. 95% of the heads


@dataclass(frozen=True)
class AttentionOffload:
    """The best offload share for a set of attention workers, and what it would do."""

    gpus: int
    kv_tokens: float  # K
    kv_tokens_with: float  # K' at the chosen rho
    decode_tokens_per_s: float  # the replica alone
    decode_tokens_per_s_with: float  # with the workers (== alone when rho = 0 is best)
    rho: float  # 0: offloading does not pay over this link
    transfer_s_per_layer: float  # 2 alpha + beta V x (decode batch) at the chosen rho
    requests_per_s: float
    requests_per_s_with: float


def worker_kv_tokens(arch: ModelArch, dtype_bytes: int, workers: list[tuple[GpuType, int]], util: float) -> float:
    """K_A: KV tokens (all layers) the workers' memory holds."""
    kappa = 2.0 * arch.kv_heads * arch.head_dim * dtype_bytes
    return sum(n * max(0.0, util * g.memory - RESERVE_BYTES) for g, n in workers) / (arch.layers * kappa)


def offload(rm: ReplicaModel, arch: ModelArch, dtype_bytes: int, workers: list[tuple[GpuType, int]], util: float,
            latency_s: float, bandwidth: float, input_tokens: float, output_tokens: float) -> AttentionOffload:
    """The module docstring's estimate for one replica `rm` and its attention workers."""
    kappa = 2.0 * arch.kv_heads * arch.head_dim * dtype_bytes
    bw_a = sum(n * g.mem_bw * efficiencies(g)[1] for g, n in workers)
    k_a = kappa / bw_a if bw_a > 0 else float("inf")
    K = rm.kv_capacity_tokens
    K_A = worker_kv_tokens(arch, dtype_bytes, workers, util)
    base = chain_capacity(rm, input_tokens, output_tokens)
    best = (base.decode_tokens_per_s, 0.0, K, 0.0, base.requests_per_s)
    g = arch.heads / arch.kv_heads
    for rho in RHO_GRID:
        K2 = min(K / (1.0 - rho), K_A / rho)
        V = rho * arch.heads * arch.head_dim * dtype_bytes * (2.0 + 2.0 / g)
        stages = tuple(
            s.model_copy(update={
                "kv_tokens": K2,
                "cost": s.cost.model_copy(update={
                    "kv_s_per_token": max((1.0 - rho) * s.cost.kv_s_per_token, rho * k_a),
                    "comm_s_per_token": s.cost.comm_s_per_token + V / bandwidth,
                    "comm_s": s.cost.comm_s + 2.0 * latency_s,
                }),
            })
            for s in rm.stages
        )
        est = chain_capacity(rm.model_copy(update={"stages": stages}), input_tokens, output_tokens)
        if est.decode_tokens_per_s > best[0] * (1 + 1e-9):
            batch = est.concurrency / rm.depth
            best = (est.decode_tokens_per_s, rho, K2, 2.0 * latency_s + V * batch / bandwidth, est.requests_per_s)
    return AttentionOffload(
        gpus=sum(n for _, n in workers), kv_tokens=K, kv_tokens_with=best[2], decode_tokens_per_s=base.decode_tokens_per_s,
        decode_tokens_per_s_with=best[0], rho=best[1], transfer_s_per_layer=best[3], requests_per_s=base.requests_per_s,
        requests_per_s_with=best[4],
    )
