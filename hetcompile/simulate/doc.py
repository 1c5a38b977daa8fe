"""`OUT/simulation.json`: what `hetcompile simulate` measured on the plan, as typed data.

Generated into `schemas/simulation.schema.json`; `hetcompile explain OUT` renders it when present.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field

from hetcompile.frozen import Frozen

SIMULATION_FORMAT: Final = "hetcompile-simulation/1"




class Percentiles(Frozen):
    p50: Annotated[float | None, Field(description="median, seconds (null: no sample)")] = None
    p90: Annotated[float | None, Field(description="90th percentile, seconds (null: no sample)")] = None
    p95: Annotated[float | None, Field(description="95th percentile, seconds (null: no sample)")] = None
    p99: Annotated[float | None, Field(description="99th percentile, seconds (null: no sample)")] = None


class WorkloadResult(Frozen):
    name: str
    planned_requests_per_s: Annotated[float, Field(description="what the plan serves (theta * lambda_w)")]
    offered_requests_per_s: Annotated[float, Field(description="arrivals per second in the measured window")]
    arrived: Annotated[int, Field(description="requests that arrived in the measured window")]
    completed: Annotated[int, Field(description="of those, completed (after the arrivals stop, the queues drain)")]
    throughput_requests_per_s: Annotated[float, Field(description="completions per second in the measured window")]
    output_tokens_per_s: Annotated[float, Field(description="output tokens per second in the measured window")]
    ttft_s: Annotated[Percentiles, Field(description="time to first token of the requests that arrived in the window")]
    tpot_s: Annotated[Percentiles, Field(description="time per output token after the first")]
    slo_ttft_s: Annotated[float | None, Field(description="the spec's TTFT target")] = None
    slo_tpot_s: Annotated[float | None, Field(description="the spec's TPOT target")] = None
    slo_attainment: Annotated[
        float | None, Field(description="fraction of the window's requests that completed within every target (null: no SLO)")
    ] = None


class ReplicaResult(Frozen):
    id: str
    completed: int
    preemptions: Annotated[int, Field(description="sequences preempted because the KV cache was full")]
    steps: Annotated[int, Field(description="engine steps (micro-batches)")]
    mean_step_tokens: Annotated[float, Field(description="tokens per engine step")]
    utilization: Annotated[float, Field(description="load, as plan.md and explain count it: the requests it completed in the "
                                                    "measured window, per second, over its full-load capacity, summed over workloads")]
    stepping: Annotated[float, Field(description="share of [0, duration] its slowest stage had a step in flight (a replica "
                                                 "steps back to back while any request runs, so this is near 1 at any real load)")] = 0.0


class SimulationDoc(Frozen):
    """`OUT/simulation.json`."""

    format: Annotated[Literal["hetcompile-simulation/1"], Field(description="document format and version")] = SIMULATION_FORMAT
    plan: Annotated[str, Field(description="the plan's name")]
    spec_hash: Annotated[str, Field(description="spec_hash of the plan it replays")]
    arrivals: Annotated[str, Field(description="'poisson', 'poisson stages LOAD:DURATION,...' (--stages) or the trace file's name")]
    load: Annotated[float, Field(description="multiple of the plan's served rates offered (poisson)")]
    seed: int
    policy: Annotated[Literal["weighted"], Field(description="router policy replayed (smooth weighted round robin)")]
    duration_s: Annotated[float, Field(description="arrivals are generated over [0, duration]")]
    warmup_s: Annotated[float, Field(description="arrivals before this are not measured")]
    workloads: tuple[WorkloadResult, ...]
    replicas: tuple[ReplicaResult, ...]
    unfinished: Annotated[int, Field(description="requests that arrived by duration_s and were still queued or running when the drain limit was reached (later arrivals only keep the load on)")]
