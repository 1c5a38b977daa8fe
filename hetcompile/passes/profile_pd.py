"""Phase shapes: prefill-only and decode-only replicas of a disaggregated group (issue 35, item 2).

Beside the aggregated shapes, the profile pass can offer compose, per workload w, shapes that run
one phase of w's requests (perf/disagg.py has the model and its notation):

    decode shape  (model, offer o, TP t, PP 1) serving w:  h = u_max h_D at C*, --max-num-seqs C*
    prefill shape (model, offer o', TP t', PP 1) serving w, sized for ONE decode shape D of w in the
                  same region: h = the largest l_P whose TTFT_q (prefill, the KV transfer over the
                  region's link, D's first token and slot wait) meets w's TTFT target

Each prefill shape belongs to the group g = (w, D): compose's (balance) row makes the prompts
prefilled in g equal the requests D's replicas decode, so every decode replica's TTFT is the one its
prefill shapes were sized with. Sizing a prefill shape per decode partner, rather than for the worst
partner of the region, keeps the estimate exact; the price is P x D prefill shapes per workload and
region, which is why phase shapes are offered only where the spec asks for them.

KV moves only inside a region (the spec's intra-region link: latency and bandwidth between nodes);
a phase shape's model must fit one node (PP 1): a pipeline's stages would each move their own
layers' KV, which vLLM's NixlConnector does not pair across unequal layer splits.
"""

from __future__ import annotations

from hetcompile.ir.problem import Problem, Shape, ShapeEstimate
from hetcompile.perf.disagg import decode_capacity, decode_first_token, kv_transfer_s, prefill_capacity
from hetcompile.perf.stepmodel import ReplicaModel


def _estimate(base: ShapeEstimate, w: str, rps: float, full: float, conc: float, binding: str, ttft: float | None,
              tpot: float | None) -> ShapeEstimate:
    """The base shape's estimate (its step model and tables) serving workload w alone."""
    return base.model_copy(update={
        "throughput_rps": tuple((x, rps if x == w else 0.0) for x, _ in base.throughput_rps),
        "full_rps": tuple((x, full if x == w else 0.0) for x, _ in (base.full_rps or base.throughput_rps)),
        "concurrency": ((w, conc),), "binding": ((w, binding),),
        "ttft_s": ((w, ttft),) if ttft is not None else (), "tpot_s": ((w, tpot),) if tpot is not None else ()})


def phase_shapes(ir: Problem, shapes: tuple[Shape, ...]) -> tuple[Shape, ...]:
    """Decode and prefill shapes (module docstring) for every workload, from the aggregated one-node
    shapes `shapes` (their step models); sorted by id. Shapes that serve nothing are left out."""
    kv = {e.model: e.kv_bytes_per_token_layer * ir.model(e.model).arch.layers for e in ir.perf or ()}
    base: dict[str, tuple[Shape, ReplicaModel]] = {}  # one per (model, offer, TP): its SLO copies share the step model
    for s in shapes:
        if s.pp == 1 and s.role is None and s.estimate.step_model is not None:
            base.setdefault(s.id.split("|slo:")[0], (s, s.estimate.step_model))
    out: list[Shape] = []
    for w in ir.workloads:
        mine = [sr for _, sr in sorted(base.items()) if sr[0].model == w.model]
        decodes = []
        for s, rm in mine:
            d = decode_capacity(rm, w.input_tokens, w.output_tokens, w.tpot_slo, w.slo_quantile,
                                ir.max_utilization)
            if d.requests_per_s <= 0:
                continue
            sid = s.id.split("|slo:")[0]
            est = _estimate(s.estimate, w.name, d.requests_per_s, d.full_rps, d.max_num_seqs, d.binding, None, d.tpot_s)
            decodes.append((s, rm, d, Shape(id=f"{sid}|decode:{w.name}", model=s.model, offer=s.offer, gpu=s.gpu,
                                        region=s.region, tp=s.tp, pp=1, partition=s.partition, price_per_s=s.price_per_s,
                                        estimate=est, role="decode", group=f"{w.name}@{sid}", max_num_seqs=d.max_num_seqs)))
        for s_d, rm_d, d, shape_d in decodes:
            lat, bw = _link(ir, s_d.region)
            transfer = kv_transfer_s(w.input_tokens, kv[w.model], lat, bw)
            after = transfer + decode_first_token(rm_d, d) + d.slot_wait_s
            budget = None if w.ttft_slo is None else w.ttft_slo - after
            pairs = []
            for s, rm in (x for x in mine if x[0].region == s_d.region):
                p = prefill_capacity(rm, w.input_tokens, budget, w.slo_quantile, ir.max_utilization)
                if p.requests_per_s <= 0:
                    continue
                sid = s.id.split("|slo:")[0]
                est = _estimate(s.estimate, w.name, p.requests_per_s, p.full_rps, 1.0, p.binding, p.ttft_s + after, None)
                pairs.append(Shape(id=f"{sid}|prefill:{w.name}|for:{shape_d.id.split('|decode:')[0]}", model=s.model,
                                   offer=s.offer, gpu=s.gpu, region=s.region, tp=s.tp, pp=1, partition=s.partition,
                                   price_per_s=s.price_per_s, estimate=est, role="prefill", group=shape_d.group))
            if pairs:  # a decode shape no prefill shape can feed within the TTFT target is no candidate
                out += [shape_d, *pairs]
    return tuple(sorted(out, key=lambda s: s.id))


def _link(ir: Problem, region: str) -> tuple[float, float]:
    """(latency s, bytes/s) between two nodes of one region: the spec's intra-region link."""
    link = next(l for l in ir.links if l.a == region and l.b == region)
    return link.latency, link.bandwidth
