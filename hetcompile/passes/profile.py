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
"""

from __future__ import annotations

from hetcompile.ir.problem import MeasuredShape, Offer, PerfEntry, Problem, Shape, ShapeEstimate
from hetcompile.passes.base import Pass, PassContext
from hetcompile.perf import analytic
from hetcompile.perf.capacity import chain_capacity
from hetcompile.perf.stepmodel import LayerCost, ReplicaModel

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
    rps, conc, bind, ttft, tpot = [], [], [], [], []
    pre = dec = 0.0
    for w in (w for w in ir.workloads if w.model == model):
        est = chain_capacity(rm, w.input_tokens, w.output_tokens)
        rps.append((w.name, est.requests_per_s))
        conc.append((w.name, est.concurrency))
        bind.append((w.name, est.binding))
        ttft.append((w.name, est.ttft_s))
        tpot.append((w.name, est.tpot_s))
        pre, dec = max(pre, est.prefill_tokens_per_s), max(dec, est.decode_tokens_per_s)
    return ShapeEstimate(
        kv_capacity_tokens=int(min(kv)), prefill_tokens_per_s=pre, decode_tokens_per_s=dec, throughput_rps=tuple(rps),
        concurrency=tuple(conc), binding=tuple(bind), ttft_s=tuple(ttft), tpot_s=tuple(tpot), source="analytic",
        step_model=rm,
    )


def fitted_model(rm: ReplicaModel, coeff: dict[str, float], kv_tokens: int | None) -> ReplicaModel:
    """The analytic step model with the fitted linear one (perf/fit.py) in its place: o becomes the
    step overhead; c and k are spread over the layers, c as the per-token term that sits outside the
    roofline's max (comm_s_per_token, linear like the fit) and k as the KV read term, with the
    weights and compute terms at zero (the memory-bound special case of perf/stepmodel.py)."""
    layers = sum(st.layers for st in rm.stages)
    cost = LayerCost(weights_s=0.0, kv_s_per_token=coeff["per_kv_token_s"] / layers, flop_s_per_token=0.0,
                     attn_s_per_pair=0.0, comm_s_per_token=coeff["per_token_s"] / layers, comm_s=0.0)
    stages = tuple(st.model_copy(update={"cost": cost, "kv_tokens": float(kv_tokens or st.kv_tokens)}) for st in rm.stages)
    return rm.model_copy(update={"stages": stages, "step_overhead_s": coeff["step_s"], "source": "fitted"})


def _refit(est: ShapeEstimate, rm: ReplicaModel, workloads: dict, request_s: float) -> ShapeEstimate:
    rps, conc, bind, ttft, tpot = [], [], [], [], []
    pre = dec = 0.0
    for w, _ in est.throughput_rps:
        I, O = workloads[w]
        e = chain_capacity(rm, I, O)
        rps.append((w, e.requests_per_s))
        conc.append((w, e.concurrency))
        bind.append((w, e.binding))
        ttft.append((w, e.ttft_s + request_s))
        tpot.append((w, e.tpot_s))
        pre, dec = max(pre, e.prefill_tokens_per_s), max(dec, e.decode_tokens_per_s)
    return est.model_copy(update={
        "throughput_rps": tuple(rps), "concurrency": tuple(conc), "binding": tuple(bind), "ttft_s": tuple(ttft),
        "tpot_s": tuple(tpot), "prefill_tokens_per_s": pre, "decode_tokens_per_s": dec,
        "kv_capacity_tokens": int(rm.kv_capacity_tokens), "step_model": rm,
    })


def apply_measured(est: ShapeEstimate, meas: MeasuredShape, workloads: dict | None = None) -> ShapeEstimate:
    """Measured numbers replace the analytic ones they cover; the rest stays analytic. Fitted
    coefficients replace the step model first, and every estimate derived from it."""
    if meas.coefficients and est.step_model is not None and workloads is not None:
        coeff = dict(meas.coefficients)
        est = _refit(est, fitted_model(est.step_model, coeff, meas.kv_capacity_tokens), workloads, coeff.get("request_s", 0.0))
    measured = dict(meas.throughput)
    rps = tuple((w, measured.get(w, v)) for w, v in est.throughput_rps)
    return est.model_copy(
        update={
            "throughput_rps": rps,
            "kv_capacity_tokens": meas.kv_capacity_tokens or est.kv_capacity_tokens,
            "prefill_tokens_per_s": meas.prefill_tokens_per_s or est.prefill_tokens_per_s,
            "decode_tokens_per_s": meas.decode_tokens_per_s or est.decode_tokens_per_s,
            "binding": tuple((w, "measured" if w in measured else b) for w, b in est.binding),
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
                e = entries[(m.name, o.gpu, t)]
                max_nodes = o.max_gpus // t
                measured = {(x.pp): x for x in ir.measured if x.model == m.name and x.gpu == o.gpu and x.tp == t}
                depths = set(measured)
                if e.max_layers > 0 and not ir.measured_only:
                    d_min = -(-L // e.max_layers)
                    depths |= set(range(d_min, d_min + EXTRA_DEPTH + 1))
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
                        wl = {w.name: (w.input_tokens, w.output_tokens) for w in ir.workloads if w.model == m.name}
                        est = apply_measured(est, measured[d], wl)
                    sid = f"{m.name}|{o.id}|tp{t}|pp{d}"
                    shapes[sid] = Shape(
                        id=sid, model=m.name, offer=o.id, gpu=o.gpu, region=o.region, tp=t, pp=d, partition=part,
                        price_per_s=t * d * o.price_per_gpu_s, estimate=est,
                    )
    return tuple(shapes[k] for k in sorted(shapes))


class Profile(Pass):
    name = "profile"
    provides = "shapes"

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        table = perf_table(ir)
        return ir.model_copy(update={"perf": table, "shapes": enumerate_shapes(ir, table)})

    def verify(self, ir: Problem) -> None:
        from hetcompile.ir.errors import PassError

        for s in ir.shapes or ():
            if sum(s.partition) != ir.model(s.model).arch.layers or len(s.partition) != s.pp:
                raise PassError(f"profile: shape {s.id} partition {s.partition} does not cover the model's layers")
