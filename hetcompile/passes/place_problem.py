"""The bridge between the IR and `hetcompile.placement`: node pools in, PlacementProblem out,
chains back to per-workload replica estimates. Pure functions, no solver.

Stage profiles (seed 000 §4.3's node capacity T(k), plus what the depth-aware model needs) come
from the spec's `placement.layer_profiles` when one matches (model, GPU, TP), else from the
analytic model (perf/analytic.py) sampled into tables, for the model's demand-weighted mean
workload I in, O out, context s = I + O/2:

    U, W_L, kappa, E     usable bytes, layer bytes, K+V bytes per token-layer, embed + head bytes
    KV(k)   = (U - k W_L - E) / kappa          token-layer entries; E is charged to every stage
                                                 (any stage may be first or last), so it is safe
    K       = max k with KV(k) / k >= max_model_len     (vLLM refuses to start otherwise)
    dec(b)  = t_dec(1 layer, b sequences, s)   at b = 1, 2, 4, ..., 1024
    pre(p)  = t_pre(1 layer, p tokens)         at p = 128, ..., 16384
    b_k     = min(max_num_seqs, KV(k) / (k s)) Helix's typical batch, sized from the node's KV
    T(k)    = (1 + I/O) b_k / (k (dec(b_k) + b_k (I/O) pre(2048) / 2048))

Links: region pairs from the IR; a token crossing a coordinator link is 2 bytes and a
stage-to-stage activation is hidden x dtype bytes (Helix's sizes). The coordinator is the
router's region (`placement.coordinator`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from hetcompile.ir.problem import LayerProfile, Node, Problem, ShapeEstimate, Workload
from hetcompile.perf import analytic
from hetcompile.placement.evaluate import chain_eval, hop_time, unit_profile
from hetcompile.placement.problem import Link, ModelSpec, NodeGroup, PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit
from hetcompile.placement.tables import interp

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
        max_concurrency=ir.engine.max_num_seqs, prefill_chunk_tokens=analytic.PREFILL_CHUNK,
        step_overhead_s=analytic.STEP_OVERHEAD_S, seq_overhead_s=analytic.SEQ_OVERHEAD_S,
    )


def analytic_profile(ir: Problem, spec: ModelSpec, gpu: str, tp: int) -> StageProfile | None:
    """The analytic model's tables for one stage of `tp` GPUs (None: not one layer fits)."""
    m, g = ir.model(spec.name), ir.gpu(gpu)
    e = analytic.perf_entry(m.name, m.arch, m.dtype_bytes, g, tp, ir.engine.gpu_memory_utilization, m.max_model_len)
    extras = e.embed_bytes + e.head_bytes
    kv = []
    for k in range(1, m.arch.layers + 1):
        entries = (e.usable_bytes - k * e.layer_bytes - extras) / e.kv_bytes_per_token_layer
        if entries / k < m.max_model_len:
            break
        kv.append(entries)
    if not kv:
        return None
    s, ratio = spec.context_tokens, spec.input_tokens / spec.output_tokens
    dec = tuple((float(b), analytic.decode_step_time(m.arch, m.dtype_bytes, g, tp, 1, b, s)) for b in DECODE_BATCHES)
    pre = tuple((float(p), analytic.prefill_time(m.arch, m.dtype_bytes, g, tp, 1, p)) for p in PREFILL_TOKENS)
    per_tok = interp(pre, analytic.PREFILL_CHUNK) / analytic.PREFILL_CHUNK
    T = []
    for k, entries in enumerate(kv, start=1):
        b = min(float(ir.engine.max_num_seqs), entries / (k * s))
        T.append((1.0 + ratio) * b / (k * (interp(dec, b) + b * ratio * per_tok)))
    return StageProfile(tp=tp, max_layers=len(kv), throughput=tuple(T), kv_token_layers=tuple(kv), decode_time=dec,
                        prefill_time=pre, source="analytic")


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


def chain_estimate(p: PlacementProblem, stages: Sequence[StageUnit], ws: Sequence[Workload]) -> ShapeEstimate:
    """Per-workload capacity of one placed chain, by the depth-aware model (evaluate.py).

    h_w = capacity_w / (I_w + O_w) requests/s (capacity counts prompt + decode tokens);
    TTFT_w = sum_i k_i pre_i(I_w) + hops; TPOT_w = C_w / X_w (X_w decode tokens/s).
    """
    tput, conc, bind, ttft, tpot = [], [], [], [], []
    kv_tokens = min(unit_profile(p, u).kv_token_layers[u.layers - 1] / u.layers for u in stages)
    decode = math.inf
    for w in sorted(ws, key=lambda w: w.name):
        pw = replace(p, model=replace(p.model, input_tokens=w.input_tokens, output_tokens=w.output_tokens))
        ev = chain_eval(pw, stages)
        x = ev.capacity / (1.0 + w.input_tokens / w.output_tokens)  # decode tokens/s
        tput.append((w.name, ev.capacity / (w.input_tokens + w.output_tokens)))
        conc.append((w.name, ev.concurrency))
        kind = "max-num-seqs" if ev.concurrency_limit == "max-num-seqs" else (
            "depth" if ev.binding == "latency" else "bottleneck-stage")
        bind.append((w.name, kind))
        hops = sum(hop_time(pw, a.unit, b.unit, 1.0) for a, b in zip(stages, stages[1:]))
        ttft.append((w.name, sum(u.layers * interp(unit_profile(p, u).prefill_time, w.input_tokens) for u in stages) + hops))
        tpot.append((w.name, ev.concurrency / x))
        decode = min(decode, x)
    chunk = float(p.model.prefill_chunk_tokens)
    prefill = chunk / max(u.layers * interp(unit_profile(p, u).prefill_time, chunk) for u in stages)
    sources = {unit_profile(p, u).source for u in stages}
    return ShapeEstimate(
        kv_capacity_tokens=int(kv_tokens), prefill_tokens_per_s=prefill, decode_tokens_per_s=decode,
        throughput_rps=tuple(tput), concurrency=tuple(conc), binding=tuple(bind), ttft_s=tuple(ttft), tpot_s=tuple(tpot),
        source="analytic" if sources == {"analytic"} else "measured",
    )
