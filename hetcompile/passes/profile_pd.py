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

KV moves only inside a region (the spec's intra-region link: latency and bandwidth between nodes),
and only between GPUs whose default attention backend is the same (`attention_family`);
a phase shape's model must fit one node (PP 1): a pipeline's stages would each move their own
layers' KV, which vLLM's NixlConnector does not pair across unequal layer splits.
"""

from __future__ import annotations

from hetcompile.ir.problem import PerfEntry, Problem, Shape, ShapeEstimate
from hetcompile.ir.disagg import transfer_seconds
from hetcompile.perf.disagg import decode_capacity, decode_first_token, prefill_capacity
from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.perf.types import GpuType


def _estimate(base: ShapeEstimate, w: str, rps: float, full: float, conc: float, binding: str, ttft: float | None,
              tpot: float | None) -> ShapeEstimate:
    """The base shape's estimate (its step model and tables) serving workload w alone: w's numbers are
    the phase's, the other workloads keep theirs at zero load (every table lists every workload)."""
    def put(pairs: tuple, v) -> tuple:
        return tuple((x, v if x == w else y) for x, y in pairs) + (((w, v),) if w not in dict(pairs) else ())

    return base.model_copy(update={
        "throughput_rps": tuple((x, rps if x == w else 0.0) for x, _ in base.throughput_rps),
        "full_rps": tuple((x, full if x == w else 0.0) for x, _ in (base.full_rps or base.throughput_rps)),
        "concurrency": put(base.concurrency, conc), "binding": put(base.binding, binding),
        "ttft_s": put(base.ttft_s, ttft) if ttft is not None else tuple(p for p in base.ttft_s if p[0] != w),
        "tpot_s": put(base.tpot_s, tpot) if tpot is not None else tuple(p for p in base.tpot_s if p[0] != w)})


def group_workload(key: str) -> str:
    """The workload of a phase shape's group key `<workload>@<decode shape>` (phase_shapes)."""
    return key.split("@")[0]


def attention_family(gpu: GpuType) -> str:
    """The attention backend vLLM picks by default on the GPU, by compute capability (vLLM 0.32's
    platform defaults: FlashInfer from 10.0, FlashAttention from 8.0, another kernel below). The
    NixlConnector's handshake compares the backend's name, so a prefill and a decode replica pair only
    within one family (a B200 with an H100 would refuse every transfer). Unknown capability: its own name."""
    cc = gpu.compute_capability
    if cc is None:
        return f"unknown:{gpu.name}"
    major = float(cc)
    return "flashinfer" if major >= 10.0 else "flash-attn" if major >= 8.0 else "other"


def phase_shapes(ir: Problem, table: tuple[PerfEntry, ...], shapes: tuple[Shape, ...]) -> tuple[Shape, ...]:
    """Decode and prefill shapes (module docstring) for every workload with an SLO (what the split
    buys is separate control of TTFT and TPOT: a workload without targets has nothing to trade), from
    the aggregated one-node shapes `shapes` (their step models) and the memory table `table` (the KV
    bytes per token); sorted by id. Shapes that serve nothing are left out."""
    base: dict[str, tuple[Shape, ReplicaModel]] = {}  # one per (model, offer, TP): its SLO copies share the step model
    for s in shapes:
        if s.pp == 1 and s.role is None and s.estimate.step_model is not None:
            base.setdefault(s.id.split("|slo:")[0], (s, s.estimate.step_model))
    out: list[Shape] = []
    for w in (w for w in ir.workloads if w.ttft_slo is not None or w.tpot_slo is not None):
        mine = [(sid, s, rm) for sid, (s, rm) in sorted(base.items()) if s.model == w.model]
        decodes = []
        for sid, s, rm in mine:
            d = decode_capacity(rm, w.input_tokens, w.output_tokens, w.tpot_slo, w.slo_quantile,
                                ir.max_utilization)
            if d.requests_per_s <= 0:
                continue
            est = _estimate(s.estimate, w.name, d.requests_per_s, d.full_rps, d.max_num_seqs, d.binding, None, d.tpot_s)
            # the decode replica runs with --max-num-seqs C*: its step model (the simulator's) says so too
            est = est.model_copy(update={"step_model": rm.model_copy(update={"max_num_seqs": d.max_num_seqs})})
            decodes.append(((sid, s, rm), d, Shape(id=f"{sid}|decode:{w.name}", model=s.model, offer=s.offer, gpu=s.gpu,
                                        region=s.region, tp=s.tp, pp=1, partition=s.partition, price_per_s=s.price_per_s,
                                        estimate=est, role="decode", group=f"{w.name}@{sid}", max_num_seqs=d.max_num_seqs)))
        for (sid_d, s_d, rm_d), d, shape_d in decodes:
            transfer = transfer_seconds(ir, table, w.name, s_d.region)
            after = transfer + decode_first_token(rm_d, d) + d.slot_wait_s
            budget = None if w.ttft_slo is None else w.ttft_slo - after
            pairs = []
            for sid, s, rm in (x for x in mine if x[1].region == s_d.region
                               and attention_family(ir.gpu(x[1].gpu)) == attention_family(ir.gpu(s_d.gpu))):
                p = prefill_capacity(rm, w.input_tokens, budget, w.slo_quantile, ir.max_utilization)
                if p.requests_per_s <= 0:
                    continue
                est = _estimate(s.estimate, w.name, p.requests_per_s, p.full_rps, 1.0, p.binding, p.ttft_s + after, None)
                pairs.append(Shape(id=f"{sid}|prefill:{w.name}|for:{sid_d}", model=s.model,
                                   offer=s.offer, gpu=s.gpu, region=s.region, tp=s.tp, pp=1, partition=s.partition,
                                   price_per_s=s.price_per_s, estimate=est, role="prefill", group=shape_d.group))
            if pairs:  # a decode shape no prefill shape can feed within the TTFT target is no candidate
                out += [shape_d, *pairs]
    return tuple(sorted(out, key=lambda s: s.id))
