"""Step times from measured kernels: perf/data/kernels.json, the step model's `kernels` source.

NVIDIA's aiconfigurator-core measures vLLM's kernels (GEMMs, context and generation attention,
all-reduce) per GPU and estimates one forward pass from them. scripts/kernel_tables.py evaluates
that estimator on a grid of engine steps for every catalog model, GPU with tables and TP, and fits
perf/stepmodel.py's per-layer form to it:

    T(step) = L * layer(n, S, A) + h          (n tokens, S decode context tokens, A attention pairs;
                                               h: the lm_head and what runs once per step)

so every consumer (placement's search, perf/capacity.py, perf/tail.py, the simulator) reads the
kernel-based step times through the same coefficients as the roofline's. An entry applies to any
model with the same shapes (layers, hidden, intermediate, heads, KV heads, head dim, vocab) in 16-bit
weights; `fit` records its error against the tables over its 72-107 grid steps (the entries'
medians: 2.8% typical, 1.9-4.9% for the middle 80%; their p90s 5.6-12.6%).

Which GPUs have tables, and at which vLLM version, is `systems` in the data file (H100, H200 and
L40S at vLLM 0.24; A100-80GB at vLLM 0.14). Every other GPU, and shapes the tables lack, use the
roofline (perf/analytic.py).
"""

from __future__ import annotations

import functools
import json
from importlib import resources

from hetcompile.perf.stepmodel import LayerCost
from hetcompile.perf.types import ModelArch

ARCH_KEYS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab")
KERNEL_BYTES = 2  # the tables are bf16 kernels: fp16 and bf16 weights alike


def arch_key(arch: ModelArch) -> tuple[int, ...]:
    return tuple(int(getattr(arch, k)) for k in ARCH_KEYS)


@functools.cache
def table() -> dict:
    """The data file as loaded: {'systems': ..., 'entries': {(gpu, tp, arch_key): (LayerCost, head_s, fit)}}."""
    doc = json.loads(resources.files("hetcompile.perf").joinpath("data/kernels.json").read_text())
    entries = {}
    for e in doc["entries"]:
        key = (e["gpu"], int(e["tp"]), tuple(int(e["arch"][k]) for k in ARCH_KEYS))
        entries[key] = (LayerCost(**e["cost"], source="kernels"), float(e["head_s"]), e["fit"])
    return {"systems": doc["systems"], "version": doc["aiconfigurator_core"], "entries": entries}


def lookup(arch: ModelArch, b: int, gpu: str, tp: int) -> tuple[LayerCost, float] | None:
    """(per-layer cost, head seconds) from the kernel tables, or None where they have no entry."""
    if b != KERNEL_BYTES:
        return None
    hit = table()["entries"].get((gpu, tp, arch_key(arch)))
    return None if hit is None else (hit[0], hit[1])


def gpus() -> dict[str, str]:
    """{catalog GPU: 'aiconfigurator system, vLLM version'} of the GPUs with kernel tables."""
    return {g: f"{v['system']}, vLLM {v['vllm']}" for g, v in table()["systems"].items()}


def implied_efficiencies(gpu: str, tp: int, arch: ModelArch) -> dict[str, float] | None:
    """What the kernel fit of (gpu, tp, arch) implies in the roofline's terms (perf/analytic.py):
    eta_memory = weight bytes / (w x bandwidth), eta_compute = dense FLOPs per token / (f x peak),
    and its s. None without an entry."""
    from hetcompile.perf import catalog

    hit = table()["entries"].get((gpu, tp, arch_key(arch)))
    g = catalog.lookup_gpu(gpu)
    if hit is None or g is None:
        return None
    cost = hit[0]
    p = arch.hidden * arch.heads * arch.head_dim * 2 + 2 * arch.hidden * arch.kv_heads * arch.head_dim \
        + 3 * arch.hidden * arch.intermediate
    return {"eta_memory": KERNEL_BYTES * p / (tp * g.mem_bw * cost.weights_s),
            "eta_compute": 2.0 * p / (tp * g.flops * cost.flop_s_per_token),
            "serial_fraction": cost.serial_fraction}


@functools.cache
def _implied_tp1(gpu: str | None) -> dict[str, float]:
    """Medians of implied_efficiencies over the TP1 entries of `gpu` (None: of every GPU)."""
    import statistics

    from hetcompile.perf import catalog

    archs: dict[tuple[int, ...], ModelArch] = {}
    for name in catalog.model_names():  # the first catalog model of each architecture, as the table keys them
        if (found := catalog.lookup_model(name)) is not None:
            archs.setdefault(arch_key(found[2]), found[2])
    vals: dict[str, list[float]] = {"eta_memory": [], "eta_compute": [], "serial_fraction": []}
    for g, tp, key in table()["entries"]:
        if tp != 1 or (gpu is not None and g != gpu):
            continue
        arch = archs.get(key)
        imp = implied_efficiencies(g, tp, arch) if arch is not None else None
        for k, v in (imp or {}).items():
            vals[k].append(v)
    return {k: round(statistics.median(v), 3) for k, v in vals.items() if v}


def roofline_defaults() -> dict[str, float]:
    """Medians over every TP1 entry of implied_efficiencies: the roofline's starting point (the
    fit's prior): what tuned vLLM kernels reach on the GPUs that were measured, not round numbers."""
    return _implied_tp1(None)


def gpu_efficiencies(gpu: str) -> tuple[float, float] | None:
    """(eta_compute, eta_memory) the kernel tables imply for `gpu` at TP1 (medians over its models),
    None without tables: how a GPU with tables ranks against the roofline's GPUs."""
    got = _implied_tp1(gpu) if gpu in table()["systems"] else {}
    return (got["eta_compute"], got["eta_memory"]) if got else None
