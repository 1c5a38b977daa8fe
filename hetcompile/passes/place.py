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

Paper: Mei et al., "Helix: Serving Large Language Models over Heterogeneous GPUs and Network via Max-Flow" (ASPLOS 2025; seed 000), §4.3-4.5 (max-flow graph, MILP placement Tables 1-2, pruning);
Jiang et al., "Demystifying Cost-Efficiency in LLM Serving over Heterogeneous GPUs" (seed 003), App. D (single-type partitions).
"""

from __future__ import annotations

from hetcompile.plan import human
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetcompile import placement
from hetcompile.plan.canon import natural_key
from hetcompile.errors import PassError
from hetcompile.ir.problem import Composition, Node, PassReport, Problem, Replica, Stage
from hetcompile.plan.doc import Binding, ChainSummary, ModelPlacement, PrimaryWorkers
from hetcompile.passes.base import Pass, PassContext
from hetcompile.passes import place_hetis
from hetcompile.passes.place_problem import chain_estimate, placement_problem
from hetcompile.passes.profile_pd import group_workload
from hetcompile.passes.rates import max_scale
from hetcompile.opt.solve import SolverOptions
from hetcompile.placement.chain_model import full_tokens_per_s
from hetcompile.placement.evaluate import chain_eval
from hetcompile.placement.result import PlacementResult, StageUnit
from hetcompile.placement.verify import verify_result


def node_prefix(region: str, gpu: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"{region}-{gpu}".lower()).strip("-")


def materialize(ir: Problem) -> tuple[tuple[Node, ...], tuple[Replica, ...]]:
    """compose's y_c copies of each shape as replicas on fresh nodes. When replanning
    (`ir.previous`), a copy of a shape that already runs keeps that replica's id and node ids,
    so explain's diff sees it untouched; new replicas and nodes take the lowest free ids."""
    comp = ir.composition
    assert comp is not None  # place requires it
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
    groups = group_ids(ir, [sid for sid, n in counts.items() if n > 0])
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
                        dtype="bfloat16", estimate=shape.estimate, role=shape.role,
                        group=groups.get(shape.group) if shape.role is not None and shape.group is not None else None,
                        max_num_seqs=shape.max_num_seqs)
            )
    return tuple(nodes), tuple(replicas)


def group_ids(ir: Problem, shapes: Sequence[str]) -> dict[str, str]:
    """The routing table's id of each disaggregated group the phase shapes `shapes` form:
    `<workload>-pd<k>`, k counting that workload's groups in the order of their keys (a group key is
    `<workload>@<decode shape>`, profile_pd.py)."""
    keys = sorted({g for sid in shapes if (g := ir.shape(sid).group) is not None and ir.shape(sid).role is not None})
    seen: Counter[str] = Counter()
    out: dict[str, str] = {}
    for key in keys:
        w = group_workload(key)
        out[key] = f"{w}-pd{seen[w]}"
        seen[w] += 1
    return out


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


def _unit_ref(term: str) -> tuple[str, str | None]:
    """'stage:<unit>' / 'kv:<unit>' -> (kind, the unit's plan node id); 'latency' -> ('latency', None)."""
    kind, sep, unit = term.partition(":")
    return (kind, slice_id(unit)) if sep else (term, None)


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


class _SolveBudget:
    """The spec's time limit is one wall-clock cap for all of the pass's placement solves: each
    takes an equal share of what is left (work budgets, not this cap, should end them)."""

    def __init__(self, ir: Problem, ctx_solver: SolverOptions):
        s = ir.solver  # the spec's settings, with the context's display callbacks (progress, status)
        self.opts = replace(ctx_solver, time_limit_s=s.time_limit_s, mip_gap=s.mip_gap, threads=s.threads, seed=s.seed,
                            node_limit=s.node_limit)
        self.limit_s, self.t0 = s.time_limit_s, time.perf_counter()
        self.left = len(ir.models) * (2 if ir.placement.compare_shared else 1)
        self.machine_dependent = False  # some solve stopped at its wall-clock share

    def next(self) -> SolverOptions:
        left = self.limit_s - (time.perf_counter() - self.t0)
        share = max(0.5, left / max(1, self.left))
        self.left -= 1
        return replace(self.opts, time_limit_s=share)


class _ReplicaIds:
    """Replica ids r0, r1, ... in model order. Replanning: a chain on exactly the nodes of a
    running replica keeps its id; ids the previous plan ran or retired are never reused."""

    def __init__(self, ir: Problem):
        prev = ir.previous
        self.replanning = prev is not None
        self.taken = {pr.id for pr in prev.replicas} if prev else set()
        self.next_free = prev.next_replica if prev else 0
        self.running = {(pr.model, tuple(pr.nodes)): pr.id for pr in prev.replicas} if prev else {}

    def fresh(self, used: set[str]) -> str:
        while f"r{self.next_free}" in self.taken or f"r{self.next_free}" in used:
            self.next_free += 1
        self.next_free += 1
        return f"r{self.next_free - 1}"

    def for_chains(self, model: str, chains: list, placed: list[Replica], compose_reps: Sequence[Replica]) -> dict[str, str]:
        """chain id -> replica id, were the chains kept (decided before the choice, so ids do not
        depend on it)."""
        if not self.replanning:
            return {c.id: f"r{len(placed) + i}" for i, c in enumerate(chains)}
        in_use = {r.id for r in placed} | {r.id for r in compose_reps}
        rid_of = {}
        for c in chains:
            same = self.running.get((model, tuple(slice_id(u.unit) for u in c.stages)))
            rid_of[c.id] = same if same is not None and same not in in_use else self.fresh(in_use)
            in_use.add(rid_of[c.id])
        return rid_of


@dataclass
class _Judged:
    """One model's placement and how it compares with compose's replicas (thetas: seed 003's
    scale by passes/rates.py; _c compose's replicas and _p the chains by the full mode of their
    step models, _s compose's replicas by their own estimates: what the single-type plan serves)."""

    pool: list[Node]
    pp: object
    res: PlacementResult | None
    shared: PlacementResult | None
    chains: list
    hetis_recs: list
    rid_of: dict[str, str]
    full_c: float
    da_c: float
    full_p: dict[str, float]
    ests_p: dict
    theta_c: float
    theta_p: float
    x_p: dict
    theta_s: float
    x_s: dict
    runnable: list[Replica]
    kept: str
    why: str


# Helix's shared pipelines are compared (compare_shared) on pools of at most this many nodes. The
# comparison only reports what deployable chains cost; its flow graphs have an edge per pair of
# units holding adjacent layers, so its heuristics, four max-flow decompositions and networkx
# re-check grow with the square of the pool, outside the search's work budget: on
# bench/data/scale1072.yaml's pools it took 256 of placement's 374 s (profiled). 200 keeps the
# comparison on every example and on bench/placement_time_limit.py's 192-node Helix cluster.
SHARED_MAX_NODES = 200


def place_model(ir: Problem, m, pool: list[Node], mine: list[Replica], budget: _SolveBudget, ids: _ReplicaIds,
                placed: list[Replica], replicas: Sequence[Replica]) -> _Judged:
    """Search one model's chains (and Helix's shared pipelines when compared), apply Hetis
    selection, and decide whose replicas to keep: the chains only when they serve more by both
    measures, the model that judged them (theta_c, like for like) and the figure the single-type
    plan reports (theta_s), so a mixed plan never serves less than the single-type one for the
    same spec; ties keep compose's replicas."""
    cfg, opts = ir.placement, budget.opts
    ws = [w for w in ir.workloads if w.model == m.name]
    pp = placement_problem(ir, m.name, pool)
    res = placement.place(pp, mode="chains", objective=cfg.objective, options=budget.next()) if pp.groups else None
    shared = None
    if res is not None:
        verify_result(res, pp)  # raises PassError when networkx's max flow disagrees with the reported flow
        budget.machine_dependent |= res.machine_dependent
        if cfg.compare_shared and len(pool) <= SHARED_MAX_NODES:
            shared = placement.place(pp, mode="shared", objective=cfg.objective, options=budget.next(),
                                     partial_inference=cfg.partial_inference)
            verify_result(shared, pp)
            budget.machine_dependent |= shared.machine_dependent
        elif cfg.compare_shared:
            budget.left -= 1
    else:
        budget.left -= 2 if cfg.compare_shared else 1
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
    rid_of = ids.for_chains(m.name, chains, placed, replicas)
    ests_p = {rid_of[c.id]: chain_estimate(ir, pp, c.stages) for c in chains}
    full_p = {c.id: full_tokens_per_s(pp, c.stages) for c in chains}
    theta_p, x_p = max_scale({k: dict(e.throughput_rps) for k, e in ests_p.items()}, demand, opts, name="place-rates")
    # every replica except those a measured layer profile rules out
    runnable = [r for r in mine if not measured_misfit(ir, r)]
    theta_s, x_s = max_scale({r.id: dict(r.estimate.throughput_rps) for r in runnable}, demand, opts, name="place-rates")
    kept = "placement" if theta_p > max(theta_c, theta_s) * (1 + 1e-6) else "compose"
    why = (f"theta {human.number(theta_p)} with the chains vs {human.number(theta_c)} (compose's replicas, same model) and "
           f"{human.number(theta_s)} (compose's replicas by their own estimates, what single-type serves)")
    return _Judged(pool, pp, res, shared, chains, hetis_recs, rid_of, full_c, da_c, full_p, ests_p,
                   theta_c, theta_p, x_p, theta_s, x_s, runnable, kept, why)


def chain_replicas(m, j: _Judged) -> tuple[list[Replica], dict[str, Node]]:
    """The kept chains as replicas, and the nodes (or TP slices) they run on."""
    assert j.res is not None  # chains are kept only when placement ran (no chains: theta_p 0)
    pool_by_id = {n.id: n for n in j.pool}
    reps = []
    for c in j.chains:
        stages = tuple(
            Stage(node=slice_id(u.unit), gpu=pool_by_id[u.node].gpu, region=pool_by_id[u.node].region, tp=u.tp,
                  layer_start=u.start, layer_end=u.end)
            for u in c.stages
        )
        gpus = "+".join(sorted({s.gpu for s in stages}))
        rid = j.rid_of[c.id]
        reps.append(Replica(id=rid, model=m.name, shape=f"{m.name}|chain|{gpus}|tp{c.tp}|pp{c.depth}|{c.id}",
                            stages=stages, dtype="bfloat16", estimate=j.ests_p[rid]))
    return reps, chain_nodes(pool_by_id, j.res)


def model_summary(ir: Problem, m, j: _Judged) -> ModelPlacement:
    """What plan.json and plan.md say about one model's placement."""
    res, shared = j.res, j.shared
    assert res is not None  # place_mixed summarizes only the models it placed
    return ModelPlacement(
        model=m.name, objective=ir.placement.objective, kept=j.kept, pool_nodes=len(j.pool),
        pool_gpus=sum(n.gpus for n in j.pool),
        status="optimal" if res.gap is not None and res.gap <= ir.solver.mip_gap else "feasible",
        helix_flow=res.helix_flow, depth_aware_capacity=res.depth_aware_capacity, bound=res.bound, gap=res.gap,
        capacity=sum(j.full_p.values()), compose_capacity=j.full_c,
        incumbent_source=res.incumbent_source,
        shared_helix_flow=shared.helix_flow if shared else None,
        shared_depth_aware_capacity=shared.depth_aware_capacity if shared else None,
        shared_bound=shared.bound if shared else None, shared_gap=shared.gap if shared else None,
        compose_depth_aware_capacity=j.da_c, scale_placement=j.theta_p, scale_compose=j.theta_c, scale_single_type=j.theta_s,
        chains=tuple(chain_summary(c, j) for c in j.chains),
    )


def chain_summary(c, j: _Judged) -> ChainSummary:
    limit, limit_node = _unit_ref(c.concurrency_limit)
    binding, binding_node = _unit_ref(c.binding)
    return ChainSummary(replica=j.rid_of[c.id] if j.kept == "placement" else c.id, depth=c.depth, tp=c.tp,
                        concurrency=c.concurrency, concurrency_limit=limit, concurrency_limit_node=limit_node,
                        micro_batch=c.micro_batch, capacity_tokens_per_s=j.full_p[c.id],
                        search_capacity_tokens_per_s=c.capacity, binding=binding, binding_node=binding_node,
                        helix_flow=c.helix_flow, split_nodes=c.split_nodes)


def place_mixed(ir: Problem, nodes: tuple[Node, ...], replicas: tuple[Replica, ...], ctx: PassContext) -> Problem:
    """Per model: place (place_model), keep the chains or compose's replicas, and report both."""
    budget, ids = _SolveBudget(ir, ctx.solver), _ReplicaIds(ir)
    node_by_id = {n.id: n for n in nodes}
    single_model = len({w.model for w in ir.workloads}) == 1
    spare = idle_owned(ir, nodes) if single_model else []
    final_nodes: dict[str, Node] = {}
    out: list[Replica] = []  # replica ids r0, r1, ... in model order
    lp: dict[str, tuple[float, dict[tuple[str, str], float]]] = {}  # model -> theta, x_{r,w} (rates.py)
    summaries, notes = [], []
    primary: list[PrimaryWorkers] = []
    status, objective, bound, gap = "ok", None, None, None
    for m in ir.models:
        mine = [r for r in replicas if r.model == m.name]
        pool = [node_by_id[s.node] for r in mine for s in r.stages] + spare
        j = place_model(ir, m, pool, mine, budget, ids, out, replicas)
        if j.kept == "placement":
            reps, used = chain_replicas(m, j)
            final_nodes.update(used)
            out += reps
            lp[m.name] = (j.theta_p, j.x_p)
            if any(r.applied for r in j.hetis_recs):  # a plan selection did not change says nothing new
                primary += place_hetis.to_ir(m.name, ir.placement.delta, j.hetis_recs, {c.id: c for c in j.chains},
                                             j.rid_of, slice_id)
        else:
            # only replicas that run by the spec's measured layer profiles: keeping the others would
            # emit a stage that holds more layers than fit
            dropped = sorted({r.id for r in mine} - {r.id for r in j.runnable})
            if dropped:
                notes.append(f"{m.name}: compose's replicas {', '.join(dropped)} hold more layers on a stage than the "
                             "measured layer profiles allow; dropped")
            if ir.previous is None:
                kept_reps = [r.model_copy(update={"id": f"r{len(out) + i}"}) for i, r in enumerate(j.runnable)]
            else:  # materialize already gave them ids that honour the previous plan
                kept_reps = list(j.runnable)
            for r in kept_reps:
                final_nodes.update({s.node: node_by_id[s.node] for s in r.stages})
            out += kept_reps
            new_id = {r.id: k.id for r, k in zip(j.runnable, kept_reps)}
            lp[m.name] = (j.theta_s, {(new_id[r], w): v for (r, w), v in j.x_s.items()})
        if j.res is None:
            notes.append(f"{m.name}: no pool node holds a layer of it; kept compose's replicas")
            continue
        summaries.append(model_summary(ir, m, j))
        if ir.placement.compare_shared and j.shared is None:
            notes.append(f"{m.name}: Helix's shared pipelines not compared: {human.plural(len(j.pool), 'pool node')}, "
                         f"above the {SHARED_MAX_NODES} the comparison runs on (its flow graphs grow with the square "
                         "of the pool)")
        notes.append(
            f"{m.name}: {human.plural(len(j.chains), 'chain')} over {human.plural(len(j.pool), 'pool node')}, {human.number(sum(j.full_p.values()))} tokens/s "
            f"(search objective, fast mode: {human.number(j.res.depth_aware_capacity)}; compose's replicas: {human.number(j.full_c)}, fast "
            f"{human.number(j.da_c)}), {j.why}: kept {j.kept}'s replicas"
        )
        objective, bound, gap = j.res.value, j.res.bound, j.res.gap
        if j.res.gap is None or j.res.gap > ir.solver.mip_gap:
            status = "feasible"
    if budget.machine_dependent:
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
    assert comp is not None  # place requires it
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
                                      text=f"placement: {human.plural(len(reps), 'replica')} {'serves' if len(reps) == 1 else 'serve'} {human.number(scale)}x the demand mix (compose: {human.number(comp.scale)}x)"))
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
        assert ir.replicas is not None  # place provides it
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
