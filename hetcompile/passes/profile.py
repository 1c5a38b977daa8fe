"""profile: performance tables and the candidate replica shapes (seed 003's configurations c).

For every model and every GPU type offered, and every TP degree t that fits a node of that offer
(t a power of two dividing the attention heads, t <= gpus_per_node: seed 003 App. D keeps TP inside
a machine), the pass computes the memory table row (`PerfEntry`: usable bytes, bytes per layer,
KV bytes per token-layer, max layers per stage). A shape c = (model, offer, t, d) is a chain of d
same-type nodes with the balanced non-uniform layer split (App. D: partition by memory); its
estimate holds h_{c,w} (requests/s per workload), KV capacity (the minimum over stages, as vLLM
computes it), concurrency and which term binds -- formulas in `hetcompile.perf.analytic`.

d runs from the least depth that fits the model to one more (deeper same-type chains only add KV
and hop latency); measured profiles (`profiles:` in the spec) add or override shapes and their
h_{c,w} (seed 003 App. C/L: one-time profiling), and mark the estimate `measured`; fitted step-time
coefficients (`hetcompile profile`, perf/fit.py) replace the shape's step model and everything
derived from it. A profile with no numbers is a spec error (lower.py), never a `measured` label.

Paper: Jiang et al., "Demystifying Cost-Efficiency in LLM Serving over Heterogeneous GPUs" (seed 003), §4.3 (configurations c and h_(c,w)), App. D (memory partition), App. L (one-time profiling);
Xiong et al., "High-Throughput LLM inference on Heterogeneous Clusters" (Huawei; seed 004), §3.2 eq. 3-4 (the fitted step latency).
"""

from __future__ import annotations

import functools

import hashlib
from collections import OrderedDict

from hetcompile.ir.problem import MeasuredShape, Offer, PerfEntry, Problem, Shape, ShapeEstimate
from hetcompile.passes.base import Pass, PassContext
from hetcompile.passes.profile_pd import phase_shapes
from hetcompile.perf import analytic
from hetcompile.perf.capacity import chain_capacity
from hetcompile.perf.tail import PERCENTILES, default_ttft_bound, tail_capacity
from hetcompile.perf.stepmodel import LayerCost, ReplicaModel
from hetcompile.perf import stepmodel
from hetcompile.ir.observed import correction

EXTRA_DEPTH = 1


def tp_degrees(heads: int, gpus_per_node: int) -> list[int]:
    out, t = [], 1
    while t <= gpus_per_node:
        if heads % t == 0:
            out.append(t)
        t *= 2
    return out


def perf_table(ir: Problem) -> tuple[PerfEntry, ...]:
    rows = {}
    for m in ir.models:
        for o in ir.offers:
            for t in tp_degrees(m.arch.heads, o.gpus_per_node):
                key = (m.name, o.gpu, t)
                if key not in rows:
                    rows[key] = analytic.perf_entry(
                        m.name, m.arch, m.dtype_bytes, ir.gpu(o.gpu), t, ir.engine.gpu_memory_utilization, m.max_model_len
                    )
    return tuple(rows[k] for k in sorted(rows))


def _intra_link(ir: Problem, region: str) -> tuple[float, float]:
    link = next(l for l in ir.links if l.a == region and l.b == region)
    return link.latency, link.bandwidth


def estimate_shape(ir: Problem, model: str, offer: Offer, entry: PerfEntry, partition: tuple[int, ...]) -> ShapeEstimate:
    m = ir.model(model)
    gpu = ir.gpu(offer.gpu)
    d = len(partition)
    kv = [analytic.stage_kv_tokens(entry, k, i == 0, i == d - 1) for i, k in enumerate(partition)]
    stages = [(gpu, entry.tp, k, kv[i]) for i, k in enumerate(partition)]
    lat, bw = _intra_link(ir, offer.region)
    rm = analytic.replica_model(m.arch, m.dtype_bytes, stages, lat, bw, ir.engine.max_num_seqs)
    k = correction(ir, offer.gpu, entry.tp)
    if k != 1.0:  # build --observed: step times as the running fleet showed them on this GPU type and TP
        rm = stepmodel.scaled(rm, k)
    return ShapeEstimate(kv_capacity_tokens=int(min(kv)), source="analytic", **workload_estimates(ir, model, rm))


# Workloads with the same lengths and targets get the same numbers, and so do shapes with the same
# step model (one GPU type, TP and partition in regions with the same link): each computed once per
# process (a spec with thousands of workloads of a few kinds profiles like one with a few; 1,072
# nodes in 10 regions repeat a few dozen replica models). Pure functions of hashable inputs, bounded.
_chain = functools.lru_cache(maxsize=4096)(chain_capacity)
_tail = functools.lru_cache(maxsize=4096)(tail_capacity)
_bound = functools.lru_cache(maxsize=4096)(default_ttft_bound)


def workload_estimates(ir: Problem, model: str, rm: ReplicaModel) -> dict:
    """Per-workload capacity of one replica model: h_{c,w} at full load (chain_capacity), and the
    load the plan may put on it (perf/tail.py's tail_capacity): the headroom `max_utilization` x h,
    or less where the workload's SLO percentile binds (0 excludes the shape for that workload) or,
    without an SLO and with `max_ttft_slowdown` set, where its p99 TTFT would pass that multiple of
    the idle TTFT, times
    the share the build's simulation left it (`tail_factors`). The analytic and the fitted step model
    both come through here, so a measured profile is sized for the tail too. ttft_s / tpot_s: the
    full-load values for a workload without SLO, the SLO percentile's at the planned load with one."""
    rps, full, conc, bind, ttft, tpot = [], [], [], [], [], []
    factors = dict(ir.tail_factors)
    pre = dec = 0.0
    for w in (w for w in ir.workloads if w.model == model):
        e = _chain(rm, w.input_tokens, w.output_tokens)
        pre, dec = max(pre, e.prefill_tokens_per_s), max(dec, e.decode_tokens_per_s)
        full.append((w.name, e.requests_per_s))
        factor = factors.get(w.name, 1.0)
        if w.ttft_slo is not None or w.tpot_slo is not None:
            t = _tail(rm, w.input_tokens, w.output_tokens, w.slo_quantile, w.ttft_slo, w.tpot_slo, ir.max_utilization)
            rps.append((w.name, t.requests_per_s * factor))
            conc.append((w.name, t.concurrency))
            b = "slo-" + t.binding.removeprefix("slo-") if t.binding != "headroom" else "slo-headroom"
            bind.append((w.name, f"{b}: {t.reason}" if t.reason else b))
            ttft.append((w.name, t.ttft_s))
            tpot.append((w.name, t.tpot_s))
            continue
        if ir.max_ttft_slowdown is None:
            rps.append((w.name, ir.max_utilization * e.requests_per_s * factor))
            bind.append((w.name, e.binding))
        else:
            bound = _bound(rm, w.input_tokens, w.output_tokens, ir.max_ttft_slowdown)
            t = _tail(rm, w.input_tokens, w.output_tokens, PERCENTILES["p99"], bound, None, ir.max_utilization)
            rps.append((w.name, t.requests_per_s * factor))
            bind.append((w.name, e.binding if t.binding == "headroom" else
                         f"queueing: p99 TTFT held within {ir.max_ttft_slowdown:g}x the idle replica's "
                         f"{bound / ir.max_ttft_slowdown:.3g} s"))
        conc.append((w.name, e.concurrency))
        ttft.append((w.name, e.ttft_s))
        tpot.append((w.name, e.tpot_s))
    return {
        "throughput_rps": tuple(rps), "full_rps": tuple(full), "concurrency": tuple(conc), "binding": tuple(bind),
        "ttft_s": tuple(ttft), "tpot_s": tuple(tpot), "prefill_tokens_per_s": pre, "decode_tokens_per_s": dec,
        "step_model": rm,
    }


def fitted_model(rm: ReplicaModel, coeff: dict[str, float], kv_tokens: int | None) -> ReplicaModel:
    """The analytic step model with the fitted linear one (perf/fit.py) in its place: o becomes the
    step overhead; c and k are spread over the layers, c as the per-token term that sits outside the
    roofline's max (comm_s_per_token, linear like the fit) and k as the KV read term, with the
    weights and compute terms at zero (the memory-bound special case of perf/stepmodel.py)."""
    layers = sum(st.layers for st in rm.stages)
    cost = LayerCost(weights_s=0.0, kv_s_per_token=coeff["per_kv_token_s"] / layers, flop_s_per_token=0.0,
                     attn_s_per_pair=0.0, comm_s_per_token=coeff["per_token_s"] / layers, comm_s=0.0)
    # the fit's o + c n + k S is the whole step: no separate lm_head read, no g (step_gpu_s)
    stages = tuple(st.model_copy(update={"cost": cost, "kv_tokens": float(kv_tokens or st.kv_tokens), "head_s": 0.0})
                   for st in rm.stages)
    # q (host work per sequence) is inside the fitted per-token c: a decode step has one token per sequence;
    # the fit's o is a constant of the whole measured step, so it adds (host_overlap off), not overlaps
    return rm.model_copy(update={"stages": stages, "step_overhead_s": coeff["step_s"], "seq_overhead_s": 0.0, "step_gpu_s": 0.0,
                                 "request_overhead_s": coeff.get("request_s", 0.0), "source": "fitted",
                                 "host_overlap": False})


def apply_measured(ir: Problem, model: str, est: ShapeEstimate, meas: MeasuredShape) -> ShapeEstimate:
    """Measured numbers replace the analytic ones they cover; the rest stays analytic. Fitted
    coefficients replace the step model first, and every estimate derived from it. A measured
    throughput of a workload with SLOs is its capacity unconstrained, so it never raises the
    SLO-capped one."""
    if meas.coefficients and est.step_model is not None:
        rm = fitted_model(est.step_model, dict(meas.coefficients), meas.kv_capacity_tokens)
        est = est.model_copy(update={"kv_capacity_tokens": int(rm.kv_capacity_tokens), **workload_estimates(ir, model, rm)})
    measured = dict(meas.throughput)
    slo = {w.name for w in ir.workloads if w.ttft_slo is not None or w.tpot_slo is not None}
    # the measured number wins unless the workload's SLO caps the replica below it
    # (the measured h is a full-load number: the plan keeps the same headroom below it)
    factors = dict(ir.tail_factors)
    planned = {w: ir.max_utilization * v * factors.get(w, 1.0) for w, v in measured.items()}
    wins = {w for w, v in est.throughput_rps if w in measured and not (w in slo and v < planned[w])}
    rps = tuple((w, planned[w] if w in wins else v) for w, v in est.throughput_rps)
    full = tuple((w, measured[w] if w in wins else v) for w, v in (est.full_rps or est.throughput_rps))
    return est.model_copy(
        update={
            "throughput_rps": rps,
            "full_rps": full,
            "kv_capacity_tokens": meas.kv_capacity_tokens or est.kv_capacity_tokens,
            "prefill_tokens_per_s": meas.prefill_tokens_per_s or est.prefill_tokens_per_s,
            "decode_tokens_per_s": meas.decode_tokens_per_s or est.decode_tokens_per_s,
            "binding": tuple((w, "measured" if w in wins else b) for w, b in est.binding),
            "source": "measured",
        }
    )


def even_partition(layers: int, stages: int) -> tuple[int, ...]:
    base, extra = divmod(layers, stages)
    # vLLM's default puts the remainder on the early/middle stages, never the last
    return tuple(base + (1 if i < extra else 0) for i in range(stages))


def enumerate_shapes(ir: Problem, table: tuple[PerfEntry, ...]) -> tuple[Shape, ...]:
    entries = {(e.model, e.gpu, e.tp): e for e in table}
    shapes: dict[str, Shape] = {}
    for m in ir.models:
        L = m.arch.layers
        for o in ir.offers:
            for t in tp_degrees(m.arch.heads, o.gpus_per_node):
                if m.tp is not None and t not in m.tp:  # the spec pins the TP degree
                    continue
                e = entries[(m.name, o.gpu, t)]
                max_nodes = o.max_gpus // t
                measured = {(x.pp): x for x in ir.measured if x.model == m.name and x.gpu == o.gpu and x.tp == t}
                depths = set(measured)
                if e.max_layers > 0 and not ir.measured_only:
                    d_min = -(-L // e.max_layers)
                    depths |= set(range(d_min, d_min + EXTRA_DEPTH + 1))
                if m.pp is not None:  # the spec pins the depth: those, where the model fits
                    depths = {d for d in m.pp if d in measured or (e.max_layers > 0 and not ir.measured_only)}
                for d in sorted(depths):
                    if d > max_nodes or d > L:
                        continue
                    part = analytic.balanced_partition(e, L, d, m.max_model_len)
                    if part is None:
                        if d not in measured:
                            continue
                        part = even_partition(L, d)
                    est = estimate_shape(ir, m.name, o, e, part)
                    if d in measured:
                        est = apply_measured(ir, m.name, est, measured[d])
                    sid = f"{m.name}|{o.id}|tp{t}|pp{d}"
                    for cid, cest in slo_copies(ir, m.name, sid, est):
                        shapes[cid] = Shape(
                            id=cid, model=m.name, offer=o.id, gpu=o.gpu, region=o.region, tp=t, pp=d, partition=part,
                            price_per_s=t * d * o.price_per_gpu_s, estimate=cest,
                        )
    return tuple(shapes[k] for k in sorted(shapes))


def slo_copies(ir: Problem, model: str, sid: str, est: ShapeEstimate) -> list[tuple[str, ShapeEstimate]]:
    """A shape, split so that SLO workloads get replicas of their own.

    A replica that also serves other workloads runs their (longer) sequences in the same batches,
    which breaks the TPOT the SLO capacity was sized for. So when a model has several workloads,
    each workload with an SLO is served only by dedicated copies `<shape>|slo:<workload>` (its own
    SLO capacity, zero for the others), and the plain shape serves the workloads without SLOs
    (it is dropped when every workload has one)."""
    ws = [w for w in ir.workloads if w.model == model]
    slo = [w.name for w in ws if w.ttft_slo is not None or w.tpot_slo is not None]
    if not slo or len(ws) == 1:
        return [(sid, est)]

    def only(keep: set[str]) -> ShapeEstimate:
        return est.model_copy(update={"throughput_rps": tuple((w, v if w in keep else 0.0) for w, v in est.throughput_rps)})

    out = [(f"{sid}|slo:{w}", only({w})) for w in slo]
    rest = {w.name for w in ws} - set(slo)
    if rest:
        out.insert(0, (sid, only(rest)))
    return out


def scaled(shape: Shape, factors: dict[str, float]) -> Shape:
    """The shape with each workload's planned load times its tail factor f_w (workload_estimates:
    the same product, so the same float, as computing the estimate with the factor)."""
    rps = tuple((w, v * factors.get(w, 1.0)) for w, v in shape.estimate.throughput_rps)
    return shape.model_copy(update={"estimate": shape.estimate.model_copy(update={"throughput_rps": rps})})


# The verify pass re-runs the pipeline with new tail factors, and they scale each workload's planned
# load and nothing else this pass computes (the tail model's evaluations are most of its time): the
# tables and shapes at factor 1 are remembered by the rest of the IR, and scaled.
_AT_ONE: OrderedDict[str, tuple[tuple[PerfEntry, ...], tuple[Shape, ...]]] = OrderedDict()
_AT_ONE_SIZE = 8


class Profile(Pass):
    name = "profile"
    provides = "shapes"

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        one = ir.model_copy(update={"tail_factors": (), "reports": ()})
        key = hashlib.sha256(one.model_dump_json().encode()).hexdigest()
        if key not in _AT_ONE:
            table = perf_table(one)
            shapes = enumerate_shapes(one, table)
            if one.disaggregation:  # spec `disaggregation: auto`: prefill and decode shapes beside them
                shapes = tuple(sorted(shapes + phase_shapes(one, table, shapes), key=lambda s: s.id))
            _AT_ONE[key] = (table, shapes)
            if len(_AT_ONE) > _AT_ONE_SIZE:
                _AT_ONE.popitem(last=False)
        _AT_ONE.move_to_end(key)
        table, shapes = _AT_ONE[key]
        factors = dict(ir.tail_factors)
        if factors:
            shapes = tuple(scaled(s, factors) for s in shapes)
        return ir.model_copy(update={"perf": table, "shapes": shapes})

    def verify(self, ir: Problem) -> None:
        from hetcompile.errors import PassError

        for s in ir.shapes or ():
            if sum(s.partition) != ir.model(s.model).arch.layers or len(s.partition) != s.pp:
                raise PassError(f"profile: shape {s.id} partition {s.partition} does not cover the model's layers")
