"""`OUT/observed.yaml`: what `hetcompile observe` measured on the running fleet, as typed data.

Per workload class: the request rate the router counted, and prompt / output lengths, TTFT and
TPOT from vLLM's histograms of the replicas serving it. vLLM counts per model, not per class, so
where a model serves several classes the lengths and latencies are the model's and `notes` says so.
Per replica: its measured inter-token latency, and the step-time factor under which the plan's
step model, replayed at the replica's measured load, shows it (observe/observe.py). Per (GPU,
TP): the pooled correction `build --observed` applies. What could not be measured is listed in
`missing`, never filled in.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from hetcompile.frozen import Frozen

OBSERVED_FORMAT: Final = "hetcompile-observed/1"
MIN_REQUESTS: Final = 20  # measured requests a length or latency needs: for its percentiles (observe), to replace the spec's (build --observed)


class Dist(Frozen):
    """A measured distribution: mean and percentiles (histogram_quantile of the window's buckets)."""

    mean: float
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    samples: Annotated[int, Field(ge=0, description="observations in the window")]


class ObservedWorkload(Frozen):
    name: str
    model: str
    requests: Annotated[int, Field(ge=0, description="requests the router answered with 2xx in the window")]
    rate_per_s: Annotated[float | None, Field(description="requests / window (null: the router's counters were not read)")]
    input_tokens: Dist | None = None
    output_tokens: Dist | None = None
    ttft_s: Dist | None = None
    tpot_s: Dist | None = None
    notes: tuple[str, ...] = ()


class ObservedReplica(Frozen):
    id: str
    model: str
    gpu: str
    tp: int
    pp: int
    scrapes: Annotated[int, Field(ge=0, description="successful /metrics reads in the window")]
    requests: Annotated[int, Field(ge=0, description="requests it finished in the window")]
    running: Annotated[float | None, Field(description="mean sequences running (vllm:num_requests_running over the samples)")] = None
    decoding: Annotated[float | None, Field(description="C: mean sequences decoding, from the ITL histogram (Little's law)")] = None
    waiting: Annotated[float | None, Field(description="mean requests waiting")] = None
    kv_usage: Annotated[float | None, Field(description="mean vllm:kv_cache_usage_perc (0-1)")] = None
    input_tokens: float | None = None
    output_tokens: float | None = None
    ttft_s: Dist | None = None
    itl_s: Annotated[Dist | None, Field(description="inter-token latency (vllm:inter_token_latency_seconds)")] = None
    predicted_itl_s: Annotated[float | None, Field(description="the plan's step model at the measured batch and lengths")] = None
    correction: Annotated[float | None, Field(description="measured / predicted inter-token latency (null: see reason)")] = None
    reason: Annotated[str | None, Field(description="why there is no correction")] = None


class StepCorrection(Frozen):
    """Step times of (gpu, tp) replicas run at `factor` x the step model's (pooled over `replicas`)."""

    gpu: str
    tp: int
    factor: Annotated[float, Field(gt=0)]
    raw: Annotated[float, Field(gt=0, description="the pooled ratio before bounds and smoothing")]
    tokens: Annotated[int, Field(ge=0, description="inter-token intervals it rests on")]
    replicas: tuple[str, ...]


class ObservedDoc(Frozen):
    format: Literal["hetcompile-observed/1"] = OBSERVED_FORMAT
    plan: str
    spec_hash: str
    window_s: Annotated[float, Field(gt=0, description="seconds between the first and last scrape")]
    interval_s: float
    samples: Annotated[int, Field(ge=0, description="scrape rounds taken")]
    workloads: tuple[ObservedWorkload, ...]
    replicas: tuple[ObservedReplica, ...]
    corrections: tuple[StepCorrection, ...] = ()
    missing: Annotated[tuple[str, ...], Field(description="what could not be measured, and why")] = ()


class ObservedChange(Frozen):
    """One workload as the spec states it and as `build --observed` planned it."""

    workload: str
    spec_rate: float | None
    rate: Annotated[float | None, Field(description="req/s planned for (the observed rate, or the spec's when none was measured)")]
    spec_input_tokens: float
    input_tokens: float
    spec_output_tokens: float
    output_tokens: float


class Observation(Frozen):
    """plan.json: what `build --observed` took from an observed.yaml in place of the spec's guesses."""

    window_s: float
    workloads: tuple[ObservedChange, ...]
    corrections: Annotated[tuple[StepCorrection, ...], Field(description="step times per (GPU, TP) applied to the analytic step model")]
    notes: tuple[str, ...] = ()
