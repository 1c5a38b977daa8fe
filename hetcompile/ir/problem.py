"""The canonical problem IR: a resolved spec in SI units, plus what each pass adds.

Units: bytes, seconds, bytes/s, FLOP/s, requests/s, dollars per second (`*_per_s` prices).
All collections are tuples sorted by id so the same spec gives the same IR (and plan) bytes.
Passes never mutate: each returns `ir.model_copy(update={...})` with its own field filled in
(profile -> `perf`, compose -> `composition`, prune -> `links`, place/parallelize ->
`replicas`, route -> `routing`) and appends a `PassReport`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hetcompile.ir.routing import RoutingTable
from hetcompile.perf.stepmodel import ReplicaModel


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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


class Model(Frozen):
    name: Annotated[str, Field(description="model id in the plan")]
    served_name: Annotated[str, Field(description="--served-model-name, what clients send")]
    weights: Annotated[str, Field(description="HF repo id or path for vllm serve")]
    dtype: Annotated[Literal["auto", "float16", "bfloat16"], Field(description="requested dtype")]
    dtype_bytes: Annotated[int, Field(description="bytes per weight/KV element")] = 2
    arch: ModelArch
    max_model_len: Annotated[int, Field(gt=0, description="--max-model-len")]


class Workload(Frozen):
    name: str
    model: str
    input_tokens: float
    output_tokens: float
    demand: Annotated[float, Field(gt=0, description="lambda_w: req/s (rate), requests (f_w) or share; ratios matter")]
    demand_kind: Literal["rate", "requests", "share"]
    rate: float | None = None
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    slo_quantile: Annotated[float, Field(gt=0, lt=1, description="q of the SLO's percentile (p99: 0.99)")] = 0.99
    match: dict = Field(default_factory=dict, description="router class rule (ClassMatch fields)")


class Offer(Frozen):
    id: Annotated[str, Field(description="'<region>/<gpu>'")]
    region: str
    cloud: str
    gpu: str
    gpus_per_node: int
    max_nodes: int
    owned_nodes: int
    price_per_gpu_s: Annotated[float, Field(ge=0, description="$ per GPU-second")]
    spot: bool = False

    @property
    def max_gpus(self) -> int:
        return self.max_nodes * self.gpus_per_node


class Link(Frozen):
    a: str
    b: str
    bandwidth: Annotated[float, Field(gt=0, description="bytes/s")]
    latency: Annotated[float, Field(ge=0, description="seconds")]


class MeasuredShape(Frozen):
    model: str
    gpu: str
    tp: int
    pp: int
    throughput: tuple[tuple[str, float], ...] = ()
    kv_capacity_tokens: int | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    coefficients: tuple[tuple[str, float], ...] = Field(default=(), description="fitted (o, c, k, r) by name, perf/fit.py")
    source: str = "measured"


class Engine(Frozen):
    image: str
    gpu_memory_utilization: float
    max_num_seqs: int
    port: int
    router_port: int
    disk_size: int


class SolverConfig(Frozen):
    time_limit_s: float
    mip_gap: float
    threads: int
    seed: int
    node_limit: int | None = None


# ---- pass products --------------------------------------------------------------------------


class LayerProfile(Frozen):
    """Per-node T(k), KV and per-layer step times for placement (spec `placement.layer_profiles`)."""

    model: str
    gpu: str
    tp: int
    throughput: tuple[float, ...]
    kv_token_layers: tuple[float, ...]
    decode_time: tuple[tuple[float, float], ...]
    prefill_time: tuple[tuple[float, float], ...]
    source: str = "measured"


class PlacementConfig(Frozen):
    pipelines: Literal["single-type", "mixed"] = "single-type"
    objective: Literal["depth-aware", "helix"] = "depth-aware"
    compare_shared: bool = True
    partial_inference: bool = False
    coordinator: str = ""
    layer_profiles: tuple[LayerProfile, ...] = ()
    delta: Annotated[float, Field(ge=0, lt=1, description="Hetis selection threshold (placement/hetis.py)")] = 0.05


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


class Stage(Frozen):
    node: Annotated[str, Field(description="node id")]
    gpu: str
    region: str
    tp: int
    layer_start: int
    layer_end: Annotated[int, Field(description="exclusive")]

    @property
    def layers(self) -> int:
        return self.layer_end - self.layer_start


class ShapeEstimate(Frozen):
    """Capacity of one replica shape (003's config c): a chain of `pp` same-type nodes."""

    kv_capacity_tokens: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    throughput_rps: tuple[tuple[str, float], ...] = Field(
        description="requests/s per workload the plan may load the replica with: max_utilization x h_{c,w}, or less "
                    "where an SLO's percentile binds (perf/tail.py)")
    full_rps: tuple[tuple[str, float], ...] = Field(default=(), description="h_{c,w}: requests/s at full load (perf/capacity.py)")
    concurrency: tuple[tuple[str, float], ...] = Field(description="C per workload (KV minimum, max_num_seqs)")
    binding: tuple[tuple[str, str], ...] = Field(description="which term bounds capacity per workload")
    ttft_s: tuple[tuple[str, float], ...] = ()
    tpot_s: tuple[tuple[str, float], ...] = ()
    source: Literal["analytic", "measured"] = "analytic"
    step_model: ReplicaModel | None = Field(default=None, description="the step-time model the capacity comes from")


class Shape(Frozen):
    id: Annotated[str, Field(description="model|offer|tp|pp, plus |slo:<workload> for a copy dedicated to an SLO workload")]
    model: str
    offer: str
    gpu: str
    region: str
    tp: int
    pp: int
    partition: tuple[int, ...] = Field(description="layers per stage (VLLM_PP_LAYER_PARTITION)")
    price_per_s: float
    estimate: ShapeEstimate

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


class Binding(Frozen):
    """A constraint that stops the plan from growing (or, for `demand`, that it meets exactly)."""

    kind: Annotated[Literal["budget", "availability", "demand", "placement", "slo", "other"],
                    Field(description="which constraint family")]
    subject: Annotated[str | None, Field(description="what it is about: the offer id for availability")] = None
    used: Annotated[float | None, Field(description="how much of the limit the plan uses")] = None
    limit: Annotated[float | None, Field(description="the limit")] = None
    unit: Annotated[str | None, Field(description="unit of used and limit: '$/h', 'GPUs', 'x demand'")] = None
    text: Annotated[str, Field(description="the same, in words")]


class Composition(Frozen):
    """compose: how many replicas of each shape, and what share of each workload they take."""

    counts: tuple[tuple[str, int], ...] = Field(description="shape id -> y_c")
    rates: tuple[tuple[str, str, float], ...] = Field(description="(shape, workload, req/s over all copies)")
    scale: Annotated[float, Field(description="theta: multiple of the demand mix served")]
    objective: str
    binding: tuple[Binding, ...] = Field(description="constraints that bind the plan")


class Node(Frozen):
    id: str
    offer: str
    region: str
    cloud: str
    gpu: str
    gpus: int
    price_per_s: Annotated[float, Field(description="$ per second for the rented GPUs: (gpus - owned_gpus) x the offer's price")]
    owned: Annotated[bool, Field(description="every GPU of the node is owned (costs nothing)")] = False
    owned_gpus: Annotated[int, Field(ge=0, description="how many of the node's GPUs are owned")] = 0

    @model_validator(mode="before")
    @classmethod
    def _owned_means_every_gpu(cls, data):
        if isinstance(data, dict) and data.get("owned") and "owned_gpus" not in data:
            data = {**data, "owned_gpus": data.get("gpus", 0)}
        return data


class Replica(Frozen):
    id: str
    model: str
    shape: str
    stages: tuple[Stage, ...]
    dtype: Literal["float16", "bfloat16"]
    estimate: ShapeEstimate
    mixed: bool = False


class ChainSummary(Frozen):
    """place (mixed pipelines): one replica's chain under the depth-aware model (placement/evaluate.py)."""

    replica: str
    depth: int
    tp: int
    concurrency: float = Field(description="C: requests in flight (KV minimum over stages, max-num-seqs)")
    concurrency_limit: str = Field(description="'kv:<stage unit>' or 'max-num-seqs'")
    micro_batch: float = Field(description="b = C / depth")
    capacity_tokens_per_s: float = Field(description="prompt + decode tokens/s at the model's mean workload: perf/capacity.py's full mode, what the plan reports")
    search_capacity_tokens_per_s: float = Field(default=0.0, description="the same by the formula's fast (fluid) mode, what placement's search ranked it by")
    binding: str = Field(description="'stage:<unit>' (slowest stage) or 'latency' (round trip incl. hops), in the fast mode")
    helix_flow: float = Field(description="Helix semantics: min of T(k) over stages and link capacity over hops")
    split_nodes: tuple[str, ...] = ()


class ModelPlacement(Frozen):
    """place (mixed pipelines): what Helix max-flow placement found for one model, and what was kept."""

    model: str
    objective: Literal["depth-aware", "helix"]
    kept: Literal["placement", "compose"] = Field(description="whose replicas the plan deploys")
    pool_nodes: int
    pool_gpus: int
    status: str
    helix_flow: float = Field(description="Helix-semantics flow of the placed chains, tokens/s")
    depth_aware_capacity: float = Field(description="the search's objective: the placed chains' capacity by the formula's fast mode, tokens/s (bound and gap refer to it)")
    capacity: float = Field(default=0.0, description="the placed chains' capacity by the full mode (what the plan reports), tokens/s")
    bound: float | None = None
    gap: float | None = None
    incumbent_source: str = ""
    shared_helix_flow: float | None = Field(default=None, description="shared per-request pipelines (not deployable)")
    shared_depth_aware_capacity: float | None = None
    shared_bound: float | None = None
    shared_gap: float | None = None
    compose_depth_aware_capacity: float = Field(description="compose's single-type replicas, same model, fast mode")
    compose_capacity: float = Field(default=0.0, description="compose's single-type replicas, same model, full mode")
    scale_placement: float = Field(description="theta with the placed chains")
    scale_compose: float = Field(description="theta with compose's replicas, evaluated by the same model")
    # optional: plans written before it was added still read back (explain, --previous)
    scale_single_type: float | None = Field(default=None, description="theta with compose's replicas by their own estimates: what the single-type plan serves")
    chains: tuple[ChainSummary, ...] = ()


class LeftOutGpus(Frozen):
    """place (mixed): GPUs of one type that Hetis primary-worker selection kept out of a replica."""

    gpu: str
    gpus: int
    nodes: tuple[str, ...] = Field(description="pool node ids (a TP slice as <node>#<j>)")
    adds: float = Field(description="C(kept) / C(kept + these) - 1: what they would add to the replica's dense speed (< delta)")
    fate: Literal["moved", "not-rented", "idle", "kept-in"] = Field(
        description="moved to another replica, not rented (cost saved), owned and idle, or kept in (the plan without "
                    "them served less)")
    to_replica: str | None = None
    saved_per_s: float = Field(default=0.0, description="$/s not paid because they are not rented")


class AttentionWorkers(Frozen):
    """What left-out GPUs would add as Hetis Attention workers (perf/attention.py); NOT deployable on vLLM 0.33."""

    gpus: int
    kv_tokens: float
    kv_tokens_with: float
    decode_tokens_per_s: float
    decode_tokens_per_s_with: float
    offload_share: float = Field(description="rho: share of the query heads offloaded (0: offload does not pay)")
    transfer_s_per_layer: float = Field(description="eq. 4 per layer per step at the chosen share: 2 alpha + beta V b")
    link_latency_s: float
    link_bandwidth: float


class PrimaryWorkers(Frozen):
    """place (mixed): Hetis primary-worker selection (seed 001 §4.1, placement/hetis.py) for one replica."""

    model: str
    replica: str
    delta: float
    kept: tuple[tuple[str, int], ...] = Field(description="GPU type -> GPUs kept as primary workers")
    dense_cost_s: float = Field(description="C(kept): max stage dense cost per step, s (unified stages, perfect scaling)")
    full_dense_cost_s: float = Field(description="C with every GPU placement gave the replica")
    applied: bool
    left_out: tuple[LeftOutGpus, ...] = ()
    attention: AttentionWorkers | None = None
    text: tuple[str, ...] = Field(default=(), description="what plan.md and explain say")


class PreviousReplica(Frozen):
    id: str
    model: str
    shape: str
    nodes: tuple[str, ...]


class PreviousPlan(Frozen):
    """`build --previous OLD/plan.json` (seed 003 App. M replanning): what runs now, and what a
    change costs: each replica launched or torn down is charged `churn_penalty` x the previous
    plan's objective (theta for throughput objectives, $/s for min-cost)."""

    plan: str
    replicas: tuple[PreviousReplica, ...]
    scale: float
    price_per_s: float
    churn_penalty: float
    next_replica: int = Field(default=0, description="ids r0 .. r{n-1} are taken: new replicas get higher ones")


class PassReport(Frozen):
    name: str
    status: str
    time_s: float
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    notes: tuple[str, ...] = ()


class VerifiedWorkload(Frozen):
    """What the build's simulation measured for one SLO workload (simulate/verify.py)."""

    name: str
    percentile: str
    ttft_s: float | None = Field(description="simulated TTFT at the SLO's percentile")
    tpot_s: float | None = Field(description="simulated TPOT at the SLO's percentile")
    attainment: float | None = Field(description="share of requests within every target")
    met: bool
    factor: float = Field(description="share of the tail model's load the plan was left with")


class Verification(Frozen):
    """The build's check of the plan by simulation: seeded, work-bounded (requests, not seconds)."""

    seed: int
    requests: int = Field(description="requests simulated in the last round")
    duration_s: float
    warmup_s: float
    rounds: int = Field(description="plans simulated (1: the first plan held)")
    workloads: tuple[VerifiedWorkload, ...]


class Problem(Frozen):
    name: str
    spec_hash: str
    spec_file: str = ""
    models: tuple[Model, ...]
    workloads: tuple[Workload, ...]
    gpus: tuple[GpuType, ...]
    offers: tuple[Offer, ...]
    links: tuple[Link, ...]
    budget_per_s: float | None
    objective: Literal["max-throughput", "min-cost", "max-throughput-per-dollar", "min-makespan"]
    solver: SolverConfig
    engine: Engine
    measured: tuple[MeasuredShape, ...] = ()
    measured_only: bool = False
    max_utilization: Annotated[float, Field(gt=0, le=1, description="headroom: most of h_{c,w} a replica is planned at")] = 0.85
    tail_factors: tuple[tuple[str, float], ...] = Field(
        default=(), description="per workload, the share of its tail-model load the build's simulation allowed (verify loop)")
    verification: Verification | None = None
    placement: PlacementConfig = PlacementConfig()
    spans: tuple[tuple[str, str, int, int, str], ...] = Field(
        default=(), description="(key, file, line, col, text) of spec places later errors point at"
    )
    # pass products
    perf: tuple[PerfEntry, ...] | None = None
    shapes: tuple[Shape, ...] | None = None
    composition: Composition | None = None
    nodes: tuple[Node, ...] | None = None
    replicas: tuple[Replica, ...] | None = None
    routing: RoutingTable | None = None
    placements: tuple[ModelPlacement, ...] = ()
    primary_workers: tuple[PrimaryWorkers, ...] = ()
    previous: PreviousPlan | None = None
    reports: tuple[PassReport, ...] = ()

    def span(self, key: str):
        """The spec Span recorded for `key` ('budget', 'model:<name>', 'offer:<id>'), or None."""
        from hetcompile.ir.errors import Span

        for k, file, line, col, text in self.spans:
            if k == key:
                return Span(file, line, col, text)
        return None

    def model(self, name: str) -> Model:
        return next(m for m in self.models if m.name == name)

    def gpu(self, name: str) -> GpuType:
        return next(g for g in self.gpus if g.name == name)

    def offer(self, oid: str) -> Offer:
        return next(o for o in self.offers if o.id == oid)

    def shape(self, sid: str) -> Shape:
        return next(s for s in (self.shapes or ()) if s.id == sid)
