"""place (mixed): Hetis primary-worker selection over the placed chains (seed 001 §4.1).

Helix placement has already grouped the model's pool into deployable instances (chains, one TP
each: vLLM 0.33). For each chain, the GPU types of its stage units are Hetis's unified stages and
placement/hetis.py's criterion (Δ) decides which units are primary workers. A unit that adds less
than delta to its chain is not put in it:
    moved       to another chain of the model with the same TP where it adds >= delta (the most)
    not-rented  a rented unit no chain takes is dropped: its $/h is saved
    idle        an owned unit no chain takes stays off
The kept units are re-split by placement's depth-aware split (placement/chains/splits.py): vLLM's one TP
per replica stands in for Hetis's per-stage TP x PP search.

"Never serves less": a chain's selection is applied only if the model's served multiple of the
demand mix (theta from passes/rates.py over the same depth-aware estimates place uses; capped at
compose's scale for min-cost, which serves the demand and no more) does not drop. Chains are tried
in order, each on top of those already accepted; a rejected one keeps its GPUs (`kept-in`).

Notation as in placement/hetis.py; the dense cost of one unit of GPU g at TP t is the step model's
roofline without attention, LayerCost(g, t).time(n, 0, 0), at n = PREFILL_CHUNK tokens (a saturated
engine step carries the chunked-prefill budget). For the GPUs a replica leaves out (not moved),
perf/attention.py estimates what they would add as Attention workers: analysis, never deployed.

Paper: "Hetis: Serving LLMs in Heterogeneous GPU Clusters with Fine-grained and Dynamic Parallelism" (seed 001), §4.1 (primary-worker selection, the delta criterion) and eq. 4 (attention offload cost).
"""

from __future__ import annotations

from hetcompile.plan import human
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hetcompile.ir.problem import Node, Problem, Workload
from hetcompile.plan.doc import AttentionWorkers, LeftOutGpus, PrimaryWorkers
from hetcompile.passes.place_problem import chain_estimate
from hetcompile.passes.rates import max_scale
from hetcompile.opt.solve import SolverOptions
from hetcompile.perf import analytic, attention
from hetcompile.placement import hetis
from hetcompile.placement.chains.place import chain_infos
from hetcompile.placement.chains.search import ChainSearch, order_slots
from hetcompile.placement.evaluate import unit_profile
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.result import ChainInfo, StageUnit
from hetcompile.placement.chains.splits import Slot
from hetcompile.placement.verify import verify_result


@dataclass
class _LeftOut:
    gpu: str
    units: list[StageUnit]
    adds: float  # C(kept) / C(kept + these) - 1: what they add to the kept set (< delta by (Δ))
    fate: str = "not-rented"
    to_chain: str | None = None
    saved_per_s: float = 0.0


@dataclass
class _Record:
    chain: str
    kept: dict[str, int]
    cost: float
    full_cost: float
    applied: bool
    left_out: list[_LeftOut] = field(default_factory=list)
    attention: AttentionWorkers | None = None
    served: tuple[float, float] = (0.0, 0.0)  # theta without, with the selection
    unsplittable: bool = False  # placement's split found no way to hold the model on the kept units


def unit_cost(ir: Problem, model: str, gpu: str, tp: int) -> float:
    """c_t: dense seconds per layer for one saturated engine step on one unit (module docstring)."""
    m = ir.model(model)
    return analytic.layer_cost(m.arch, m.dtype_bytes, ir.gpu(gpu), tp).time(analytic.PREFILL_CHUNK, 0.0, 0.0)


def unit_types(ir: Problem, pp: PlacementProblem, units: Sequence[StageUnit]) -> tuple[tuple[hetis.UnitType, ...], dict[str, list[StageUnit]]]:
    """A chain's units as Hetis's per-type groups (sorted by GPU name) and the units of each type."""
    by: dict[str, list[StageUnit]] = {}
    for u in units:
        by.setdefault(pp.groups[u.gi].gpu, []).append(u)
    types = tuple(
        hetis.UnitType(
            name=g, count=len(us), cost=unit_cost(ir, pp.model.name, g, us[0].tp),
            max_layers=min(pp.groups[u.gi].profile(u.tp).max_layers for u in us), power=ir.gpu(g).flops * us[0].tp,
        )
        for g, us in sorted(by.items())
    )
    return types, by


def _slot(u: StageUnit) -> Slot:
    native = u.unit == u.node
    return Slot(node=u.node, gi=u.gi, tp=u.tp, slice=0 if native else u.gpus[0] // u.tp, native=native)


def _rebuild(pp: PlacementProblem, search: ChainSearch, cid: str, units: Sequence[StageUnit]) -> ChainInfo | None:
    """A chain on `units` with placement's best split, keeping the id; None when L does not fit."""
    infos, _ = chain_infos(pp, [order_slots(pp, [_slot(u) for u in units])], search)
    return replace(infos[0], id=cid) if infos else None


def _price(pool: dict[str, Node], u: StageUnit) -> float:
    n = pool[u.node]
    return n.price_per_s * u.tp / n.gpus


def _dense(ir: Problem, pp: PlacementProblem, units: Sequence[StageUnit]) -> float:
    types, _ = unit_types(ir, pp, units)
    return hetis.dense_cost(types, [t.count for t in types], pp.model.num_layers)


def select_chains(ir: Problem, pp: PlacementProblem, chains: list[ChainInfo], ws: Sequence[Workload], pool: dict[str, Node],
                  opts: SolverOptions) -> tuple[list[ChainInfo], list[_Record]]:
    """The module docstring's selection, guard and moves; returns the chains to deploy and a record
    per chain that has units (Δ) would leave out."""
    delta, L = ir.placement.delta, pp.model.num_layers
    if delta <= 0 or not chains:
        return chains, []
    demand = {w.name: w.demand for w in ws}
    assert ir.composition is not None  # place requires it
    cap = ir.composition.scale if ir.objective == "min-cost" else math.inf

    def served(cs: list[ChainInfo]) -> float:
        ests = {c.id: dict(chain_estimate(ir, pp, c.stages).throughput_rps) for c in cs}
        return min(cap, max_scale(ests, demand, opts, name="place-hetis")[0])

    search = ChainSearch(pp, ir.placement.objective)
    current = list(chains)
    base: float | None = None  # theta of `current`, computed when a first chain has units to leave out
    records: list[_Record] = []
    for cid in [c.id for c in chains]:
        i = next(k for k, c in enumerate(current) if c.id == cid)
        chain = current[i]
        types, by = unit_types(ir, pp, chain.stages)
        sel = hetis.select(types, L, delta)
        removed = sel.removed()
        if not removed:
            continue
        adds = sel.raise_by_type()
        out: list[_LeftOut] = []
        for g, k in sorted(removed.items()):
            # rented units go first (their $/h is saved), then the last in chain order
            order = sorted(by[g], key=lambda u: (-_price(pool, u), -chain.stages.index(u)))
            out.append(_LeftOut(g, order[:k], adds[g]))
        gone = {u.unit for lo in out for u in lo.units}
        kept_chain = _rebuild(pp, search, cid, [u for u in chain.stages if u.unit not in gone])
        rec = _Record(cid, dict(zip([t.name for t in types], sel.kept)), sel.cost, sel.full_cost, False, out)
        records.append(rec)
        if kept_chain is None:
            rec.unsplittable = True
            for lo in out:
                lo.fate = "kept-in"
            continue
        cand = current[:i] + [kept_chain] + current[i + 1:]
        dest: dict[str, str] = {}  # left-out unit -> the chain it moves to
        for lo in out:  # each left-out unit: to the chain of the same TP where it adds the most, if >= delta
            for u in lo.units:
                best = None
                for j, c in enumerate(cand):
                    if c.id == cid or c.tp != u.tp:
                        continue
                    before, after = _dense(ir, pp, c.stages), _dense(ir, pp, [*c.stages, u])
                    gain = before / after - 1.0 if after > 0 else 0.0
                    if gain >= delta and (best is None or gain > best[0]):
                        best = (gain, j)
                if best is not None:
                    grown = _rebuild(pp, search, cand[best[1]].id, [*cand[best[1]].stages, u])
                    if grown is not None:
                        cand[best[1]] = grown
                        dest[u.unit] = grown.id
        out = _by_destination(sel, out, dest, L)
        rec.left_out = out
        if base is None:
            base = served(current)
        theta = served(cand)
        rec.served = (base, theta)
        if theta >= base * (1 - 1e-9):
            current, base, rec.applied = cand, theta, True
            for lo in out:
                rented = sum(_price(pool, u) for u in lo.units)
                lo.fate = "moved" if lo.to_chain else ("not-rented" if rented > 0 else "idle")
                lo.saved_per_s = 0.0 if lo.to_chain else rented
            rec.attention = _attention(ir, pp, kept_chain, [u for lo in out if not lo.to_chain for u in lo.units], ws)
        else:
            for lo in out:
                lo.fate, lo.to_chain = "kept-in", None
    return current, records


def _by_destination(sel: hetis.Selection, out: list[_LeftOut], dest: dict[str, str], layers: int) -> list[_LeftOut]:
    """Left-out units grouped by type and destination (None: no other chain takes them), each group
    with what it alone would add to the kept set: C(kept) / C(kept + group) - 1."""
    names = [t.name for t in sel.types]
    groups = []
    for lo in out:
        for to in sorted({dest.get(u.unit) for u in lo.units}, key=lambda x: (x is not None, x or "")):
            units = [u for u in lo.units if dest.get(u.unit) == to]
            back = list(sel.kept)
            back[names.index(lo.gpu)] += len(units)
            with_them = hetis.dense_cost(sel.types, back, layers)
            groups.append(_LeftOut(lo.gpu, units, sel.cost / with_them - 1.0 if with_them > 0 else math.inf, to_chain=to))
    return groups


def _attention(ir: Problem, pp: PlacementProblem, chain: ChainInfo, workers: list[StageUnit],
               ws: Sequence[Workload]) -> AttentionWorkers | None:
    """perf/attention.py's estimate for the replica `chain` with `workers` as Attention workers."""
    if not workers:
        return None
    m = ir.model(pp.model.name)
    st = chain.stages
    stages = [(ir.gpu(pp.groups[u.gi].gpu), u.tp, u.layers, unit_profile(pp, u).kv_token_layers[u.layers - 1] / u.layers)
              for u in st]
    links = [pp.link(a.node, b.node) for a, b in zip(st, st[1:]) if a.node != b.node]
    rm = analytic.replica_model(m.arch, m.dtype_bytes, stages, max((lk.latency for lk in links), default=0.0),
                                min((lk.bandwidth for lk in links), default=1e12), ir.engine.max_num_seqs)
    gpus: dict[str, int] = {}
    for u in workers:
        g = pp.groups[u.gi].gpu
        gpus[g] = gpus.get(g, 0) + u.tp
    link = pp.link(workers[0].node, st[0].node) if workers[0].node != st[0].node else pp.link(st[0].node, st[-1].node)
    i, o = pp.model.input_tokens, pp.model.output_tokens
    est = attention.offload(rm, m.arch, m.dtype_bytes, [(ir.gpu(g), n) for g, n in sorted(gpus.items())],
                            ir.engine.gpu_memory_utilization, link.latency, link.bandwidth, i, o)
    return AttentionWorkers(
        gpus=est.gpus, kv_tokens=est.kv_tokens, kv_tokens_with=est.kv_tokens_with, decode_tokens_per_s=est.decode_tokens_per_s,
        decode_tokens_per_s_with=est.decode_tokens_per_s_with, offload_share=est.rho,
        transfer_s_per_layer=est.transfer_s_per_layer, link_latency_s=link.latency, link_bandwidth=link.bandwidth,
    )


def _gpus_text(kept: dict[str, int], tp: int) -> str:
    return " + ".join(f"{n * tp}x {g}" for g, n in sorted(kept.items()) if n) or "none"


def to_ir(model: str, delta: float, records: list[_Record], chains: dict[str, ChainInfo], rid_of: dict[str, str],
          slice_id) -> tuple[PrimaryWorkers, ...]:
    """The records as plan values, with replica ids and the sentences plan.md and explain print."""
    out = []
    for r in records:
        rid = rid_of.get(r.chain, r.chain)
        tp = r.left_out[0].units[0].tp if r.left_out else 1
        lines = []
        for lo in r.left_out:
            n = sum(u.tp for u in lo.units)
            nodes = ", ".join(sorted(slice_id(u.unit) for u in lo.units))
            what = f"{n}x {lo.gpu} ({nodes}) would add {100 * lo.adds:.1f}% < {100 * delta:g}% to {rid}'s dense speed"
            if lo.fate == "moved":
                assert lo.to_chain is not None  # a moved group names its chain
                lines.append(f"{what}: moved to {rid_of.get(lo.to_chain, lo.to_chain)}, where "
                             f"{'it adds' if len(lo.units) == 1 else 'they add'} at least {100 * delta:g}%")
            elif lo.fate == "not-rented":
                lines.append(f"{what}: left out and not rented (saves ${lo.saved_per_s * 3600:.2f}/h)")
            elif lo.fate == "idle":
                lines.append(f"{what}: left out (owned, idle)")
            elif r.unsplittable:
                lines.append(f"{what}, but no layer split of the others holds the model by placement's profiles: kept in")
            else:
                lines.append(f"{what}, but the plan without them serves less ({human.number(r.served[1])}x vs "
                             f"{human.number(r.served[0])}x the demand): kept in")
        a = r.attention
        if a is not None:
            head = (f"as Hetis Attention workers (NOT deployable on vLLM 0.33: it cannot offload attention heads), "
                    f"the {a.gpus} left-out GPU(s) would hold {a.kv_tokens_with - a.kv_tokens:+,.0f} KV tokens")
            if a.offload_share > 0:
                lines.append(f"{head} ({a.kv_tokens:,.0f} -> {a.kv_tokens_with:,.0f}) and take decode "
                             f"{human.number(a.decode_tokens_per_s)} -> {human.number(a.decode_tokens_per_s_with)} tokens/s, offloading "
                             f"{100 * a.offload_share:.0f}% of the heads ({1e3 * a.transfer_s_per_layer:.3g} ms transfer "
                             f"per layer per step, eq. 4)")
            else:
                lines.append(f"as Hetis Attention workers (NOT deployable on vLLM 0.33) they would not pay: over this "
                             f"link ({1e3 * a.link_latency_s:.3g} ms, {a.link_bandwidth / 1e9:.3g} GB/s) the per-layer "
                             f"transfer costs more than their KV and bandwidth give; decode stays "
                             f"{human.number(a.decode_tokens_per_s)} tokens/s")
        kept = r.kept if r.applied else {**r.kept, **{lo.gpu: r.kept.get(lo.gpu, 0) + len(lo.units) for lo in r.left_out}}
        out.append(PrimaryWorkers(
            model=model, replica=rid, delta=delta, kept=tuple((g, n * tp) for g, n in sorted(kept.items()) if n),
            dense_cost_s=r.cost, full_dense_cost_s=r.full_cost, applied=r.applied,
            left_out=tuple(LeftOutGpus(gpu=lo.gpu, gpus=sum(u.tp for u in lo.units), nodes=tuple(sorted(slice_id(u.unit) for u in lo.units)),
                                       adds=lo.adds, fate=lo.fate,
                                       to_replica=rid_of.get(lo.to_chain, lo.to_chain) if lo.to_chain else None,
                                       saved_per_s=lo.saved_per_s)
                           for lo in r.left_out),
            attention=r.attention,
            text=(f"{rid}: primary workers {_gpus_text(kept, tp)}; without the others its dense cost (max stage, "
                  f"GPUs of a type as one stage) is {100 * (r.cost / r.full_cost - 1):.1f}% higher, < delta {100 * delta:g}%", *lines),
        ))
    return tuple(out)


def result_with(pp: PlacementProblem, res, chains: list[ChainInfo]):
    """The placement result on the selected chains: units, depth-aware capacity and Helix flow
    recomputed, and re-verified with networkx like every placement."""
    from hetcompile.placement.evaluate import edge_flows, helix_flow

    units = tuple(u for c in chains for u in c.stages)
    val, flow = helix_flow(pp, units, [[u.unit for u in c.stages] for c in chains]) if units else (0.0, {})
    da = sum(c.capacity for c in chains)
    value = da if res.objective == "depth-aware" else val
    gap = (res.bound - value) / value if res.bound is not None and value > 0 else None
    out = replace(res, chains=tuple(chains), units=units, helix_flow=val, edge_flows=edge_flows(flow), depth_aware_capacity=da,
                  gap=gap)
    verify_result(out, pp)
    return out
