"""plan.json's record of a replica's step-time model, converted to and from perf's at the boundary.

The step model itself (perf/stepmodel.py: `ReplicaModel`, its stages' `LayerCost`, hops, host
terms) is the compiler's internal model and changes with it. plan.json is a public contract
(schemas/plan.schema.json), so it carries its own record of the same numbers: `StepModelRecord`.
The two meet only in `record_of` (the compiler writing a plan) and `StepModelRecord.model`
(the simulator, explain and verify reading one back).

The records name their fields as perf does, so a plan's bytes do not depend on which of the two
wrote it. They are separate classes so that a term added to perf's model is a decision about the
public format, not a silent change of it: `record_of` refuses a model with a field the record does
not have (tests/test_step_record.py also compares the two field sets), and an older plan.json
still reads back through the record's own defaults.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from hetcompile.frozen import Frozen
from hetcompile.perf.stepmodel import ReplicaModel


class LayerCostRecord(Frozen):
    """Seconds per decoder layer for one engine step on one stage (perf/stepmodel.py's roofline)."""

    weights_s: Annotated[float, Field(ge=0, description="w: read the layer's weights once")]
    kv_s_per_token: Annotated[float, Field(ge=0, description="k: read one context token's K+V")]
    flop_s_per_token: Annotated[float, Field(ge=0, description="f: dense compute per token in the step")]
    attn_s_per_pair: Annotated[float, Field(ge=0, description="a: attention compute per (query, context) token pair")]
    comm_s_per_token: Annotated[float, Field(ge=0, description="c: TP all-reduce transfer per token")] = 0.0
    comm_s: Annotated[float, Field(ge=0, description="c0: TP all-reduce launches per step")] = 0.0
    serial_fraction: Annotated[float, Field(ge=0, le=1, description="s: part of the smaller of compute and memory that does not overlap the larger")] = 0.0
    source: Annotated[Literal["roofline", "kernels"], Field(description="what filled the coefficients: measured kernel tables (perf/kernels.py) or the datasheet roofline")] = "roofline"


class StageRecord(Frozen):
    """One pipeline stage: `layers` decoder layers on `tp` GPUs of type `gpu`."""

    gpu: str
    tp: int
    layers: Annotated[int, Field(ge=1)]
    kv_tokens: Annotated[float, Field(description="KV cache tokens this stage holds (vLLM takes the minimum over stages)")]
    cost: LayerCostRecord
    head_s: Annotated[float, Field(ge=0, description="reading the lm_head once per step (last stage)")] = 0.0


class HopRecord(Frozen):
    """A link a batch crosses between consecutive stages."""

    latency_s: float
    bandwidth: Annotated[float, Field(gt=0, description="bytes/s")]


class StepModelRecord(Frozen):
    """A replica's step times as plan.json states them; `model()` is perf's ReplicaModel of them."""

    stages: tuple[StageRecord, ...]
    hops: Annotated[tuple[HopRecord, ...], Field(description="len(stages) - 1 links, in chain order")] = ()
    activation_bytes: Annotated[float, Field(description="bytes per token crossing a stage-to-stage hop")] = 0.0
    step_overhead_s: Annotated[float, Field(ge=0, description="o: scheduler + sampling per engine step")] = 0.0
    step_gpu_s: Annotated[float, Field(ge=0, description="g: GPU work per engine step outside the per-layer kernels (the sampler over the vocabulary, input copies, launch gaps), on the last stage's GPU time")] = 0.0
    seq_overhead_s: Annotated[float, Field(ge=0, description="q: host CPU work per sequence in an engine step")] = 0.0
    request_overhead_s: Annotated[float, Field(ge=0, description="per request, once before its first token: HTTP, tokenization, scheduling")] = 0.0
    max_num_seqs: Annotated[int, Field(description="vLLM --max-num-seqs")]
    chunk_tokens: Annotated[int, Field(description="prompt tokens per engine step (chunked-prefill budget)")]
    host_overlap: Annotated[bool, Field(description="host work overlaps the GPU (vLLM's async scheduling, the default of the vLLM plans deploy); false only to replay older engines' measurements")] = True
    source: Literal["analytic", "fitted"] = "analytic"

    def model(self) -> ReplicaModel:
        """perf's step model of these numbers (what the simulator and the capacity formula evaluate)."""
        return ReplicaModel.model_validate(self.model_dump())


def record_of(rm: ReplicaModel) -> StepModelRecord:
    """plan.json's record of perf's model; a pydantic ValidationError names any field of perf's
    model the public record does not carry (add it here, and to the schema, on purpose)."""
    return StepModelRecord.model_validate(rm.model_dump())
