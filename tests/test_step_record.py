"""plan.json's step-model record (plan/step_record.py) against perf's model: one set of fields,
an exact round trip, and a refusal when perf grows a term the public record lacks."""

from __future__ import annotations

import pydantic
import pytest

from conftest import ROOT
from hetcompile.perf.stepmodel import Hop, LayerCost, ReplicaModel, StageModel
from hetcompile.plan.io import read_plan_doc
from hetcompile.plan.step_record import HopRecord, LayerCostRecord, StageRecord, StepModelRecord, record_of

GOLDEN = ROOT / "tests" / "golden"


def _model() -> ReplicaModel:
    cost = LayerCost(weights_s=1e-4, kv_s_per_token=2e-9, flop_s_per_token=3e-7, attn_s_per_pair=4e-12,
                     comm_s_per_token=5e-9, comm_s=6e-6, serial_fraction=0.1, source="kernels")
    stages = (StageModel(gpu="H100", tp=2, layers=16, kv_tokens=1e5, cost=cost),
              StageModel(gpu="A100", tp=2, layers=16, kv_tokens=8e4, cost=cost.model_copy(update={"source": "roofline"}), head_s=1e-3))
    return ReplicaModel(stages=stages, hops=(Hop(latency_s=1e-3, bandwidth=1e10),), activation_bytes=8192,
                        step_overhead_s=2e-3, step_gpu_s=4e-4, seq_overhead_s=1e-5, request_overhead_s=0.02,
                        max_num_seqs=256, chunk_tokens=2048, host_overlap=False, source="fitted")


@pytest.mark.parametrize(("record", "model"), [(StepModelRecord, ReplicaModel), (StageRecord, StageModel),
                                               (LayerCostRecord, LayerCost), (HopRecord, Hop)])
def test_the_record_has_the_fields_of_perfs_model(record: type, model: type) -> None:
    assert list(record.model_fields) == list(model.model_fields)


def test_a_model_round_trips_through_its_record() -> None:
    rm = _model()
    rec = record_of(rm)
    assert rec.model() == rm
    assert StepModelRecord.model_validate_json(rec.model_dump_json()).model() == rm


def test_a_term_the_record_lacks_is_refused_not_dropped() -> None:
    class Grown(ReplicaModel):
        new_term_s: float = 1.0

    grown = Grown(**_model().model_dump())
    with pytest.raises(pydantic.ValidationError, match="new_term_s"):
        record_of(grown)


def test_every_golden_plan_reads_back_a_step_model() -> None:
    plans = sorted(GOLDEN.glob("*/plan.json"))
    assert plans
    for path in plans:
        for r in read_plan_doc(path).replicas:
            if r.step_model is not None:
                rm = r.replica_model()
                assert isinstance(rm, ReplicaModel) and record_of(rm) == r.step_model, (path, r.id)
