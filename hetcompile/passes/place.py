"""place: give every replica concrete nodes and contiguous layer ranges.

Input: compose's y_c (replicas per shape) and each shape's balanced partition. Output: the node
set (`nodes`) and `replicas`, each an ordered chain of stages {node, tp, [start, end)}. Node ids
are `<region>-<gpu>-<k>` numbered per offer in replica order, so the same spec names the same
nodes.

`placement.pipelines: single-type` (default): the shapes' partitions (balanced by free memory
per layer, seed 003 App. D) are the placement; nothing is searched.

`placement.pipelines: mixed`: per model, Helix max-flow placement (seed 000 §4.3-4.5, the
`hetcompile.placement` package) over a pool = the nodes compose chose for the model plus, when
the spec serves one model, every owned node compose left idle (they cost nothing). `chains`
mode makes deployable replicas (one TP per chain, KV = the minimum over stages, multi-GPU nodes
may be cut into TP slices); with `compare_shared`, `shared` mode (Helix's per-request pipelines,
never deployed) is solved too so plan.md can say what the engine constraint costs. The placed
chains replace compose's replicas only if they serve a larger multiple theta of the demand mix
(passes/rates.py) both by the same model (perf/capacity.py's full mode on each replica's step model;
the search itself ranks chains by the formula's fast mode) and against what compose's replicas
serve by their own estimates (the single-type plan's figure), so mixed never serves less than
single-type; rented nodes no chain uses are dropped, so it never costs more. Every placement's
flow is re-checked with networkx (`PlacementResult.verify`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import replace

from hetcompile import placement
from hetcompile.backends.canon import natural_key
from hetcompile.ir.errors import PassError
from hetcompile.ir.problem import (
    Binding,
    ChainSummary,
    Composition,
    ModelPlacement,
    Node,
    PassReport,
    Problem,
    Replica,
    Stage,
)
from hetcompile.passes.base import Pass, PassContext
from hetcompile.passes import place_hetis
from hetcompile.passes.place_problem import chain_estimate, placement_problem
from hetcompile.passes.rates import max_scale
from hetcompile.passes.solve import SolverOptions
from hetcompile.placement.chain_model import full_tokens_per_s
from hetcompile.placement.evaluate import chain_eval
from hetcompile.placement.result import PlacementResult, StageUnit


def node_prefix(region: str, gpu: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"{region}-{gpu}".lower()).strip("-")


def materialize(ir: Problem) -> tuple[tuple[Node, ...], tuple[Replica, ...]]:
    """compose's y_c copies of each shape as replicas on fresh nodes. When replanning
    (`ir.previous`), a copy of a shape that already runs keeps that replica's id and node ids,
    so explain's diff sees it untouched; new replicas and nodes take the lowest free ids."""
    comp = ir.composition
    counts = dict(comp.counts)
    running: dict[str, list] = {}
    for pr in ir.previous.replicas if ir.previous else ():
        running.setdefault(pr.shape, []).append(pr)
    reuse = {sid: running.get(sid, [])[: counts[sid]] for sid in counts}
    # ids are never reused: a new replica must not take the id (and so the cluster name) of one
    # the previous plan ran or had retired, whatever its shape
    taken_ids = {pr.id for pr in ir.previous.replicas} if ir.previous else set()
    next_rid = [ir.previous.next_replica if ir.previous else 0]
    taken_nodes = {n for pr in ir.previous.replicas for n in pr.nodes} if ir.previous else set()
    next_node: dict[str, int] = {}
    # owned capacity is counted in GPUs, as compose counts it: slices of an owned multi-GPU node
    # are all owned, and a node is billed for the GPUs beyond what is owned
    owned_left = {o.id: o.owned_nodes * o.gpus_per_node for o in ir.offers}

    def fresh_node(prefix: str) -> str:
        idx = next_node.get(prefix, 0)
        while f"{prefix}-{idx}" in taken_nodes:
            idx += 1
        next_node[prefix] = idx + 1
        return f"{prefix}-{idx}"

    def fresh_rid() -> str:
        while f"r{next_rid[0]}" in taken_ids:
            next_rid[0] += 1
        next_rid[0] += 1
        return f"r{next_rid[0] - 1}"

    nodes: list[Node] = []
    replicas: list[Replica] = []
    for sid in sorted(counts, key=lambda s: (ir.shape(s).model, ir.shape(s).region, ir.shape(s).gpu, s)):
        shape = ir.shape(sid)
        offer = ir.offer(shape.offer)
        prefix = node_prefix(offer.region, offer.gpu)
        for copy in range(counts[sid]):
            prev = reuse[sid][copy] if copy < len(reuse[sid]) else None
            stages = []
            start = 0
            for j, k in enumerate(shape.partition):
                # a node of `tp` GPUs; owned GPUs are used first (they cost nothing)
                free = min(shape.tp, owned_left[offer.id])
                owned_left[offer.id] -= free
                node = Node(
                    id=prev.nodes[j] if prev else fresh_node(prefix), offer=offer.id, region=offer.region,
                    cloud=offer.cloud, gpu=offer.gpu, gpus=shape.tp,
                    price_per_s=(shape.tp - free) * offer.price_per_gpu_s, owned=free == shape.tp, owned_gpus=free,
                )
                nodes.append(node)
                stages.append(Stage(node=node.id, gpu=offer.gpu, region=offer.region, tp=shape.tp, layer_start=start, layer_end=start + k))
                start += k
            replicas.append(
                Replica(id=prev.id if prev else fresh_rid(), model=shape.model, shape=sid, stages=tuple(stages),
                        dtype="bfloat16", estimate=shape.estimate)
            )
    return tuple(nodes), tuple(replicas)


def idle_owned(ir: Problem, nodes: Sequence[Node]) -> list[Node]:
    """Owned GPUs compose did not use, as whole nodes plus one node of the GPUs left over from a
    partly used owned node (ids continue each offer's numbering)."""
    used: dict[str, int] = {}
    last: dict[str, int] = {}
    for n in nodes:
        used[n.offer] = used.get(n.offer, 0) + n.owned_gpus
        prefix, _, k = n.id.rpartition("-")
        last[prefix] = max(last.get(prefix, -1), int(k))
    out = []
    for o in sorted(ir.offers, key=lambda o: o.id):
        prefix = node_prefix(o.region, o.gpu)
        idle = o.owned_nodes * o.gpus_per_node - used.get(o.id, 0)
        sizes = [o.gpus_per_node] * (idle // o.gpus_per_node) + ([idle % o.gpus_per_node] if idle % o.gpus_per_node else [])
        for g in sizes:
            last[prefix] = last.get(prefix, -1) + 1
            out.append(Node(id=f"{prefix}-{last[prefix]}", offer=o.id, region=o.region, cloud=o.cloud, gpu=o.gpu,
                            gpus=g, price_per_s=0.0, owned=True, owned_gpus=g))
    return out


def compose_units(pp, replicas: Sequence[Replica]) -> dict[str, list[StageUnit]]:
    """compose's replicas as placement stage units, to evaluate them with the same model. A replica
    whose stage holds more layers than the placement's profile allows (measured layer profiles
    may be stricter than the analytic memory model) is left out: by those numbers it does not run."""
    idx = pp.node_index()
    out = {}
    for r in replicas:
        units = []
        for s in r.stages:
            if s.node not in idx or s.layer_end - s.layer_start > pp.groups[idx[s.node][0]].profile(s.tp).max_layers:
                break
            units.append(StageUnit(s.node, s.node, idx[s.node][0], s.tp, tuple(range(s.tp)), s.layer_start, s.layer_end))
        else:
            out[r.id] = units
    return out


def measured_misfit(ir: Problem, r: Replica) -> bool:
    """A stage of `r` holds more layers than the spec's measured layer profile for its (model, GPU,
    TP) allows. Only a measured profile can overrule compose: where placement falls back on the
    analytic model, its memory rule is a stricter copy of the one compose already applied (it
    charges embedding and head to every stage), and a replica compose built by the fuller rule is
    one the single-type plan deploys as it is."""
    limits = {(lp.model, lp.gpu, lp.tp): len(lp.throughput) for lp in ir.placement.layer_profiles}
    return any(s.layer_end - s.layer_start > limits.get((r.model, s.gpu, s.tp), s.layer_end) for s in r.stages)


def slice_id(unit: str) -> str:
    """`<node>#<j>` (a TP slice of a split node) -> `<node>-s<j>` (a DNS-safe node id)."""
    node, sep, j = unit.partition("#")
    return f"{node}-s{j}" if sep else node


def _unit_ref(term: str) -> str:
    """'stage:<unit>' / 'kv:<unit>' with the unit renamed to its plan node id."""
    kind, sep, unit = term.partition(":")
    return f"{kind}:{slice_id(unit)}" if sep else term


def chain_nodes(pool: dict[str, Node], res: PlacementResult) -> dict[str, Node]:
    """The plan's nodes for the placed chains: whole nodes, or one node per TP slice of a split node."""
    out = {}
    for c in res.chains:
        for u in c.stages:
            n = pool[u.node]
            if u.unit == u.node:
                out[n.id] = n
            else:  # a slice is its own Kubernetes pod / machine of `tp` GPUs
                share = u.tp / n.gpus
                out[slice_id(u.unit)] = n.model_copy(update={"id": slice_id(u.unit), "gpus": u.tp, "price_per_s": n.price_per_s * share,
                                                                 "owned_gpus": round(n.owned_gpus * share)})
    return out


def place_mixed(ir: Problem, nodes: tuple[Node, ...], replicas: tuple[Replica, ...], ctx: PassContext) -> Problem:
    cfg = ir.placement
    opts = SolverOptions(time_limit_s=ir.solver.time_limit_s, mip_gap=ir.solver.mip_gap, threads=ir.solver.threads,
                         seed=ir.solver.seed, node_limit=ir.solver.node_limit)
    # the spec's time limit is one wall-clock cap for all of the pass's placement solves: each
    # takes an equal share of what is left (work budgets, not this cap, should end them)
    t0 = time.perf_counter()
    solves_left = [len(ir.models) * (2 if cfg.compare_shared else 1)]

    def capped_opts() -> SolverOptions:
        left = ir.solver.time_limit_s - (time.perf_counter() - t0)
        share = max(0.5, left / max(1, solves_left[0]))
        solves_left[0] -= 1
        return replace(opts, time_limit_s=share)

    machine_dependent = False
    # replanning: ids the previous plan ran or retired are never reused (next_replica and up are free)
    taken = {pr.id for pr in ir.previous.replicas} if ir.previous else set()
    next_rid = [ir.previous.next_replica if ir.previous else 0]

    def fresh_rid(used: set[str]) -> str:
        while f"r{next_rid[0]}" in taken or f"r{next_rid[0]}" in used:
            next_rid[0] += 1
        next_rid[0] += 1
        return f"r{next_rid[0] - 1}"
    node_by_id = {n.id: n for n in nodes}
    single_model = len({w.model for w in ir.workloads}) == 1
    spare = idle_owned(ir, nodes) if single_model else []
    final_nodes: dict[str, Node] = {}
    out: list[Replica] = []  # replica ids r0, r1, ... in model order
    lp: dict[str, tuple[float, dict[tuple[str, str], float]]] = {}  # model -> theta, x_{r,w} (rates.py)
    summaries, notes, primary = [], [], []
    status, objective, bound, gap = "ok", None, None, None
    for m in ir.models:
        ws = [w for w in ir.workloads if w.model == m.name]
        mine = [r for r in replicas if r.model == m.name]
        pool = [node_by_id[s.node] for r in mine for s in r.stages] + spare
        pp = placement_problem(ir, m.name, pool)
        res = placement.place(pp, mode="chains", objective=cfg.objective, options=capped_opts()) if pp.groups else None
        shared = None
        if res is not None:
            res.verify(pp)  # raises PassError when networkx's max flow disagrees with the reported flow
            machine_dependent |= res.machine_dependent
            if cfg.compare_shared:
                shared = placement.place(pp, mode="shared", objective=cfg.objective, options=capped_opts(),
                                         partial_inference=cfg.partial_inference)
                shared.verify(pp)
                machine_dependent |= shared.machine_dependent
        else:
            solves_left[0] -= 2 if cfg.compare_shared else 1
        demand = {w.name: w.demand for w in ws}
        units_c = compose_units(pp, mine)
        ests_c = {rid: chain_estimate(ir, pp, u) for rid, u in units_c.items()}
        theta_c, _ = max_scale({k: dict(e.throughput_rps) for k, e in ests_c.items()}, demand, opts, name="place-rates")
        da_c = sum(chain_eval(pp, u).capacity for u in units_c.values())
        full_c = sum(full_tokens_per_s(pp, u) for u in units_c.values())
        chains = list(res.chains) if res is not None else []
        # Hetis primary-worker selection (seed 001 §4.1): units adding < delta leave their chain
        chains, hetis_recs = place_hetis.select_chains(ir, pp, chains, ws, {n.id: n for n in pool}, opts)
        if any(r.applied for r in hetis_recs):
            res = place_hetis.result_with(pp, res, chains)
        if ir.previous is None:
            rid_of = {c.id: f"r{len(out) + i}" for i, c in enumerate(chains)}
        else:  # a chain on exactly the nodes of a running replica keeps its id; any other gets a fresh one
            in_use = {r.id for r in out} | {r.id for r in replicas}
            running = {(pr.model, tuple(pr.nodes)): pr.id for pr in ir.previous.replicas}
            rid_of = {}
            for c in chains:
                same = running.get((m.name, tuple(slice_id(u.unit) for u in c.stages)))
                rid_of[c.id] = same if same is not None and same not in in_use else fresh_rid(in_use)
                in_use.add(rid_of[c.id])
        ests_p = {rid_of[c.id]: chain_estimate(ir, pp, c.stages) for c in chains}
        full_p = {c.id: full_tokens_per_s(pp, c.stages) for c in chains}
        theta_p, x_p = max_scale({k: dict(e.throughput_rps) for k, e in ests_p.items()}, demand, opts, name="place-rates")
        # what the single-type plan serves with this model's replicas, by the estimates it reports
        # (compose's): every replica except those a measured layer profile rules out
        runnable = [r for r in mine if not measured_misfit(ir, r)]
        theta_s, x_s = max_scale({r.id: dict(r.estimate.throughput_rps) for r in runnable}, demand, opts, name="place-rates")
        # the chains replace compose's replicas only when they serve more by both measures: by the
        # model that judged them (full mode on the chains' step models, like for like: theta_c) and against the figure the
        # single-type plan reports (theta_s), so a mixed plan never serves less than the
        # single-type one for the same spec; ties keep compose's replicas
        kept = "placement" if theta_p > max(theta_c, theta_s) * (1 + 1e-6) else "compose"
        why = (f"theta {theta_p:.4g} with the chains vs {theta_c:.4g} (compose's replicas, same model) and "
               f"{theta_s:.4g} (compose's replicas by their own estimates, what single-type serves)")
        pool_by_id = {n.id: n for n in pool}
        if kept == "placement":
            final_nodes.update(chain_nodes(pool_by_id, res))
            for c in chains:
                stages = tuple(
                    Stage(node=slice_id(u.unit), gpu=pool_by_id[u.node].gpu, region=pool_by_id[u.node].region, tp=u.tp,
                          layer_start=u.start, layer_end=u.end)
                    for u in c.stages
                )
                gpus = "+".join(sorted({s.gpu for s in stages}))
                rid = rid_of[c.id]
                out.append(Replica(id=rid, model=m.name, shape=f"{m.name}|chain|{gpus}|tp{c.tp}|pp{c.depth}|{c.id}",
                                   stages=stages, dtype="bfloat16", estimate=ests_p[rid]))
            lp[m.name] = (theta_p, x_p)
            if any(r.applied for r in hetis_recs):  # a plan selection did not change says nothing new
                primary += place_hetis.to_ir(m.name, cfg.delta, hetis_recs, {c.id: c for c in chains}, rid_of, slice_id)
        else:
            # only replicas that run by the spec's measured layer profiles: keeping the others would
            # emit a stage that holds more layers than fit
            dropped = sorted({r.id for r in mine} - {r.id for r in runnable})
            if dropped:
                notes.append(f"{m.name}: compose's replicas {', '.join(dropped)} hold more layers on a stage than the "
                             "measured layer profiles allow; dropped")
            if ir.previous is None:
                kept_reps = [r.model_copy(update={"id": f"r{len(out) + i}"}) for i, r in enumerate(runnable)]
            else:  # materialize already gave them ids that honour the previous plan
                kept_reps = list(runnable)
            for r in kept_reps:
                final_nodes.update({s.node: node_by_id[s.node] for s in r.stages})
            out += kept_reps
            new_id = {r.id: k.id for r, k in zip(runnable, kept_reps)}
            lp[m.name] = (theta_s, {(new_id[r], w): v for (r, w), v in x_s.items()})
        if res is None:
            notes.append(f"{m.name}: no pool node holds a layer of it; kept compose's replicas")
            continue
        summaries.append(ModelPlacement(
            model=m.name, objective=cfg.objective, kept=kept, pool_nodes=len(pool), pool_gpus=sum(n.gpus for n in pool),
            status="optimal" if res.gap is not None and res.gap <= ir.solver.mip_gap else "feasible",
            helix_flow=res.helix_flow, depth_aware_capacity=res.depth_aware_capacity, bound=res.bound, gap=res.gap,
            capacity=sum(full_p.values()), compose_capacity=full_c,
            incumbent_source=res.incumbent_source,
            shared_helix_flow=shared.helix_flow if shared else None,
            shared_depth_aware_capacity=shared.depth_aware_capacity if shared else None,
            shared_bound=shared.bound if shared else None, shared_gap=shared.gap if shared else None,
            compose_depth_aware_capacity=da_c, scale_placement=theta_p, scale_compose=theta_c, scale_single_type=theta_s,
            chains=tuple(
                ChainSummary(replica=rid_of[c.id] if kept == "placement" else c.id, depth=c.depth, tp=c.tp,
                             concurrency=c.concurrency, concurrency_limit=_unit_ref(c.concurrency_limit),
                             micro_batch=c.micro_batch, capacity_tokens_per_s=full_p[c.id],
                             search_capacity_tokens_per_s=c.capacity, binding=_unit_ref(c.binding),
                             helix_flow=c.helix_flow, split_nodes=c.split_nodes)
                for c in chains
            ),
        ))
        notes.append(
            f"{m.name}: {len(chains)} chains over {len(pool)} pool nodes, {sum(full_p.values()):.1f} tokens/s "
            f"(search objective, fast mode: {res.depth_aware_capacity:.1f}; compose's replicas: {full_c:.1f}, fast "
            f"{da_c:.1f}), {why}: kept {kept}'s replicas"
        )
        objective, bound, gap = res.value, res.bound, res.gap
        if res.gap is None or res.gap > ir.solver.mip_gap:
            status = "feasible"
    if machine_dependent:
        notes.append(f"placement stopped at the wall-clock cap (solver.time_limit {ir.solver.time_limit_s:g} s for all "
                     "placement solves) before its work budgets: this plan may differ on a faster or slower machine")
    report = PassReport(name="place", status=status, time_s=0.0, objective=objective, bound=bound, gap=gap, notes=tuple(notes))
    return ir.model_copy(update={
        "nodes": tuple(sorted(final_nodes.values(), key=lambda n: (n.region, n.gpu, natural_key(n.id)))),
        "replicas": tuple(out), "composition": _composition(ir, out, lp), "placements": tuple(summaries),
        "primary_workers": tuple(primary),
        "reports": (*ir.reports, report),
    })


def _composition(ir: Problem, reps: list[Replica], lp: dict[str, tuple[float, dict[tuple[str, str], float]]]) -> Composition:
    """Composition of the final replicas from each model's rate LP (passes/rates.py): the plan's
    scale is the smallest theta over models, and every model's x is scaled down to it."""
    comp = ir.composition
    scale = min((theta for theta, _ in lp.values()), default=0.0)
    if ir.objective == "min-cost":
        scale = min(scale, comp.scale)  # serve the demand, not more
    # route.py reads rates per shape over all copies: sum the copies of compose's kept shapes
    shape_of = {r.id: r.shape for r in reps}
    per_shape: dict[tuple[str, str], float] = {}
    for _, (theta, x) in sorted(lp.items()):
        f = scale / theta if theta > 0 else 0.0
        for (rid, w), v in sorted(x.items()):
            per_shape[(shape_of[rid], w)] = per_shape.get((shape_of[rid], w), 0.0) + v * f
    rates = [(sh, w, v) for (sh, w), v in sorted(per_shape.items()) if v > 0]
    counts: dict[str, int] = {}
    for r in reps:
        counts[r.shape] = counts.get(r.shape, 0) + 1
    binding = (*comp.binding, Binding(kind="placement", used=scale, limit=None, unit="x demand",
                                      text=f"placement: {len(reps)} replicas serve {scale:.4g}x the demand mix (compose: {comp.scale:.4g}x)"))
    return comp.model_copy(update={"counts": tuple(sorted(counts.items())), "rates": tuple(rates), "scale": scale, "binding": binding})


class Place(Pass):
    name = "place"
    requires = ("composition",)
    provides = "replicas"

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        nodes, replicas = materialize(ir)
        if ir.placement.pipelines == "mixed":
            return place_mixed(ir, nodes, replicas, ctx)
        return ir.model_copy(update={"nodes": nodes, "replicas": replicas})

    def verify(self, ir: Problem) -> None:
        used: set[str] = set()
        for r in ir.replicas:
            L = ir.model(r.model).arch.layers
            pos = 0
            for s in r.stages:
                if s.layer_start != pos or s.layer_end <= s.layer_start:
                    raise PassError(f"place: replica {r.id} stages are not contiguous at layer {pos}")
                if s.node in used:
                    raise PassError(f"place: node {s.node} is used twice")
                used.add(s.node)
                pos = s.layer_end
            if pos != L:
                raise PassError(f"place: replica {r.id} covers {pos} of {L} layers")
