"""The bridge between the IR and `hetcompile.placement`: node pools in, PlacementProblem out,
chains back to per-workload replica estimates. Pure functions, no solver.

Stage profiles (seed 000 §4.3's node capacity T(k), plus what the depth-aware model needs) come
from the spec's `placement.layer_profiles` when one matches (model, GPU, TP), else from the
analytic model (perf/analytic.py), for the model's demand-weighted mean workload I in, O out,
context s = I + O/2:

    U, W_L, kappa, E     usable bytes, layer bytes, K+V bytes per token-layer, embed + head bytes
    KV(k)   = (U - k W_L - E) / kappa          token-layer entries; E is charged to every stage
                                                 (any stage may be first or last), so it is safe
    K       = max k with KV(k) / k >= max_model_len     (vLLM refuses to start otherwise)
    cost    = the analytic per-layer roofline (perf/stepmodel.LayerCost); measured tables get one
              fitted to them (placement/chain_model.py)
    b_k     = min(max_num_seqs, KV(k) / (k s)) Helix's typical batch, sized from the node's KV
    T(k)    = (1 + I/O) X of one stage of k layers at b_k (perf/capacity.fluid_rate: the fast mode)

A chain's estimate is perf/capacity.py's full mode on its ReplicaModel (`chain_estimate`).

Links: region pairs from the IR; a token crossing a coordinator link is 2 bytes and a
stage-to-stage activation is hidden x dtype bytes (Helix's sizes). The coordinator is the
router's region (`placement.coordinator`).

Paper: Mei et al., "Helix: Serving Large Language Models over Heterogeneous GPUs and Network via Max-Flow" (ASPLOS 2025; seed 000), §4.3 (node capacity T(k) and the flow graph).
"""

from __future__ import annotations

from collections.abc import Sequence

from hetcompile.ir.problem import LayerProfile, Node, Problem, ShapeEstimate, Workload
from hetcompile.passes.profile import workload_estimates
from hetcompile.perf import analytic
from hetcompile.perf.capacity import fluid_batch, fluid_rate
from hetcompile.perf.stepmodel import step_seconds
from hetcompile.placement.chain_model import chain_model
from hetcompile.placement.evaluate import unit_profile
from hetcompile.placement.problem import Link, ModelSpec, NodeGroup, PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit

TOKEN_BYTES = 2.0  # Helix: a token id on a coordinator link
DECODE_BATCHES = tuple(2**i for i in range(11))  # 1 .. 1024 sequences
PREFILL_TOKENS = tuple(128 * 2**i for i in range(8))  # 128 .. 16384 tokens


def mean_workload(ws: Sequence[Workload]) -> tuple[float, float]:
    """Demand-weighted mean (input, output) tokens of a model's workloads."""
    total = sum(w.demand for w in ws)
    return (sum(w.demand * w.input_tokens for w in ws) / total, sum(w.demand * w.output_tokens for w in ws) / total)


def model_spec(ir: Problem, model: str, ws: Sequence[Workload]) -> ModelSpec:
    m = ir.model(model)
    i, o = mean_workload(ws)
    return ModelSpec(
        name=model, num_layers=m.arch.layers, token_bytes=TOKEN_BYTES, activation_bytes=float(m.arch.hidden * m.dtype_bytes),
        input_tokens=i, output_tokens=o, kv_bytes_per_token_layer=2.0 * m.arch.kv_heads * m.arch.head_dim * m.dtype_bytes,
        max_concurrency=ir.engine.max_num_seqs, prefill_chunk_tokens=analytic.step_token_budget(ir.engine.max_num_seqs),
        step_overhead_s=analytic.STEP_OVERHEAD_S, seq_overhead_s=analytic.SEQ_OVERHEAD_S,
        request_overhead_s=analytic.REQUEST_OVERHEAD_S, step_gpu_s=analytic.STEP_GPU_S,
    )


def analytic_profile(ir: Problem, spec: ModelSpec, gpu: str, tp: int) -> StageProfile | None:
    """The analytic model's stage of `tp` GPUs (None: not one layer fits): its KV table, its exact
    per-layer roofline, and Helix's node capacity T(k) from the one formula's fast mode on a stage
    of k layers alone (the flow objective and bounds read T)."""
    m, g = ir.model(spec.name), ir.gpu(gpu)
    e = analytic.perf_entry(m.name, m.arch, m.dtype_bytes, g, tp, ir.engine.gpu_memory_utilization, m.max_model_len)
    kv = []
    for k in range(1, m.arch.layers + 1):
        # a node's table does not know where in a chain it sits: it keeps room for both ends' weights
        entries = analytic.stage_kv_token_layers(e, k, first=True, last=True)
        if entries / k < m.max_model_len:
            break
        kv.append(entries)
    if not kv:
        return None
    cost = analytic.layer_cost(m.arch, m.dtype_bytes, g, tp)
    s, ratio = spec.context_tokens, spec.input_tokens / spec.output_tokens
    T = []
    for k, entries in enumerate(kv, start=1):
        b = min(float(ir.engine.max_num_seqs), entries / (k * s))
        n, S, A, seqs = fluid_batch(b, spec.input_tokens, spec.output_tokens)
        X, _ = fluid_rate((step_seconds(k * cost.time(n, S, A), spec.step_host_s(seqs)),), 0.0, b)
        T.append((1.0 + ratio) * X)
    return StageProfile(tp=tp, max_layers=len(kv), throughput=tuple(T), kv_token_layers=tuple(kv), decode_time=(),
                        prefill_time=(), source="analytic", cost=cost, head_s=analytic.head_time(m.arch, m.dtype_bytes, g, tp))


def measured_profile(lp: LayerProfile) -> StageProfile:
    return StageProfile(tp=lp.tp, max_layers=len(lp.throughput), throughput=lp.throughput, kv_token_layers=lp.kv_token_layers,
                        decode_time=lp.decode_time, prefill_time=lp.prefill_time, source=lp.source)


def stage_profile(ir: Problem, spec: ModelSpec, gpu: str, tp: int) -> StageProfile | None:
    for lp in ir.placement.layer_profiles:
        if (lp.model, lp.gpu, lp.tp) == (spec.name, gpu, tp):
            return measured_profile(lp)
    return analytic_profile(ir, spec, gpu, tp)


def placement_problem(ir: Problem, model: str, pool: Sequence[Node]) -> PlacementProblem:
    """One model over a pool of concrete nodes; nodes of one offer and size form a group."""
    ws = [w for w in ir.workloads if w.model == model]
    spec = model_spec(ir, model, ws)
    by_key: dict[tuple[str, int], list[Node]] = {}
    for n in pool:
        by_key.setdefault((n.offer, n.gpus), []).append(n)
    groups = []
    for (offer, gpus), nodes in sorted(by_key.items()):
        o = ir.offer(offer)
        profiles = tuple(p for t in range(gpus, 0, -1) if gpus % t == 0 for p in [stage_profile(ir, spec, o.gpu, t)] if p)
        if not profiles or profiles[0].tp != gpus:
            continue  # not one layer fits a whole node: the group cannot serve this model
        groups.append(NodeGroup(
            id_prefix=f"{offer}x{gpus}#", gpu=o.gpu, region=o.region, count=len(nodes), gpus_per_node=gpus,
            profiles=profiles, node_ids=tuple(n.id for n in nodes),
        ))
    regions = sorted({g.region for g in groups} | {ir.placement.coordinator})
    links = tuple(Link(lk.a, lk.b, lk.bandwidth, lk.latency) for lk in ir.links if lk.a in regions and lk.b in regions)
    return PlacementProblem(f"{ir.name}/{model}", spec, tuple(groups), links, ir.placement.coordinator)


def chain_estimate(ir: Problem, p: PlacementProblem, stages: Sequence[StageUnit]) -> ShapeEstimate:
    """Per-workload capacity of one placed chain: perf/capacity.py's full mode (with the workloads'
    SLOs, profile.workload_estimates) on the chain's ReplicaModel, the model placement ranked it with
    in the fast mode and the one plan.json carries and the simulator replays."""
    rm = chain_model(p, stages)
    sources = {unit_profile(p, u).source for u in stages}
    return ShapeEstimate(kv_capacity_tokens=int(rm.kv_capacity_tokens),
                         source="analytic" if sources == {"analytic"} else "measured",
                         **workload_estimates(ir, p.model.name, rm))
