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
Stage times use perf/stepmodel.py's per-layer form. Where NVIDIA's measured vLLM kernel tables
cover the (model shape, GPU, TP), its coefficients are the tables' (perf/kernels.py, source
`kernels`); elsewhere they are the roofline with these coefficients per layer on t GPUs (F FLOP/s,
B_mem bytes/s, X interconnect bytes/s; eta_c, eta_m achievable fractions, held inside ETA_BOUNDS):
    w = b P_L / (t B_mem eta_m)      k = kappa / (t B_mem eta_m)
    f = 2 P_L / (t F eta_c)          a = 4 n_h d_h / (t F eta_c)     (causal attention pairs)
    c = 2 * 2 (t-1)/t * h b / X      c0 = 2 * all-reduce latency      (two ring all-reduces; t > 1)
and a replica's capacity per workload is perf/capacity.py's (C = KV minimum / context, micro-batch
C/d, the slowest stage or the round trip, TTFT over the prompt's chunks, TPOT = C / X).
The roofline's efficiencies are fitted on published vLLM measurements of GPUs without kernel
tables (bench/fidelity.py --fit), inside physical bounds; measured profiles (spec `profiles:`)
override both sources.
"""

from __future__ import annotations

import functools
import math
from importlib import resources

import yaml

from hetcompile.perf import kernels
from hetcompile.perf.types import SAFE_LOADER, GpuType, ModelArch, PerfEntry
from hetcompile.perf.stepmodel import Hop, LayerCost, ReplicaModel, StageModel

# The calibration (perf/data/calibration.yaml, written by `python bench/fidelity.py --fit`: least squares
# on the training split of bench/data/fidelity.yaml, validated on the held-out split): host overheads
# and the default efficiencies of a GPU without its own fitted values (the medians of the fitted GPUs').
_CALIBRATION = yaml.load(resources.files("hetcompile.perf").joinpath("data/calibration.yaml").read_text(), Loader=SAFE_LOADER)
# The roofline's efficiencies for a GPU with neither kernel tables nor fitted values of its own: the
# medians of the roofline GPUs that were fitted on published measurements (calibration.yaml, written by
# bench/fidelity.py --fit: the GPUs a kernel-less GPU resembles), else of what the measured kernel
# tables imply at TP1 on the GPUs that have them (perf/kernels.roofline_defaults, also the fit's prior).
_KERNEL_DEFAULTS = kernels.roofline_defaults()
ETA_COMPUTE = float(_CALIBRATION.get("eta_compute_default", _KERNEL_DEFAULTS["eta_compute"]))  # of dense tensor FLOP/s
ETA_MEMORY = float(_CALIBRATION.get("eta_memory_default", _KERNEL_DEFAULTS["eta_memory"]))  # of memory bandwidth
# s: a step's compute and memory traffic overlap only partly. The measured kernel tables demand it:
# fitted to them (scripts/kernel_tables.py), s is 0.55-0.66 at TP1 on every GPU with tables (GEMMs of
# a few hundred tokens are neither at the bandwidth nor at the FLOP roofline); the roofline takes
# their median.
SERIAL_FRACTION = _KERNEL_DEFAULTS["serial_fraction"]
# Physical bounds on the roofline's efficiencies (fraction of dense peak FLOP/s, of memory
# bandwidth): what tuned GEMM and decode-attention kernels reach on every GPU with measured tables.
# bench/fidelity.py --fit holds fitted values inside them; tests/test_fidelity.py checks the catalog.
ETA_BOUNDS = {"compute": (0.45, 0.80), "memory": (0.60, 0.92)}
# GPUs with published vLLM measurements carry their own eta_memory / eta_compute in the catalog
# (perf/data/gpus.yaml, with the measurement cited in `eta_source`); the defaults above stand in for
# the others (bench/fidelity.py reports the leave-one-GPU-out error of doing so).
RESERVE_BYTES = 1.5e9  # per GPU: CUDA context, activations, CUDA graphs (vLLM profiling run)
ALLREDUCE_LATENCY_S = 15e-6  # per all-reduce launch + sync inside an NVLink node
NVLINK_MIN_BYTES_PER_S = 100e9  # interconnects at least this fast are NVLink; slower ones are PCIe
# PCIe all-reduce (no NVLink): NCCL over PCIe switches (often host-bridged in cloud VMs without P2P)
# reaches a fraction of the x16 link and costs far more per launch. Calibrated on the one public
# TP-over-PCIe prefill point we have (issue 10: L4 TP2 prefill speed-up measured 1.25x where the
# ideal-link model predicts 1.83x) and checked against the A10G TP2 row of bench/data/fidelity.yaml.
PCIE_ALLREDUCE_EFFICIENCY = 0.2
PCIE_ALLREDUCE_LATENCY_S = 50e-6
PREFILL_CHUNK = 2048  # tokens per prefill chunk (vLLM's chunked prefill budget order)
STEP_OVERHEAD_S = float(_CALIBRATION["step_overhead_s"])  # o: scheduler + sampling per engine step
# q: host CPU per sequence per engine step (input prep, sampling, detokenizing and streaming its token);
# was 42 us read off one CPU-bound L4 host, now fitted over every host in the training rows
SEQ_OVERHEAD_S = float(_CALIBRATION["seq_overhead_s"])
# g: GPU work per engine step that the per-layer kernels leave out (sampler, input copies, launch gaps)
STEP_GPU_S = float(_CALIBRATION.get("step_gpu_s", 0.0))
IDEAL_STEP_OVERHEAD_S = 2e-3  # the uncalibrated model's step overhead (bench/fidelity.py baseline)
# r: per request, once, on the TTFT path: HTTP + tokenization + scheduling + first-token streaming
# (the OpenAI server's cost that an engine-step model does not see; vLLM bench serve's TTFT includes it)
REQUEST_OVERHEAD_S = float(_CALIBRATION["request_overhead_s"])


def step_token_budget(max_num_seqs: int) -> int:
    """Tokens one engine step may batch: the plan's chunk_tokens, and the `--max-num-batched-tokens`
    its launch scripts pass, so vLLM runs the budget the plan was sized with instead of its own
    per-GPU default (0.33: 8192 on >= 70 GiB cards other than A100, 2048 elsewhere). vLLM refuses a
    budget below --max-num-seqs, hence the max."""
    return max(PREFILL_CHUNK, max_num_seqs)


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


def stage_free_bytes(e: PerfEntry, layers: int, first: bool, last: bool) -> float:
    """Bytes a stage of `layers` layers has left for KV: usable memory less its weights (the
    embedding on the first stage, the lm_head on the last)."""
    return e.usable_bytes - layers * e.layer_bytes - stage_extras(e, first, last)


def stage_kv_tokens(e: PerfEntry, layers: int, first: bool, last: bool) -> float:
    """KV(k): tokens of KV cache a stage holds (<= 0 when the weights do not fit)."""
    free = stage_free_bytes(e, layers, first, last)
    return free / (layers * e.kv_bytes_per_token_layer) if layers > 0 else math.inf


def stage_kv_token_layers(e: PerfEntry, layers: int, first: bool, last: bool) -> float:
    """KV(k) x k: token-layers of KV cache a stage holds (placement's tables: Helix's unit)."""
    return stage_free_bytes(e, layers, first, last) / e.kv_bytes_per_token_layer


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


def efficiencies(gpu: GpuType, ideal: bool = False) -> tuple[float, float]:
    """(eta_compute, eta_memory) of a GPU: its calibrated catalog values, else the defaults, capped so
    that a GPU without measurements is never faster than a measured one that is at least as strong
    (measured_ceiling): H100 is no slower than a weaker card's guess, and an A40 no faster than the
    A6000 that was measured."""
    if ideal:
        return 0.5, 0.7  # the uncalibrated model's round numbers
    if gpu.eta_compute is not None and gpu.eta_memory is not None:
        return gpu.eta_compute, gpu.eta_memory
    cap_c, cap_m = measured_ceiling(gpu.flops, gpu.mem_bw, gpu.memory)
    return min(gpu.eta_compute or ETA_COMPUTE, cap_c), min(gpu.eta_memory or ETA_MEMORY, cap_m)


@functools.cache
def measured_ceiling(flops: float, mem_bw: float, memory: float) -> tuple[float, float]:
    """The most (eta_compute, eta_memory) a GPU of these peaks may be given without measurements of its
    own: over every catalog GPU that is measured (fitted efficiencies, or kernel tables) and has at
    least these FLOP/s, bandwidth and memory, the smallest achieved FLOP/s and bandwidth, as fractions
    of these peaks (1 where no such GPU exists). A guess never ranks above a measurement of stronger
    hardware."""
    from hetcompile.perf import catalog

    cap_c = cap_m = 1.0
    for name in catalog.gpu_names():
        g = catalog.lookup_gpu(name)
        if g is None or g.flops < flops or g.mem_bw < mem_bw or g.memory < memory:
            continue
        got = kernels.gpu_efficiencies(name) or (
            (g.eta_compute, g.eta_memory) if g.eta_compute is not None and g.eta_memory is not None else None)
        if got is not None:
            cap_c, cap_m = min(cap_c, got[0] * g.flops / flops), min(cap_m, got[1] * g.mem_bw / mem_bw)
    return cap_c, cap_m


def allreduce_link(gpu: GpuType, ideal: bool = False) -> tuple[float, float]:
    """(effective bytes/s, seconds per launch) of one TP all-reduce inside a node of `gpu`."""
    if ideal or gpu.interconnect >= NVLINK_MIN_BYTES_PER_S:
        return gpu.interconnect, ALLREDUCE_LATENCY_S
    return gpu.interconnect * PCIE_ALLREDUCE_EFFICIENCY, PCIE_ALLREDUCE_LATENCY_S


def layer_cost(arch: ModelArch, b: int, gpu: GpuType, tp: int, ideal: bool = False) -> LayerCost:
    """The roofline coefficients of one decoder layer on `tp` GPUs of `gpu` (perf/stepmodel.py).

    The measured kernel tables' fit where they cover the shape (perf/kernels.py), else the roofline.
    `ideal`: the uncalibrated roofline (default efficiencies, PCIe as fast as its datasheet), kept
    so bench/fidelity.py can measure what calibration buys."""
    if not ideal and (hit := kernels.lookup(arch, b, gpu.name, tp)) is not None:
        return hit[0]
    return roofline_cost(arch, b, gpu, tp, ideal)


def roofline_cost(arch: ModelArch, b: int, gpu: GpuType, tp: int, ideal: bool = False) -> LayerCost:
    """The roofline coefficients (module docstring) whatever the kernel tables hold: the fallback,
    and what bench/fidelity.py compares the tables with."""
    p = layer_params(arch)
    kappa = 2.0 * arch.kv_heads * arch.head_dim * b
    eta_c, eta_m = efficiencies(gpu, ideal)
    flops, bw = tp * gpu.flops * eta_c, tp * gpu.mem_bw * eta_m
    link, launch = allreduce_link(gpu, ideal)
    # two all-reduces per layer (attention out, MLP out), ring: 2 (t-1)/t of the activations each
    comm = 2 * 2.0 * (tp - 1) / tp * arch.hidden * b / link if tp > 1 else 0.0
    return LayerCost(
        weights_s=b * p / bw, kv_s_per_token=kappa / bw, flop_s_per_token=2.0 * p / flops,
        attn_s_per_pair=4.0 * arch.heads * arch.head_dim / flops, comm_s_per_token=comm,
        comm_s=2 * launch if tp > 1 else 0.0, serial_fraction=0.0 if ideal else SERIAL_FRACTION,
    )


def head_time(arch: ModelArch, b: int, gpu: GpuType, tp: int) -> float:
    """Seconds per step for the last stage's lm_head (V x h) and once-per-step work: the kernel
    tables' fitted h where they cover the shape, else reading the lm_head at eta_m (~7% of an 8B
    model's step)."""
    if (hit := kernels.lookup(arch, b, gpu.name, tp)) is not None:
        return hit[1]
    return b * arch.vocab * arch.hidden / (tp * gpu.mem_bw * efficiencies(gpu)[1])


def replica_model(
    arch: ModelArch,
    b: int,
    stages: list[tuple[GpuType, int, int, float]],  # (gpu, tp, layers, kv_tokens)
    hop_latency_s: float,
    hop_bandwidth: float,
    max_num_seqs: int,
    ideal: bool = False,
) -> ReplicaModel:
    """A chain of same-link stages as a step-time model with the analytic coefficients."""
    return ReplicaModel(
        stages=tuple(StageModel(gpu=g.name, tp=tp, layers=k, kv_tokens=kv, cost=layer_cost(arch, b, g, tp, ideal),
                                head_s=0.0 if ideal or i < len(stages) - 1 else head_time(arch, b, g, tp))
                     for i, (g, tp, k, kv) in enumerate(stages)),
        hops=tuple(Hop(latency_s=hop_latency_s, bandwidth=hop_bandwidth) for _ in stages[1:]),
        activation_bytes=float(arch.hidden * b),
        step_overhead_s=IDEAL_STEP_OVERHEAD_S if ideal else STEP_OVERHEAD_S, max_num_seqs=max_num_seqs,
        seq_overhead_s=0.0 if ideal else SEQ_OVERHEAD_S, step_gpu_s=0.0 if ideal else STEP_GPU_S,
        chunk_tokens=step_token_budget(max_num_seqs), request_overhead_s=0.0 if ideal else REQUEST_OVERHEAD_S, source="analytic",
    )
