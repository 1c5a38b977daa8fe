"""The analytic performance model: memory, KV capacity and stage times from datasheet numbers.

Notation (per model; b = bytes per element, 2 for fp16/bf16):
    h hidden, I intermediate, n_h heads, n_kv KV heads, d_h head dim, V vocab, L layers
    P_L = h*n_h*d_h (q) + 2*h*n_kv*d_h (k, v) + n_h*d_h*h (o) + 3*h*I (gated MLP) + 2h (norms)
    W_L = b * P_L                       weight bytes of one decoder layer
    W_E = b * V * h                     embedding (first stage);  W_H = b * (V*h + h) lm_head + norm
                                        (last stage; no V*h when embeddings are tied)
    kappa = 2 * n_kv * d_h * b          K+V bytes per token per layer
Per node of GPU g with TP t (memory M, FLOP/s F, bandwidth B, interconnect X):
    U = t * (u * M - R)                 usable bytes; u = --gpu-memory-utilization, R = runtime
                                        reserve per GPU (activations, CUDA context/graphs)
    KV(k) = (U - k*W_L - extras) / (k * kappa)     tokens of KV a stage with k layers holds
    max_layers = largest k with KV(k) >= max_model_len (vLLM refuses to start otherwise)
Stage times (k layers, batch of B sequences of mean context s; eta_c, eta_m efficiencies):
    t_dec(k, B, s) = k * max(2*P_L*B / (t*F*eta_c), (W_L + B*s*kappa) / (t*B_mem*eta_m))
                     + k * 2 * allreduce(B*h*b)  (t > 1: ring, 2(t-1)/t * bytes / X + alpha)
    t_pre(k, p)    = k * max((2*P_L*p + 2*p*p*n_h*d_h) / (t*F*eta_c), W_L / (t*B_mem*eta_m))
                     + k * 2 * allreduce(p*h*b)
Replica = chain of d stages, same TP (what vLLM runs). For a workload with I input, O output tokens
and mean context s = I + O/2:
    C   = min(max_num_seqs, min_i KV_i / s)                    concurrency (vLLM's KV minimum)
    b   = C / d                                                micro-batch in flight per stage
    D   = min(b / max_i t_dec_i(b), C / (sum_i t_dec_i(b) + sum hops))   decode tokens/s
          (the first term is the bottleneck stage, the second the depth/latency bound)
    tau = max_i t_pre_i(chunk) / chunk                          prefill seconds per prompt token
    h   = 1 / (I * tau + O / D)                                requests/s: prefill and decode
                                                               share the engine (chunked prefill)
    TTFT = sum_i t_pre_i(I) + hops;  TPOT = C / D
The efficiencies and reserve are round numbers from public vLLM measurements, not fits: this
model ranks configurations; measured profiles (spec `profiles:`) override its absolute numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetcompile.ir.problem import GpuType, ModelArch, PerfEntry

ETA_COMPUTE = 0.5  # achievable fraction of tensor FLOP/s in prefill-heavy batches
ETA_MEMORY = 0.7  # achievable fraction of memory bandwidth in decode
RESERVE_BYTES = 1.5e9  # per GPU: CUDA context, activations, CUDA graphs (vLLM profiling run)
ALLREDUCE_LATENCY_S = 15e-6  # per all-reduce launch + sync inside a node
PREFILL_CHUNK = 2048  # tokens per prefill chunk (vLLM's chunked prefill budget order)
STEP_OVERHEAD_S = 2e-3  # scheduler + sampling per engine step (python side of vLLM)


def layer_params(a: ModelArch) -> float:
    attn = a.hidden * a.heads * a.head_dim * 2 + 2 * a.hidden * a.kv_heads * a.head_dim
    return attn + 3 * a.hidden * a.intermediate + 2 * a.hidden


def total_params(a: ModelArch) -> float:
    return a.layers * layer_params(a) + a.vocab * a.hidden * (1 if a.tie_embeddings else 2) + a.hidden


def perf_entry(model: str, arch: ModelArch, b: int, gpu: GpuType, tp: int, util: float, max_model_len: int) -> PerfEntry:
    """Memory facts of one node (gpu x tp) for one model: the profile pass's table row."""
    usable = tp * (util * gpu.memory - RESERVE_BYTES)
    layer_bytes = b * layer_params(arch)
    embed = b * arch.vocab * arch.hidden
    head = b * (arch.hidden + (0 if arch.tie_embeddings else arch.vocab * arch.hidden))
    kappa = 2.0 * arch.kv_heads * arch.head_dim * b
    # a middle stage with k layers must hold its weights plus one max-length sequence of KV
    max_layers = int(max(0.0, usable) // (layer_bytes + kappa * max_model_len))
    return PerfEntry(
        model=model, gpu=gpu.name, tp=tp, usable_bytes=usable, layer_bytes=layer_bytes, embed_bytes=embed,
        head_bytes=head, kv_bytes_per_token_layer=kappa, max_layers=min(max_layers, arch.layers),
    )


def stage_extras(e: PerfEntry, first: bool, last: bool) -> float:
    return (e.embed_bytes if first else 0.0) + (e.head_bytes if last else 0.0)


def stage_kv_tokens(e: PerfEntry, layers: int, first: bool, last: bool) -> float:
    """KV(k): tokens of KV cache a stage holds (<= 0 when the weights do not fit)."""
    free = e.usable_bytes - layers * e.layer_bytes - stage_extras(e, first, last)
    return free / (layers * e.kv_bytes_per_token_layer) if layers > 0 else math.inf


def balanced_partition(e: PerfEntry, layers: int, stages: int, max_model_len: int) -> tuple[int, ...] | None:
    """Layer counts per stage that maximize the minimum KV over stages (vLLM takes the minimum).

    Same-type stages differ only by the embedding (first) and lm_head (last), so the balanced
    split gives the end stages fewer layers when those weights are large (seed 003 App. D:
    partition by memory). Greedy: hand out layers one at a time to the stage whose KV stays
    largest after taking it. None if no split fits one max-length sequence on every stage.
    """
    if stages > layers:
        return None
    counts = [1] * stages
    for _ in range(layers - stages):
        best = max(
            range(stages),
            key=lambda i: (stage_kv_tokens(e, counts[i] + 1, i == 0, i == stages - 1), -i if i else -stages),
        )
        counts[best] += 1
    if min(stage_kv_tokens(e, c, i == 0, i == stages - 1) for i, c in enumerate(counts)) < max_model_len:
        return None
    return tuple(counts)


def _allreduce(nbytes: float, gpu: GpuType, tp: int) -> float:
    if tp <= 1:
        return 0.0
    return 2.0 * (tp - 1) / tp * nbytes / gpu.interconnect + ALLREDUCE_LATENCY_S


def decode_step_time(arch: ModelArch, b: int, gpu: GpuType, tp: int, layers: int, batch: float, ctx: float) -> float:
    p = layer_params(arch)
    kappa = 2.0 * arch.kv_heads * arch.head_dim * b
    compute = 2.0 * p * batch / (tp * gpu.flops * ETA_COMPUTE)
    memory = (b * p + batch * ctx * kappa) / (tp * gpu.mem_bw * ETA_MEMORY)
    return layers * (max(compute, memory) + 2 * _allreduce(batch * arch.hidden * b, gpu, tp))


def prefill_time(arch: ModelArch, b: int, gpu: GpuType, tp: int, layers: int, tokens: float) -> float:
    p = layer_params(arch)
    flops = 2.0 * p * tokens + 2.0 * tokens * tokens * arch.heads * arch.head_dim
    compute = flops / (tp * gpu.flops * ETA_COMPUTE)
    memory = b * p / (tp * gpu.mem_bw * ETA_MEMORY)
    return layers * (max(compute, memory) + 2 * _allreduce(tokens * arch.hidden * b, gpu, tp))


@dataclass(frozen=True)
class ChainEstimate:
    """Capacity of one chain for one workload (the formulas in the module docstring)."""

    concurrency: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    requests_per_s: float
    binding: str  # "bottleneck-stage" | "depth" | "max-num-seqs"
    ttft_s: float
    tpot_s: float


def chain_estimate(
    arch: ModelArch,
    b: int,
    stages: list[tuple[GpuType, int, int, float]],  # (gpu, tp, layers, kv_tokens)
    hop_latency_s: float,
    hop_bandwidth: float,
    input_tokens: float,
    output_tokens: float,
    max_num_seqs: int,
) -> ChainEstimate:
    d = len(stages)
    ctx = input_tokens + output_tokens / 2.0
    kv_min = min(s[3] for s in stages)
    conc_kv = kv_min / ctx
    conc = max(min(float(max_num_seqs), conc_kv), 1e-9)
    mb = conc / d
    times = [decode_step_time(arch, b, g, tp, k, mb, ctx) + STEP_OVERHEAD_S / d for g, tp, k, _ in stages]
    # one activation vector per sequence crosses each hop per step
    hop = (d - 1) * (hop_latency_s + mb * arch.hidden * b / hop_bandwidth) if d > 1 else 0.0
    bottleneck = mb / max(times)
    depth = conc / (sum(times) + hop)
    decode = min(bottleneck, depth)
    chunk = PREFILL_CHUNK
    tau = max(prefill_time(arch, b, g, tp, k, chunk) for g, tp, k, _ in stages) / chunk
    h = 1.0 / (input_tokens * tau + output_tokens / decode)
    if conc_kv >= max_num_seqs:
        binding = "max-num-seqs"
    else:
        binding = "bottleneck-stage" if bottleneck <= depth else "depth"
    ttft = sum(prefill_time(arch, b, g, tp, k, input_tokens) for g, tp, k, _ in stages) + hop
    return ChainEstimate(
        concurrency=conc, decode_tokens_per_s=decode, prefill_tokens_per_s=1.0 / tau, requests_per_s=h,
        binding=binding, ttft_s=ttft, tpot_s=conc / decode,
    )
