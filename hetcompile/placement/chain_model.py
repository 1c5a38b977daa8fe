"""A placed chain as the one step-time model (perf/stepmodel.ReplicaModel).

Placement searches over stage units (a group's node, a TP size, a layer range); every number it
ranks chains by, and every number the plan then reports for them, comes from perf/capacity.py
applied to the ReplicaModel built here, the same model plan.json carries and the simulator replays:

    stage i      StageModel(gpu, tp, k_i layers, KV_i = kv_token_layers[k_i - 1] / k_i, cost, head)
    cost         the profile's LayerCost: the analytic roofline itself, or for measured tables
                 (Helix's per-layer decode / prompt times) the roofline fitted to them (perf/fit.py)
    hop i        the link between the hosts of stages i and i+1 (none inside one host)
    o, q, r      ModelSpec's step, per-sequence and per-request overheads; chunk budget; max_num_seqs

Costs fitted from tables are kept per (profile, context) so the search does not refit them.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetcompile.perf.fit import roofline_from_tables
from hetcompile.perf.stepmodel import Hop, LayerCost, ReplicaModel, StageModel
from hetcompile.placement.problem import PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit
from hetcompile.placement.tables import host

SAME_HOST = Hop(latency_s=0.0, bandwidth=1e30)  # two stages on one host: no network between them
UNBOUNDED_SEQS = 1_000_000  # a model spec without --max-num-seqs (Helix setups): KV-limited only

_fitted: dict[tuple[int, float], tuple[StageProfile, LayerCost]] = {}


def layer_cost(prof: StageProfile, context_tokens: float) -> LayerCost:
    """The profile's per-layer roofline (fitted once per profile and context from its tables)."""
    if prof.cost is not None:
        return prof.cost
    key = (id(prof), context_tokens)
    hit = _fitted.get(key)
    if hit is None or hit[0] is not prof:
        hit = (prof, roofline_from_tables(prof.decode_time, prof.prefill_time, context_tokens))
        _fitted[key] = hit
    return hit[1]


def stage_model(p: PlacementProblem, u: StageUnit, last: bool) -> StageModel:
    prof = p.groups[u.gi].profile(u.tp)
    return StageModel.model_construct(
        gpu=p.groups[u.gi].gpu, tp=u.tp, layers=u.layers, kv_tokens=prof.kv_token_layers[u.layers - 1] / u.layers,
        cost=layer_cost(prof, p.model.context_tokens), head_s=prof.head_s if last else 0.0,
    )


def hop(p: PlacementProblem, a: str, b: str) -> Hop:
    """The link between stage units a and b (none on one host), remembered per pair: depth_split
    asks for the hops of every chain it values."""
    key = ("hop", a, b)
    found = p.memo.get(key)
    if found is None:
        ha, hb = host(a), host(b)
        if ha == hb:
            found = SAME_HOST
        else:
            lk = p.link(ha, hb)
            found = Hop.model_construct(latency_s=lk.latency, bandwidth=lk.bandwidth)
        p.memo[key] = found
    return found


def chain_model(p: PlacementProblem, stages: Sequence[StageUnit]) -> ReplicaModel:
    """The chain `stages` (in order) as a ReplicaModel (model_construct: the search builds many)."""
    m = p.model
    d = len(stages)
    return ReplicaModel.model_construct(
        stages=tuple(stage_model(p, u, i == d - 1) for i, u in enumerate(stages)),
        hops=tuple(hop(p, a.unit, b.unit) for a, b in zip(stages, stages[1:])),
        activation_bytes=m.activation_bytes, step_overhead_s=m.step_overhead_s, seq_overhead_s=m.seq_overhead_s,
        request_overhead_s=m.request_overhead_s, step_gpu_s=m.step_gpu_s,
        max_num_seqs=m.max_concurrency if m.max_concurrency is not None else UNBOUNDED_SEQS,
        chunk_tokens=m.prefill_chunk_tokens,
        source="analytic" if all(p.groups[u.gi].profile(u.tp).cost is not None for u in stages) else "fitted",
    )


def full_tokens_per_s(p: PlacementProblem, stages: Sequence[StageUnit]) -> float:
    """Prompt + decode tokens/s of a chain at the model's mean workload by the formula's full mode
    (prompt lumps, pipeline waits): what the plan will report for it."""
    from hetcompile.perf.capacity import chain_capacity

    m = p.model
    e = chain_capacity(chain_model(p, stages), m.input_tokens, m.output_tokens)
    return e.requests_per_s * (m.input_tokens + m.output_tokens)
