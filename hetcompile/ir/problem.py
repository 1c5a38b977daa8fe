"""The canonical problem IR: a resolved spec in SI units, plus what each pass adds.

Units: bytes, seconds, bytes/s, FLOP/s, requests/s, dollars per second (`*_per_s` prices).
All collections are tuples sorted by id so the same spec gives the same IR (and plan) bytes.
Passes never mutate: each returns `ir.model_copy(update={...})` with its own field filled in
(profile -> `perf`, compose -> `composition`, prune -> `links`, place/parallelize ->
`replicas`, route -> `routing`) and appends a `PassReport`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hetcompile.frozen import Frozen
from hetcompile.plan.routing import Role, RoutingTable
from hetcompile.plan.observed import Observation
from hetcompile.perf.tail import DEFAULT_MAX_UTILIZATION
from hetcompile.perf.types import GpuType, ModelArch, PerfEntry
from hetcompile.plan.doc import AggregatedAlternative, Alternatives, Binding, ModelPlacement, PrimaryWorkers, Verification, WhatItWouldTake
from hetcompile.perf.stepmodel import ReplicaModel






class Model(Frozen):
    name: Annotated[str, Field(description="model id in the plan")]
    served_name: Annotated[str, Field(description="--served-model-name, what clients send")]
    weights: Annotated[str, Field(description="HF repo id or path for vllm serve")]
    dtype: Annotated[Literal["auto", "float16", "bfloat16"], Field(description="requested dtype")]
    dtype_bytes: Annotated[int, Field(description="bytes per weight/KV element")] = 2
    arch: ModelArch
    max_model_len: Annotated[int, Field(gt=0, description="--max-model-len")]
    tp: Annotated[tuple[int, ...] | None, Field(description="TP degrees the spec allows (None: any)")] = None
    pp: Annotated[tuple[int, ...] | None, Field(description="pipeline depths the spec allows (None: the default search)")] = None


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
    price_source: Annotated[str, Field(description="where the price came from: 'spec', or 'catalog default (<source>, "
                                                   "checked <date>)' when the spec gave none")] = "spec"

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
    role: Annotated[Role | None, Field(description="prefill or decode: one phase of a disaggregated group (issue 35); "
                                                    "None: whole requests")] = None
    group: Annotated[str | None, Field(description="a phase shape's group key: the region its KV may move within")] = None
    max_num_seqs: Annotated[int | None, Field(description="--max-num-seqs of its replicas where not the engine's "
                                                          "(a decode shape: the C* its TPOT target allows)")] = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp














class Composed(Frozen):
    """compose's own solution (y, r, theta) before place replaces counts, rates and scale with what
    the placed replicas serve: the what-if pass re-solves the composition MILP around it."""

    counts: tuple[tuple[str, int], ...] = Field(description="shape id -> y_c, the shapes compose buys")
    rates: tuple[tuple[str, str, float], ...] = Field(description="(shape, workload, r_{c,w} req/s over all copies)")
    scale: Annotated[float, Field(description="theta: multiple of the demand mix served")]


class Composition(Frozen):
    """compose: how many replicas of each shape, and what share of each workload they take."""

    counts: tuple[tuple[str, int], ...] = Field(description="shape id -> y_c")
    rates: tuple[tuple[str, str, float], ...] = Field(description="(shape, workload, req/s over all copies)")
    scale: Annotated[float, Field(description="theta: multiple of the demand mix served")]
    objective: str
    binding: tuple[Binding, ...] = Field(description="constraints that bind the plan")
    what_if: Annotated[WhatItWouldTake | None, Field(description="what more budget or GPUs would buy")] = None
    alternatives: Annotated[Alternatives | None, Field(description="the frontier and runners-up compose weighed")] = None
    composed: Annotated[Composed | None, Field(description="compose's solution as it chose it (the what-if pass)")] = None


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
    role: Annotated[Role | None, Field(description="prefill or decode: one phase of a disaggregated group; None: whole requests")] = None
    group: Annotated[str | None, Field(description="the disaggregated group (routing table group id) a phase replica belongs to")] = None
    max_num_seqs: Annotated[int | None, Field(description="--max-num-seqs where not the engine's (a decode replica's C*)")] = None












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
    max_utilization: Annotated[float, Field(gt=0, le=1, description="headroom: most of h_{c,w} a replica is planned at")] = DEFAULT_MAX_UTILIZATION
    max_ttft_slowdown: Annotated[float | None, Field(gt=1, description="without an SLO: p99 TTFT / idle TTFT bound (perf/tail.py); "
                                                                 "None: none")] = None
    disaggregation: Annotated[bool, Field(description="spec `disaggregation: auto`: the profile pass offers phase shapes")] = False
    aggregated: Annotated[AggregatedAlternative | None, Field(description="the disaggregation pass: the plan without groups")] = None
    tail_factors: tuple[tuple[str, float], ...] = Field(
        default=(), description="per workload, the share of its tail-model load the build's simulation allowed (verify loop)")
    verification: Verification | None = None
    placement: PlacementConfig = PlacementConfig()
    spans: tuple[tuple[str, str, int, int, str], ...] = Field(
        default=(), description="(key, file, line, col, text) of spec places later errors point at"
    )
    warnings: tuple[str, ...] = Field(
        default=(), description="'file:line:col: text' of what the spec leaves to defaults a person should know of"
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
    observed: Observation | None = Field(default=None, description="build --observed: the measurements that replaced the spec's guesses (ir/observed.py)")
    reports: tuple[PassReport, ...] = ()

    def span(self, key: str):
        """The spec Span recorded for `key` ('budget', 'model:<name>', 'offer:<id>'), or None."""
        from hetcompile.errors import Span

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
