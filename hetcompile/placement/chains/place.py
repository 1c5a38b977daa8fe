"""`chains` mode (default, deployable): every replica is a chain of stages with one TP size.

What vLLM 0.33 runs: a replica is a pipeline; each stage feeds exactly one next stage; TP is the
same on every stage; the KV capacity is the minimum over the stages. Multi-GPU nodes may be cut
into TP slices so that a mixed chain has one TP (`<node>#<j>` units on GPUs j*t..j*t+t-1).

Steps (work budgets decide where they stop; the caller's time limit is only a wall-clock cap,
and a result it cut short says so in `notes` and `machine_dependent`):
  1. seeds: per-group pipelines (each group at its best TP), the greedy opener
  2. the chain-level MILP (milp.py): Helix flow of chains, with its dual bound; stops at
     MILP_NODES branch-and-bound nodes (or the spec's smaller solver.node_limit); for the
     depth-aware objective (where it is only a seed) skipped above MILP_MAX_VARS variables
  3. local search from every seed, then iterated local search from the best (search.py),
     SEARCH_WORK neighbour evaluations in all,
     for the objective: `depth-aware` (default) or `helix`
  4. per chain: layer split, depth, C, micro-batch, capacity and binding term (evaluate.py)
The Helix-semantics flow of the result is recomputed by networkx on the chain edges only.
"""

from __future__ import annotations

import time
from dataclasses import replace

from hetcompile.opt.solve import SolverOptions, solve
from hetcompile.placement.chains import milp as chains_milp
from hetcompile.opt.budget import Budget
from hetcompile.placement.chains.search import Chain, ChainSearch, order_slots, slots_of
from hetcompile.placement.evaluate import chain_eval, edge_flows, helix_flow
from hetcompile.placement.heuristics import group_chains
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.result import ChainInfo, Objective, PlacementResult, SolveRecord
from hetcompile.placement.chain_model import full_tokens_per_s
from hetcompile.placement.chains.splits import stages_from_split
from hetcompile.placement.tables import group_tables, network

SEARCH_WORK = 20_000  # neighbour evaluations per placement (local searches 30%, iterated search the rest)
MILP_NODES = 100  # branch-and-bound nodes of the chain MILP (at most the spec's solver.node_limit)
MILP_MAX_VARS = 3_000  # larger chain MILPs are skipped for the depth-aware objective (only a seed there, no bound)


def per_group_chains(p: PlacementProblem) -> list[Chain]:
    """Each group alone, at the TP that gives its chains the most Helix flow."""
    L = p.num_layers
    out: list[Chain] = []
    for t_best in _best_group_modes(p):
        gi, tp, splits = t_best
        nodes = list(p.groups[gi].ids)
        free = [s for n in nodes for s in slots_of(p, n, tp)]
        for split in splits:
            picked, free = free[: len(split)], free[len(split):]
            out.append(order_slots(p, picked))
    return [c for c in out if sum(1 for _ in c) and len(c) <= L]


def _best_group_modes(p: PlacementProblem):
    tables = group_tables(p, split=True)
    best: dict[int, tuple[float, int, list]] = {}
    for t in tables:
        splits = group_chains(t, p.num_layers)
        val = sum(min(t.T[k - 1] for k in s) for s in splits)
        if val > best.get(t.gi, (0.0, 0, []))[0]:
            best[t.gi] = (val, t.tp, splits)
    return [(gi, tp, splits) for gi, (_, tp, splits) in sorted(best.items())]


def milp_chains(p: PlacementProblem, options: SolverOptions, seed: list[Chain], search: ChainSearch, *,
                max_vars: int | None = None):
    """Solve the chain-level MILP; returns (chains, SolveRecord, bound, the budget that stopped it)."""
    tables = group_tables(p, split=True)
    ct = chains_milp.chain_tables(tables, network(p), p.num_layers)
    if not ct.keys:
        return [], SolveRecord("place-chains-milp", "infeasible", None, 0.0, None, 0.0), 0.0, None
    ts = time.perf_counter()
    if max_vars is not None and chains_milp.num_variables(ct) > max_vars:
        # its root alone outlasts any sensible cap on large pools, and node limits cannot stop a root
        return [], SolveRecord("place-chains-milp", "skipped", None, None, None, time.perf_counter() - ts), None, None
    m = chains_milp.build_model(ct)
    warm = chains_milp.warm_start(m, ct, [_as_level(p, tables, c, search) for c in seed]) if seed else False
    res = solve(m, options, name="place-chains-milp", warm_start=bool(warm))
    chains: list[Chain] = []
    if res.has_solution:
        used: set[str] = set()
        mode: dict[str, int] = {}
        for tp, _theta, kinds in chains_milp.extract_chains(m, ct):
            picked = []
            for j, cnt in sorted(kinds.items()):
                need = cnt
                for node in p.groups[tables[j].gi].ids:
                    if need == 0:
                        break
                    if mode.get(node, tp) != tp:
                        continue
                    for s in slots_of(p, node, tp):
                        if need and s.unit not in used:
                            picked.append(s)
                            used.add(s.unit)
                            mode[node] = tp
                            need -= 1
            chains.append(order_slots(p, picked))
    rec = SolveRecord(res.name, res.status, res.objective, res.bound, res.gap, time.perf_counter() - ts)
    return chains, rec, res.bound, res.limit


def _as_level(p: PlacementProblem, tables, chain: Chain, search: ChainSearch):
    val, _ = search.split(chain)
    j_of = {(t.gi, t.tp): j for j, t in enumerate(tables)}
    kinds: dict[int, int] = {}
    for s in chain:
        j = j_of[(s.gi, s.tp)]
        kinds[j] = kinds.get(j, 0) + 1
    # the level is the chain's bottleneck T: the smallest table value >= val among its stages
    levels = sorted({v for j in kinds for v in tables[j].T if v >= val - 1e-9})
    return (chain[0].tp, levels[0] if levels else val, kinds)


def chain_infos(p: PlacementProblem, chains: list[Chain], search: ChainSearch) -> tuple[list[ChainInfo], list]:
    infos: list[ChainInfo] = []
    units = []
    for c in chains:
        _, ks = search.split(c)
        if not ks:
            continue
        stages = stages_from_split(list(c), ks)
        ev = chain_eval(p, stages)
        hv, _ = helix_flow(p, stages, [[s.unit for s in stages]])
        gpus = {p.groups[s.gi].gpu for s in stages}
        split_nodes = tuple(sorted({s.node for s in stages if s.unit != s.node}))
        infos.append(ChainInfo(
            id=f"c{len(infos)}", stages=tuple(stages), tp=stages[0].tp, mixed=len(gpus) > 1, split_nodes=split_nodes,
            depth=len(stages), concurrency=ev.concurrency, concurrency_limit=ev.concurrency_limit,
            micro_batch=ev.micro_batch, capacity=ev.capacity, binding=ev.binding, helix_flow=hv,
        ))
        units += stages
    return infos, units


FULL_MODE_EVALS = 400  # work budget of the full-mode polish (chain evaluations, ~1-2 ms each)


def polish_full_mode(p: PlacementProblem, chains: list[Chain], search: ChainSearch,
                     evals: int | None = None) -> tuple[list[Chain], int]:
    """Cut chains where the capacity formula's full mode says two shorter chains serve more.

    The search ranks chains by the fast mode, which spreads every prompt evenly over the steps; the
    full mode (what the plan reports, and what the simulator agrees with) charges each prompt lump
    to every micro-batch behind it, d (L - s) on a d-stage pipeline, so deep chains serve less than
    the search thinks. This last step evaluates every cut of a chain into two (each at its own
    split) by the full mode and keeps the best cut that raises the sum, until none does or `evals`
    full evaluations are spent (a work budget: the same result on every machine). Returns the
    chains and the evaluations used."""
    evals = FULL_MODE_EVALS if evals is None else evals
    memo: dict[tuple[str, ...], float] = {}
    used = 0

    def full(chain: Chain) -> float:
        nonlocal used
        key = tuple(s.unit for s in chain)
        if key not in memo:
            val, ks = search.split(chain)
            used += 1
            memo[key] = full_tokens_per_s(p, stages_from_split(list(chain), ks)) if val > 0 and ks else 0.0
        return memo[key]

    out = list(chains)
    improved = True
    while improved and used < evals:
        improved = False
        for i, c in enumerate(out):
            if len(c) < 2:
                continue
            here = full(c)
            best, best_cut = here, None
            for j in range(1, len(c)):
                if used >= evals:
                    break
                a, b = c[:j], c[j:]
                if search.split(a)[0] <= 0 or search.split(b)[0] <= 0:
                    continue
                v = full(a) + full(b)
                if v > best * (1 + 1e-9):
                    best, best_cut = v, (a, b)
            if best_cut is not None:
                out[i:i + 1] = list(best_cut)
                improved = True
                break
    return out, used


class _Log:
    """The search's solve records, each also told to the live status line (options.tell)."""

    def __init__(self, name: str, options: SolverOptions):
        self.name, self.options = name, options
        self.records: list[SolveRecord] = []
        self.best = 0.0

    def append(self, rec: SolveRecord) -> None:
        self.records.append(rec)
        self.best = max(self.best, rec.objective or 0.0)
        self.options.tell(f"{self.name} chains: {rec.name} done, incumbent {self.best:.6g}"
                          + (f", bound {rec.bound:.6g}" if rec.bound is not None else ""))


def place_chains(p: PlacementProblem, options: SolverOptions, *, objective: Objective = "depth-aware") -> PlacementResult:
    t0 = time.perf_counter()
    budget = float(options.time_limit_s)

    reserve = min(1.0, 0.05 * budget)  # chain evaluation and the final flow

    def left() -> float:
        return budget - reserve - (time.perf_counter() - t0)

    solves = _Log(p.name, options)
    helix = ChainSearch(p, "helix")
    seeds: dict[str, list[Chain]] = {}

    ts = time.perf_counter()
    seeds["per-group-pipelines"] = [c for c in per_group_chains(p) if helix.split(c)[0] > 0]
    solves.append(SolveRecord("per-group-pipelines", "feasible" if seeds["per-group-pipelines"] else "no-solution",
                              helix.value(seeds["per-group-pipelines"]), None, None, time.perf_counter() - ts))
    opener: list[Chain] = []
    for tp in sorted({s.tp for g in p.groups for s in g.profiles}):
        while True:
            c = helix.open_chain(opener, tp)
            if c is None:
                break
            opener.append(c)
    seeds["greedy"] = opener

    best_seed = max(seeds.values(), key=helix.value)
    mopts = replace(options, time_limit_s=max(0.5, 0.4 * left()), node_limit=min(options.node_limit or MILP_NODES, MILP_NODES))
    milp, rec, milp_bound, milp_limit = milp_chains(p, mopts, best_seed, helix,
                                                    max_vars=MILP_MAX_VARS if objective == "depth-aware" else None)
    solves.append(rec)
    if milp:
        seeds["milp"] = milp

    # the searches stop on work (neighbours evaluated), the same on every machine; the deadline
    # is only a cap, and hitting it is reported
    search = ChainSearch(p, objective)
    work = Budget(SEARCH_WORK, deadline=t0 + budget - reserve)
    best_name, best_chains, best_val = "none", [], 0.0
    names = sorted(seeds, key=lambda k: (-search.value(seeds[k]), k))
    for i, name in enumerate(names):
        ts = time.perf_counter()
        part = work.share(0.3 if i == 0 else 0.3 / max(1, len(names) - 1))
        chains = search.improve(seeds[name], part)
        work.absorb(part)
        val = search.value(chains)
        solves.append(SolveRecord(f"local-search<{name}>", "feasible" if val > 0 else "no-solution", val, None, None,
                                  time.perf_counter() - ts))
        if val > best_val * (1 + 1e-12):
            best_name, best_chains, best_val = f"local-search<{name}>", chains, val

    if best_chains and work.left > 0 and not work.timed_out:
        ts = time.perf_counter()
        part = work.share(1.0)
        chains = search.iterate(best_chains, part, seed=options.seed)
        work.absorb(part)
        val = search.value(chains)
        solves.append(SolveRecord("iterated-local-search", "feasible", val, None, None, time.perf_counter() - ts))
        if val > best_val * (1 + 1e-12):
            best_name, best_chains, best_val = "iterated-local-search", chains, val
    notes = [f"local search: {work.spent} of {work.work} neighbour evaluations"]
    if objective == "depth-aware" and best_chains:
        ts = time.perf_counter()
        before = len(best_chains)
        best_chains, used = polish_full_mode(p, best_chains, search)
        solves.append(SolveRecord("full-mode-polish", "feasible", search.value(best_chains), None, None,
                                  time.perf_counter() - ts))
        notes.append(f"full-mode polish: {len(best_chains) - before} chain cut(s), {used} of {FULL_MODE_EVALS} "
                     "full-mode evaluations")
    if work.timed_out or milp_limit == "time":
        notes.append("stopped by the wall-clock cap before its work budget: this plan may differ on a faster or "
                     "slower machine")
    infos, units = chain_infos(p, best_chains, search)
    val, flow = helix_flow(p, units, [[s.unit for s in c.stages] for c in infos]) if units else (0.0, {})
    da = sum(c.capacity for c in infos)
    bound = None
    if objective == "helix" and milp_bound is not None:
        bound = max(milp_bound, val)
    value = da if objective == "depth-aware" else val
    gap = (bound - value) / value if bound is not None and value > 0 else None
    return PlacementResult(
        problem_name=p.name, mode="chains", objective=objective, units=tuple(units), chains=tuple(infos),
        edge_flows=edge_flows(flow), helix_flow=val, depth_aware_capacity=da, bound=bound, gap=gap,
        incumbent_source=best_name, solves=tuple(solves.records), time_s=time.perf_counter() - t0, problem=p,
        notes=tuple(notes), machine_dependent=work.timed_out or milp_limit == "time",
    )
