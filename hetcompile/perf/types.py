"""Hardware and model facts the performance model reads: GPU types, model architectures, and
what one node of a GPU type can hold of a model (`PerfEntry`).

These are the perf layer's own types (the catalog fills them, the analytic model and the
profile pass read them); the problem IR (ir/problem.py) carries them, so perf depends on nothing
above it.
"""

from __future__ import annotations

from typing import Annotated

import yaml
from pydantic import Field

from hetcompile.frozen import Frozen

# libyaml's loader where PyYAML was built with it (the same safe schema, ~10x faster: the catalogs and
# kernel tables are read by every build)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class GpuType(Frozen):
    name: Annotated[str, Field(description="canonical GPU type id")]
    sky_name: Annotated[str, Field(description="SkyPilot accelerator name")]
    memory: Annotated[float, Field(gt=0, description="bytes per GPU")]
    flops: Annotated[float, Field(gt=0, description="dense FP16 tensor FLOP/s")]
    mem_bw: Annotated[float, Field(gt=0, description="memory bandwidth, bytes/s")]
    interconnect: Annotated[float, Field(gt=0, description="GPU-GPU bandwidth inside a node, bytes/s")]
    bf16: Annotated[bool, Field(description="supports bfloat16")]
    price_per_hour: Annotated[float | None, Field(description="catalog $ per GPU-hour")] = None
    source: Annotated[str, Field(description="where the numbers come from")] = ""
    eta_memory: Annotated[float | None, Field(gt=0, le=1, description="achieved fraction of mem_bw in decode (None: the model's default)")] = None
    eta_compute: Annotated[float | None, Field(gt=0, le=1, description="achieved fraction of flops in prefill (None: the model's default)")] = None
    compute_capability: Annotated[str | None, Field(description="CUDA compute capability, e.g. '8.0' (None: unknown)")] = None


class ModelArch(Frozen):
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_context: int
    tie_embeddings: bool
    source: str = ""


class PerfEntry(Frozen):
    """profile: what one node of `gpu` with TP `tp` can do for `model` (analytic or measured)."""

    model: str
    gpu: str
    tp: int
    usable_bytes: Annotated[float, Field(description="memory for weights+KV on the node (all tp GPUs)")]
    layer_bytes: Annotated[float, Field(description="weights of one decoder layer")]
    embed_bytes: Annotated[float, Field(description="embedding weights (first stage)")]
    head_bytes: Annotated[float, Field(description="lm_head + final norm weights (last stage)")]
    kv_bytes_per_token_layer: Annotated[float, Field(description="K+V bytes for one token in one layer")]
    max_layers: Annotated[int, Field(description="layers a middle stage holds with KV for one max-length sequence")]
