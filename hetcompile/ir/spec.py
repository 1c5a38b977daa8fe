"""The user-facing spec: pydantic models of `spec.yaml`, lenient units, strict keys.

This is the contract of docs/DESIGN.md §Spec. Values are read leniently ("80GB", "$2.99/h",
"10Gbps", "150ms", "4/s", "1%") and stored as SI numbers (bytes, $/h for prices, bytes/s,
seconds, 1/s, fractions), so a unit mistake is reported at the field that holds it. Unknown
keys are errors (extra="forbid"); the loader adds line/column and a did-you-mean.
`schemas/spec.schema.json` is generated from these models (`hetcompile schema`).

Prices: an offer's `price` is dollars per GPU-hour (as in seed 003, p_n); the budget is dollars
per hour for the whole plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Callable, Literal

from annotated_types import GroupedMetadata
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from hetcompile.perf.tail import DEFAULT_MAX_UTILIZATION, DEFAULT_TTFT_SLOWDOWN
from hetcompile.plan.doc import Percentile
from hetcompile.ir import units
from hetcompile.names import Name, PlanName

_UNIT_SCHEMA = {"anyOf": [{"type": "number"}, {"type": "string"}]}


def _schema(example: str) -> WithJsonSchema:
    return WithJsonSchema({**_UNIT_SCHEMA, "examples": [example]})


class _Unit(GroupedMetadata):
    """A unit type's validator and JSON schema as one `Annotated` item (pydantic unpacks it), so that
    `Bytes = Annotated[float, _unit(...)]` is a type alias a type checker reads as float."""

    def __init__(self, *metadata: object) -> None:
        self.metadata = metadata

    def __iter__(self) -> Iterator[object]:
        return iter(self.metadata)


def _unit(parse: Callable[[object], float], what: str, example: str, *, gt: float | None = None,
          ge: float | None = None, lt: float | None = None, le: float | None = None) -> _Unit:
    """A unit type that carries its bounds: parse leniently, then refuse NaN, infinities and values
    out of range with the user's own text ("rate must be > 0, got -3/s"), so `validate` and `build`
    stop at the same line and column and no pass ever sees such a number."""

    def check(value: object) -> float:
        x = parse(value)
        got = value if isinstance(value, str) else f"{value}"
        if not math.isfinite(x):
            raise units.UnitError(f"{what} must be a finite number, got {got}")
        for ok, op, bound in ((gt is None or x > gt, ">", gt), (ge is None or x >= ge, ">=", ge),
                              (lt is None or x < lt, "<", lt), (le is None or x <= le, "<=", le)):
            if not ok:
                raise units.UnitError(f"{what} must be {op} {bound:g}, got {got}")
        return x

    bounds = {k: v for k, v in (("exclusiveMinimum", gt), ("minimum", ge), ("exclusiveMaximum", lt),
                                ("maximum", le)) if v is not None}
    schema = {"anyOf": [{"type": "number", **bounds}, {"type": "string"}], "examples": [example]}
    return _Unit(BeforeValidator(check), WithJsonSchema(schema))


Bytes = Annotated[float, _unit(units.parse_bytes, "a size", "80GB", gt=0)]
Bandwidth = Annotated[float, _unit(units.parse_bandwidth, "a bandwidth", "10Gbps", gt=0)]
Latency = Annotated[float, _unit(units.parse_duration, "a latency", "1ms", ge=0)]
Duration = Annotated[float, _unit(units.parse_duration, "a duration", "150ms", gt=0)]
LatencyTarget = Annotated[float, _unit(units.parse_latency_target, "a latency target", "80ms", gt=0)]
StepTime = Annotated[float, _unit(units.parse_duration, "a step time", "0.4ms", ge=0)]
PricePerHour = Annotated[float, _unit(units.parse_price_per_hour, "a price", "$2.99/h", ge=0)]
Rate = Annotated[float, _unit(units.parse_rate, "a rate", "4/s", gt=0)]
MeasuredRate = Annotated[float, _unit(units.parse_rate, "a measured rate", "2.4/s", ge=0)]
Share = Annotated[float, _unit(units.parse_fraction, "a share", "70%", gt=0, le=1)]
Gap = Annotated[float, _unit(units.parse_fraction, "a gap", "1%", ge=0, lt=1)]
Fraction = Annotated[float, _unit(units.parse_fraction, "a fraction", "1%", ge=0, le=1)]
# Hetis's selection threshold: a GPU stays out of a replica when removing it raises the dense cost
# by less than delta, so delta < 1 (100% would leave out every GPU that does not double the speed)
Delta = Annotated[float, _unit(
    units.parse_fraction, "placement delta (Hetis's selection threshold; 5% is its default, 0 keeps every GPU)", "5%", ge=0, lt=1,
)]

# Upper bounds of counts: far above any real deployment, low enough that no pass overflows a
# solver's int32 or builds an absurd table from a typo.
MAX_TOKENS = 10_000_000
INT32 = 2**31 - 1

Objective = Literal["max-throughput", "min-cost", "max-throughput-per-dollar", "min-makespan"]
Dtype = Literal["auto", "fp16", "bf16", "float16", "bfloat16"]
Cloud = Literal[
    "aws", "gcp", "azure", "lambda", "runpod", "vast", "oci", "nebius", "fluidstack", "paperspace",
    "cudo", "do", "kubernetes", "ssh",
]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ArchitectureSpec(_Spec):
    """Transformer shape of a model not in the catalog (Hugging Face config.json names in comments)."""

    layers: Annotated[int, Field(gt=0, le=10_000, description="num_hidden_layers")]
    hidden: Annotated[int, Field(gt=0, le=1_000_000, description="hidden_size")]
    intermediate: Annotated[int, Field(gt=0, le=10_000_000, description="intermediate_size (gated MLP)")]
    heads: Annotated[int, Field(gt=0, le=10_000, description="num_attention_heads")]
    kv_heads: Annotated[int, Field(gt=0, le=10_000, description="num_key_value_heads")]
    head_dim: Annotated[int | None, Field(default=None, gt=0, le=100_000, description="head_dim (default hidden/heads)")] = None
    vocab: Annotated[int, Field(gt=0, le=100_000_000, description="vocab_size")]
    max_context: Annotated[int, Field(default=4096, gt=0, le=MAX_TOKENS, description="max_position_embeddings")] = 4096
    tie_embeddings: Annotated[bool, Field(default=False, description="tie_word_embeddings")] = False


class ModelSpec(_Spec):
    name: Annotated[Name, Field(description="catalog id (e.g. llama-3.1-8b) or a new name with `architecture`")]
    weights: Annotated[
        str | None, Field(default=None, description="Hugging Face repo id or local path vLLM loads (default: catalog)")
    ] = None
    dtype: Annotated[Dtype, Field(default="auto", description="auto picks bf16, or fp16 when a pre-Ampere GPU serves it")] = "auto"
    architecture: Annotated[
        ArchitectureSpec | None, Field(default=None, description="shape of a model that is not in the catalog")
    ] = None
    served_name: Annotated[str | None, Field(default=None, description="name clients send (default: `name`)")] = None
    max_model_len: Annotated[
        int | None, Field(default=None, gt=0, le=MAX_TOKENS, description="vLLM --max-model-len (default: fits the largest workload)")
    ] = None
    tp: Annotated[
        int | tuple[int, ...] | None,
        Field(default=None, description="pin --tensor-parallel-size: one degree (e.g. 4) or the degrees allowed (e.g. [2, 4]); "
                                        "default: every power of two that divides the attention heads and fits a node"),
    ] = None
    pp: Annotated[
        int | tuple[int, ...] | None,
        Field(default=None, description="pin --pipeline-parallel-size (nodes per replica): one depth or the depths allowed; "
                                        "default: the fewest nodes that hold the model, and one more"),
    ] = None


class SloSpec(_Spec):
    """Latency targets that `percentile` of the workload's requests meet (default p99: almost every one)."""

    ttft: Annotated[LatencyTarget | None, Field(default=None, description="time to first token target, e.g. 2s")] = None
    tpot: Annotated[LatencyTarget | None, Field(default=None, description="time per output token target, e.g. 80ms")] = None
    percentile: Annotated[
        Percentile,
        Field(default="p99", description="share of requests each target holds for: p99 (default) means 99 in 100"),
    ] = "p99"


class HeaderMatchSpec(_Spec):
    name: Annotated[str, Field(description="HTTP header name")]
    value: Annotated[str, Field(description="header value that selects this workload")]


class MatchSpec(_Spec):
    """How the router recognises this workload's requests (default: derived from token means)."""

    prompt_tokens_min: Annotated[int | None, Field(default=None, ge=0, le=MAX_TOKENS, description="prompt tokens >= this")] = None
    prompt_tokens_max: Annotated[int | None, Field(default=None, gt=0, le=MAX_TOKENS, description="prompt tokens < this")] = None
    max_tokens_min: Annotated[int | None, Field(default=None, ge=0, le=MAX_TOKENS, description="max_tokens >= this")] = None
    max_tokens_max: Annotated[int | None, Field(default=None, gt=0, le=MAX_TOKENS, description="max_tokens < this")] = None
    header: Annotated[HeaderMatchSpec | None, Field(default=None, description="header that selects it")] = None


class WorkloadSpec(_Spec):
    name: Annotated[Name, Field(description="workload class name")]
    model: Annotated[Name, Field(description="name of a model in `models`")]
    input_tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS, description="mean prompt tokens")]
    output_tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS, description="mean output tokens")]
    rate: Annotated[Rate | None, Field(default=None, description="arrival rate > 0, e.g. 4/s (min-cost needs it; omit it for a share of the mix)")] = None
    requests: Annotated[
        float | None, Field(default=None, gt=0, le=1e15, description="total requests f_w (min-makespan, seed 003 §4.3)")
    ] = None
    share: Annotated[
        Share | None, Field(default=None, description="share of the traffic mix when no rate is given, in (0, 100%]")
    ] = None
    slo: Annotated[SloSpec | None, Field(default=None, description="latency targets at a percentile: replicas are sized so the "
                                         "percentile of TTFT and TPOT meets them, and the build checks it by simulation")] = None
    match: Annotated[MatchSpec | None, Field(default=None, description="router classification rule")] = None


class OfferSpec(_Spec):
    gpu: Annotated[Name, Field(description="GPU type: catalog id or one defined under `gpus`")]
    gpus_per_node: Annotated[int, Field(default=1, gt=0, le=64, description="GPUs in one node (TP stays inside a node)")] = 1
    max_nodes: Annotated[int, Field(gt=0, le=100_000, description="nodes available (availability a_n = max_nodes x gpus_per_node)")]
    price: Annotated[
        PricePerHour | None, Field(default=None, description="$ per GPU-hour (default: catalog price)")
    ] = None
    owned: Annotated[int, Field(default=0, ge=0, le=100_000, description="nodes already owned (cost 0); <= max_nodes")] = 0
    spot: Annotated[bool, Field(default=False, description="rent as spot instances")] = False


class RegionSpec(_Spec):
    name: Annotated[Name, Field(description="region name, e.g. us-central1")]
    cloud: Annotated[Cloud, Field(description="cloud, or kubernetes / ssh for owned fleets")]
    offers: Annotated[tuple[OfferSpec, ...], Field(min_length=1, description="GPUs that can be had here")]


class LinkSpec(_Spec):
    bandwidth: Annotated[Bandwidth, Field(description="e.g. 10Gbps")]
    latency: Annotated[Latency, Field(description="one-way latency, e.g. 1ms")]


class RegionLinkSpec(_Spec):
    between: Annotated[tuple[Name, Name], Field(description="two region names")]
    bandwidth: Annotated[Bandwidth, Field(description="e.g. 196Mbps")]
    latency: Annotated[Latency, Field(description="one-way latency, e.g. 100ms")]


class NetworkSpec(_Spec):
    intra_region: Annotated[
        LinkSpec, Field(default_factory=lambda: LinkSpec(bandwidth=10e9 / 8, latency=1e-3), description="default 10Gbps, 1ms")
    ]
    inter_region: Annotated[
        LinkSpec, Field(default_factory=lambda: LinkSpec(bandwidth=1e9 / 8, latency=50e-3), description="default 1Gbps, 50ms")
    ]
    links: Annotated[tuple[RegionLinkSpec, ...], Field(default=(), description="per region pair overrides")] = ()


class SolverSpec(_Spec):
    time_limit: Annotated[Duration, Field(default=60.0, description="per solve, e.g. 60s")] = 60.0
    mip_gap: Annotated[Gap, Field(default=1e-4, description="relative MIP gap to stop at, in [0, 100%), e.g. 1%")] = 1e-4
    threads: Annotated[int, Field(default=1, gt=0, le=256, description="solver threads (1 keeps runs reproducible)")] = 1
    seed: Annotated[int, Field(default=0, ge=0, le=INT32, description="solver random seed")] = 0
    node_limit: Annotated[
        int, Field(default=100_000, gt=0, le=INT32, description="branch-and-bound nodes per MILP solve: a work budget that stops "
                   "the same way on every machine (time_limit is only a wall-clock cap)")
    ] = 100_000


class EngineSpec(_Spec):
    """vLLM settings shared by every replica."""

    image: Annotated[
        str, Field(default="docker:vllm/vllm-openai:v0.33.0", description="SkyPilot image_id for GPU nodes")
    ] = "docker:vllm/vllm-openai:v0.33.0"
    gpu_memory_utilization: Annotated[
        float, Field(default=0.92, gt=0, le=1, description="vLLM --gpu-memory-utilization (0.33 default 0.92)")
    ] = 0.92
    max_num_seqs: Annotated[int, Field(default=256, gt=0, le=65_536, description="vLLM --max-num-seqs")] = 256
    port: Annotated[int, Field(default=8000, gt=0, lt=65536, description="port each replica head serves on")] = 8000
    router_port: Annotated[int, Field(default=8080, gt=0, lt=65536, description="port of the bundled router")] = 8080
    disk_size: Annotated[int, Field(default=256, gt=0, le=1_000_000, description="GB of disk per node")] = 256


class GpuSpec(_Spec):
    """A GPU type that is not in the catalog (or overrides a catalog entry)."""

    name: Annotated[Name, Field(description="GPU type id")]
    memory: Annotated[Bytes, Field(description="memory per GPU, e.g. 24GB")]
    fp16_tflops: Annotated[float, Field(gt=0, le=1_000_000, description="dense FP16 tensor TFLOPS")]
    bandwidth: Annotated[Bandwidth, Field(description="memory bandwidth, e.g. 900GB/s")]
    bf16: Annotated[bool, Field(default=True, description="supports bfloat16")] = True
    price: Annotated[PricePerHour | None, Field(default=None, description="default $ per GPU-hour")] = None
    sky_name: Annotated[str | None, Field(default=None, description="SkyPilot accelerator name (default: name)")] = None
    interconnect: Annotated[
        Bandwidth | None, Field(default=None, description="GPU-GPU bandwidth inside a node (default PCIe 4: 32GB/s)")
    ] = None
    compute_capability: Annotated[
        str | None, Field(default=None, description="CUDA compute capability, e.g. '8.0' (vLLM 0.33 needs >= 7.0)")
    ] = None


class StepCoefficients(_Spec):
    """Fitted step-time coefficients of a replica (perf/fit.py; written by `hetcompile profile`)."""

    step_s: Annotated[float, Field(ge=0, description="o: fixed seconds per engine step")]
    per_token_s: Annotated[float, Field(ge=0, description="c: seconds per token in the step")]
    per_kv_token_s: Annotated[float, Field(ge=0, description="k: seconds per context token read by decode attention")]
    request_s: Annotated[float, Field(default=0.0, ge=0, description="r: per-request overhead added to TTFT")] = 0.0


class MeasuredProfile(_Spec):
    """Measured numbers for one replica shape that override the analytic model (seed 003 App. C)."""

    model: Annotated[str, Field(description="model name")]
    gpu: Annotated[str, Field(description="GPU type")]
    tp: Annotated[int, Field(default=1, gt=0, le=64, description="tensor-parallel size per node")] = 1
    pp: Annotated[int, Field(default=1, gt=0, le=1024, description="pipeline stages (nodes)")] = 1
    throughput: Annotated[
        dict[str, MeasuredRate], Field(default_factory=dict, description="requests/s per workload name, e.g. {chat: 2.4/s}")
    ]
    kv_capacity_tokens: Annotated[int | None, Field(default=None, gt=0, description="measured KV tokens")] = None
    prefill_tokens_per_s: Annotated[float | None, Field(default=None, gt=0, description="measured prompt tokens/s")] = None
    decode_tokens_per_s: Annotated[float | None, Field(default=None, gt=0, description="measured output tokens/s")] = None
    coefficients: Annotated[
        StepCoefficients | None,
        Field(default=None, description="fitted step-time model (`hetcompile profile`): replaces the analytic one for this shape"),
    ] = None
    source: Annotated[str, Field(default="measured", description="where the numbers come from")] = "measured"

    def has_numbers(self) -> bool:
        return bool(self.throughput) or self.coefficients is not None or any(
            x is not None for x in (self.kv_capacity_tokens, self.prefill_tokens_per_s, self.decode_tokens_per_s)
        )


class LayerProfileSpec(_Spec):
    """Per-node capacity tables for layer placement (Helix's T(k), seed 000 §4.3), e.g. measured on
    a real cluster or taken from the Helix artifact; without one the analytic model fills them in."""

    model: Annotated[str, Field(description="model name")]
    gpu: Annotated[str, Field(description="GPU type")]
    tp: Annotated[int, Field(default=1, gt=0, le=64, description="GPUs of one stage (tensor-parallel size)")] = 1
    throughput: Annotated[
        tuple[Annotated[float, Field(ge=0)], ...],
        Field(min_length=1, description="T(k): prompt + decode tokens/s of a stage holding k = 1, 2, ... layers"),
    ]
    kv_token_layers: Annotated[
        tuple[Annotated[float, Field(ge=0)], ...],
        Field(min_length=1, description="KV entries (tokens x layers) a stage holding k layers keeps; same length"),
    ]
    decode_time: Annotated[
        tuple[tuple[Annotated[float, Field(ge=0)], StepTime], ...],
        Field(min_length=2, description="[batch sequences, time per layer] points of one decode step, e.g. [[8, 0.4ms], ...]"),
    ]
    prefill_time: Annotated[
        tuple[tuple[Annotated[float, Field(ge=0)], StepTime], ...],
        Field(min_length=2, description="[batch tokens, time per layer] points of one prefill step"),
    ]
    source: Annotated[str, Field(default="measured", description="where the numbers come from")] = "measured"


class PlacementSpec(_Spec):
    """How replicas get their nodes and layers (the `place` pass)."""

    pipelines: Annotated[
        Literal["single-type", "mixed"],
        Field(
            default="single-type",
            description="single-type: compose's replicas, one GPU type each (any cloud); mixed: Helix max-flow "
            "placement over the nodes compose chose plus owned ones, chains may mix GPU types (Kubernetes job groups)",
        ),
    ] = "single-type"
    objective: Annotated[
        Literal["depth-aware", "helix"],
        Field(default="depth-aware", description="depth-aware chain capacity, or Helix's flow proxy"),
    ] = "depth-aware"
    compare_shared: Annotated[
        bool, Field(default=True, description="mixed: also solve Helix's shared pipelines and report what chains cost (pools of at most 200 nodes)")
    ] = True
    partial_inference: Annotated[
        bool, Field(default=False, description="shared comparison: Helix's partial inference")
    ] = False
    coordinator: Annotated[
        str | None, Field(default=None, description="region of the router (Helix's coordinator); default: first region")
    ] = None
    layer_profiles: Annotated[
        tuple[str | LayerProfileSpec, ...],
        Field(default=(), description="per-node T(k) tables: inline, or YAML files (a list) relative to the spec"),
    ] = ()
    delta: Annotated[
        Delta, Field(default=0.05, description="mixed: Hetis primary-worker selection (seed 001 §4.1): a GPU whose "
                        "removal raises a replica's dense cost by less than this stays out of it, e.g. 5%; 0 turns it off")
    ] = 0.05


def _off_as_written(v: object) -> object:
    """YAML 1.1 reads a bare `off` as false: take it as the word the user wrote."""
    return "off" if v is False else v


class Spec(_Spec):
    """A hetcompile spec: what to serve, on what, within what budget."""

    name: Annotated[PlanName, Field(description="plan name (lowercase, digits, '-'; prefixes every cluster name)")]
    models: Annotated[tuple[ModelSpec, ...], Field(min_length=1, description="LLMs to serve")]
    workloads: Annotated[tuple[WorkloadSpec, ...], Field(min_length=1, description="workload classes")]
    regions: Annotated[tuple[RegionSpec, ...], Field(min_length=1, description="where GPUs can be had")]
    network: Annotated[NetworkSpec, Field(default_factory=NetworkSpec, description="links between nodes")]
    budget: Annotated[PricePerHour | None, Field(default=None, description="$ per hour for the whole plan")] = None
    max_utilization: Annotated[
        Share, Field(default=DEFAULT_MAX_UTILIZATION, description="headroom: no replica is planned past this share of its "
                     "full-load capacity (queues grow without bound near 100%); SLO workloads may be held lower by their targets")
    ] = DEFAULT_MAX_UTILIZATION
    max_ttft_slowdown: Annotated[
        float | None, Field(default=DEFAULT_TTFT_SLOWDOWN, gt=1, description="queueing bound for workloads without an SLO: a replica is "
                            "loaded so that their p99 TTFT stays within this multiple of the TTFT on the idle replica, and the "
                            "build checks it by simulating the whole plan; null: max_utilization alone, nothing simulated")
    ] = DEFAULT_TTFT_SLOWDOWN
    disaggregation: Annotated[
        Literal["off", "auto"],
        BeforeValidator(_off_as_written),
        Field(default="off", description="prefill/decode disaggregation (docs/disaggregation.md): auto lets compose give an SLO "
                                         "workload prefill and decode replicas of their own, paired in one region, where "
                                         "that is cheaper; off: every replica runs whole requests")
    ] = "off"
    objective: Annotated[Objective, Field(default="max-throughput", description="what to optimize")] = "max-throughput"
    solver: Annotated[SolverSpec, Field(default_factory=SolverSpec, description="solver settings")]
    engine: Annotated[EngineSpec, Field(default_factory=EngineSpec, description="vLLM settings")]
    gpus: Annotated[tuple[GpuSpec, ...], Field(default=(), description="extra GPU types")] = ()
    estimates: Annotated[
        Literal["analytic", "measured-only"],
        Field(default="analytic", description="measured-only: consider only replica shapes with a measured profile"),
    ] = "analytic"
    profiles: Annotated[
        tuple[str | MeasuredProfile, ...],
        Field(default=(), description="measured profiles: inline, or YAML files (a list of profiles) relative to the spec"),
    ] = ()
    placement: Annotated[PlacementSpec, Field(default_factory=PlacementSpec, description="layer placement")]
