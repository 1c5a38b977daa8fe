"""Local search over deployable chains: which node (or TP slice) serves which replica.

State: a set of chains (each with one TP) and the nodes' modes (a node runs whole, or cut into
G / t slices of TP t; its slices may serve different chains). Value: the sum over chains of the
objective's chain value, each at its best split (splits.py): depth-aware capacity or Helix's
bottleneck T. Moves (steepest improvement on small pools, first improvement on large ones),
repeated until none improves or the work budget (one unit per neighbour evaluated, budget.py)
is spent:
    drop a slot, move a slot to another chain, swap slots of two groups between chains,
    add a free slot (a free node may take any TP it has a profile for), open a new chain
    from free slots (greedy, fastest per layer first); and moves that change two things at once:
    merge two chains (and drop a slot), replace a slot by a free one, add two free slots,
    re-cut a chain's nodes at another TP (whole <-> slices)
Seeds come from the chain MILP, per-group pipelines and the greedy opener. With work left, an
iterated local search kicks the best state (a few random slot swaps between chains of one TP,
a merge of two of them, or a cut of one in two; seeded RNG) and descends again, keeping the
better state, until `patience` kicks in a row fail.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from hetcompile.opt.budget import Budget
from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.chains.splits import Slot, depth_split, helix_split, profile

Chain = tuple[Slot, ...]
STEEPEST_MAX_SLOTS = 16  # GPUs of the pool up to which hill climbing takes the best move, not the first
PAIR_MOVE_MAX_FREE = 16  # add-two-slots is quadratic in the free slots: skipped on large free pools


def all_modes(p: PlacementProblem) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """node -> (group index, GPUs, TPs it can run at)."""
    return {n: (gi, g.gpus_per_node, tuple(sorted(pr.tp for pr in g.profiles))) for gi, g in enumerate(p.groups) for n in g.ids}


def slots_of(p: PlacementProblem, node: str, tp: int,
             modes: dict[str, tuple[int, int, tuple[int, ...]]] | None = None) -> list[Slot]:
    """Node `node` cut into GPUs // tp slots of tp GPUs; `modes`: all_modes(p), when the caller kept it."""
    gi, G, _ = (modes or all_modes(p))[node]
    return [Slot(node, gi, tp, i, tp == G) for i in range(G // tp)]


def order_slots(p: PlacementProblem, slots: list[Slot] | Chain) -> Chain:
    """Regions contiguous (fewest crossings, best region order by latency), node slices adjacent."""
    by_region: dict[str, list[Slot]] = {}
    for s in slots:
        by_region.setdefault(p.groups[s.gi].region, []).append(s)
    for r in by_region:
        by_region[r].sort(key=lambda s: (s.gi, s.node, s.slice))
    regions = sorted(by_region)
    if len(regions) == 1:
        return tuple(by_region[regions[0]])
    # an order's crossings: node changes inside each region (the same in every order) and one link
    # between consecutive regions; latencies are summed in chain order, as the chain has them
    inside: dict[str, list[tuple[float, float]]] = {
        r: [(p.edge_capacity(a.node, b.node), p.link(a.node, b.node).latency) for a, b in zip(ss, ss[1:]) if a.node != b.node]
        for r, ss in by_region.items()}
    best, best_key = None, None
    for perm in itertools.permutations(regions):
        hops: list[tuple[float, float]] = []
        for k, r in enumerate(perm):
            if k:
                a, b = by_region[perm[k - 1]][-1], by_region[r][0]
                if a.node != b.node:
                    hops.append((p.edge_capacity(a.node, b.node), p.link(a.node, b.node).latency))
            hops += inside[r]
        key = (-min((c for c, _ in hops), default=float("inf")), sum([lat for _, lat in hops]), perm)
        if best_key is None or key < best_key:
            best, best_key = perm, key
    assert best is not None  # two regions or more: at least one order
    return tuple(s for r in best for s in by_region[r])


class ChainSearch:
    def __init__(self, p: PlacementProblem, objective: str):
        self.p = p
        self.objective = objective
        self.modes = all_modes(p)
        self._memo: dict[tuple[str, ...], tuple[float, list[int]]] = {}
        # value() by the chain object: a neighbour shares all but one or two chain tuples with its
        # state, and on pools of hundreds of chains re-keying each by its units dominated the search.
        # The chain is kept with its value, so its id is not reused while the entry lives.
        self._by_id: dict[int, tuple[Chain, float]] = {}
        # per TP, each node that can run it (sorted) with its slots, made once: free_slots is asked
        # for every chain of every state
        self._tp_slots = {t: [(n, slots_of(p, n, t, self.modes)) for n, (_, _, tps) in sorted(self.modes.items()) if t in tps]
                          for t in sorted({t for _, _, ts in self.modes.values() for t in ts})}
        self.evals = 0

    # -- values ------------------------------------------------------------------------------
    def split(self, chain: Chain) -> tuple[float, list[int]]:
        key = tuple(s.unit for s in chain)
        hit = self._memo.get(key)
        if hit is None:
            self.evals += 1
            fn: Callable = depth_split if self.objective == "depth-aware" else helix_split
            val, ks = fn(self.p, list(chain))
            if self.objective == "helix" and val > 0:
                val = min(val, self._link_cap(chain))
            hit = self._memo[key] = (val, ks)
        return hit

    def _link_cap(self, chain: Chain) -> float:
        p = self.p
        caps = [p.edge_capacity("source", chain[0].node), p.edge_capacity(chain[-1].node, "sink")]
        caps += [p.edge_capacity(a.node, b.node) for a, b in zip(chain, chain[1:]) if a.node != b.node]
        return min(caps)

    def value(self, chains: list[Chain]) -> float:
        total = 0.0  # the same float sum, in the same order, as sum() over the chains' values
        by_id = self._by_id
        for c in chains:
            hit = by_id.get(id(c))
            if hit is None or hit[0] is not c:
                hit = by_id[id(c)] = (c, self.split(c)[0])
            total += hit[1]
        return total

    # -- free capacity -----------------------------------------------------------------------
    def free_slots(self, chains: list[Chain], tp: int) -> list[Slot]:
        used = {s.unit for c in chains for s in c}
        mode = {s.node: s.tp for c in chains for s in c}
        out = []
        for node, slots in self._tp_slots.get(tp, ()):
            if mode.get(node, tp) == tp:
                out += [s for s in slots if s.unit not in used]
        return out

    def _free(self, chains: list[Chain]) -> Callable[[int], list[Slot]]:
        """free_slots(chains, tp), computed once per TP: the moves of one state ask for every chain."""
        cache: dict[int, list[Slot]] = {}

        def free(tp: int) -> list[Slot]:
            if tp not in cache:
                cache[tp] = self.free_slots(chains, tp)
            return cache[tp]
        return free

    def open_chain(self, chains: list[Chain], tp: int) -> Chain | None:
        """Greedy: fastest-per-layer free slots until the chain holds L layers (then re-split)."""
        free = self.free_slots(chains, tp)
        free.sort(key=lambda s: (-profile(self.p, s).throughput[-1] * profile(self.p, s).max_layers, s.unit))
        picked, cap = [], 0
        for s in free:
            picked.append(s)
            cap += profile(self.p, s).max_layers
            if cap >= self.p.num_layers:
                chain = order_slots(self.p, picked)
                return chain if self.split(chain)[0] > 0 else None
        return None

    # -- search ------------------------------------------------------------------------------
    def improve(self, chains: list[Chain], budget: Budget) -> list[Chain]:
        """Hill climbing: steepest ascent while the state has at most STEEPEST_MAX_SLOTS slots (first
        improvement is biased by the order of the moves: after a kick it often just undoes it),
        first improvement on larger pools."""
        # a chain too short to hold L layers (value 0) stays while climbing: moving one slot into it
        # can be the step a kick set up; what is still worthless is dropped at the end
        chains = [order_slots(self.p, c) for c in chains if c]
        best = self.value(chains)
        tps = sorted({t for _, _, ts in self.modes.values() for t in ts})
        steepest = sum(G for _, G, _ in self.modes.values()) <= STEEPEST_MAX_SLOTS
        while True:
            found, out_of_work = None, False
            for trial in self._neighbours(chains, tps):
                if not budget.take():
                    out_of_work = True
                    break
                val = self.value(trial)
                if val > (found[1] if found else best * (1 + 1e-9) + 1e-9):
                    found = (trial, val)
                    if not steepest:
                        break
            if found is not None:
                chains, best = found
            if found is None or out_of_work:
                break
        return [c for c in chains if self.split(c)[0] > 0]

    def _neighbours(self, chains: list[Chain], tps: list[int]):
        p = self.p
        n = len(chains)
        for t in tps:  # open a new chain from free slots
            new = self.open_chain(chains, t)
            if new is not None:
                yield chains + [new]
        free = self._free(chains)
        for i, c in enumerate(chains):  # add a free slot
            for s in free(c[0].tp):
                yield chains[:i] + [order_slots(p, c + (s,))] + chains[i + 1:]
        for i, c in enumerate(chains):  # drop a slot / drop the chain
            yield chains[:i] + chains[i + 1:]
            for k in range(len(c)):
                rest = c[:k] + c[k + 1:]
                if rest:
                    yield chains[:i] + [rest] + chains[i + 1:]
        for i, j in itertools.permutations(range(n), 2):  # move a slot between chains
            if chains[i][0].tp != chains[j][0].tp:
                continue
            for k in range(len(chains[i])):
                a = chains[i][:k] + chains[i][k + 1:]
                b = order_slots(p, chains[j] + (chains[i][k],))
                out = list(chains)
                out[i], out[j] = a, b
                yield [c for c in out if c]
        for i, j in itertools.combinations(range(n), 2):  # swap slots of different groups
            if chains[i][0].tp != chains[j][0].tp:
                continue
            seen = set()
            for ka, sa in enumerate(chains[i]):
                for kb, sb in enumerate(chains[j]):
                    if sa.gi == sb.gi or (sa.gi, sb.gi) in seen:
                        continue
                    seen.add((sa.gi, sb.gi))
                    a = order_slots(p, chains[i][:ka] + chains[i][ka + 1:] + (sb,))
                    b = order_slots(p, chains[j][:kb] + chains[j][kb + 1:] + (sa,))
                    out = list(chains)
                    out[i], out[j] = a, b
                    yield out

        yield from self._wider_moves(chains, tps)

    def _wider_moves(self, chains: list[Chain], tps: list[int]):
        """Moves that change two things at once, which single-slot moves cannot climb to (each half
        alone lowers the value): merge two chains (and drop one slot), replace a slot by a free one (a free node may
        change mode), add two free slots (both slices of a split node), re-cut a chain at another TP."""
        p = self.p
        n = len(chains)
        free_of = self._free(chains)
        for i, j in itertools.combinations(range(n), 2):  # merge two chains of one TP
            if chains[i][0].tp == chains[j][0].tp:
                out = [c for k, c in enumerate(chains) if k not in (i, j)]
                merged = order_slots(p, chains[i] + chains[j])
                yield out + [merged]
                for k in range(len(merged)):  # ... and leave one slot out (a deeper chain needs fewer)
                    yield out + [merged[:k] + merged[k + 1:]]
        for i, c in enumerate(chains):  # replace a slot by a free slot of the same TP
            free = free_of(c[0].tp)
            for k in range(len(c)):
                for f in free:
                    if f.node == c[k].node:
                        continue
                    yield chains[:i] + [order_slots(p, c[:k] + c[k + 1:] + (f,))] + chains[i + 1:]
        for i, c in enumerate(chains):  # add two free slots
            free = free_of(c[0].tp)
            if len(free) > PAIR_MOVE_MAX_FREE:
                continue
            for a, b in itertools.combinations(free, 2):
                yield chains[:i] + [order_slots(p, c + (a, b))] + chains[i + 1:]
        for i, c in enumerate(chains):  # the same nodes at another TP (whole <-> slices)
            nodes = sorted({s.node for s in c})
            rest = chains[:i] + chains[i + 1:]
            busy = {s.node for x in rest for s in x}
            if any(nd in busy for nd in nodes):
                continue  # a node shared with another chain keeps its mode
            for t in tps:
                if t == c[0].tp or any(t not in self.modes[nd][2] for nd in nodes):
                    continue
                yield rest + [order_slots(p, [s for nd in nodes for s in slots_of(p, nd, t, self.modes)])]

    def iterate(self, chains: list[Chain], budget: Budget, *, seed: int = 0, patience: int = 60) -> list[Chain]:
        """Iterated local search from a local optimum (deterministic: seeded kicks, work budget)."""
        rng = random.Random(seed)
        best, best_val = chains, self.value(chains)
        fails = 0
        while fails < patience and budget.left > 0 and not budget.timed_out:
            trial = self._kick(best, rng)
            if trial is None:
                break
            trial = self.improve(trial, budget)
            val = self.value(trial)
            if val > best_val * (1 + 1e-9):
                best, best_val, fails = trial, val, 0
            else:
                fails += 1
        return best

    def _kick(self, chains: list[Chain], rng: random.Random) -> list[Chain] | None:
        """A random perturbation: swap slots between chains of one TP, merge two of them, or cut
        one chain in two (the descent then adds free slots to the halves or sheds what a deeper
        chain does not need)."""
        pairs = [(i, j) for i, j in itertools.combinations(range(len(chains)), 2) if chains[i][0].tp == chains[j][0].tp]
        long = [i for i, c in enumerate(chains) if len(c) >= 2]
        kinds = (["swap", "merge"] if pairs else []) + (["split"] if long else [])
        if not kinds:
            return None
        kind = kinds[rng.randrange(len(kinds))]
        out = list(chains)
        if kind == "merge":
            i, j = rng.choice(pairs)
            return [c for k, c in enumerate(out) if k not in (i, j)] + [order_slots(self.p, out[i] + out[j])]
        if kind == "split":
            i = rng.choice(long)
            c = list(out[i])
            rng.shuffle(c)
            cut = rng.randrange(1, len(c))
            return out[:i] + out[i + 1:] + [order_slots(self.p, c[:cut]), order_slots(self.p, c[cut:])]
        for _ in range(2):
            i, j = rng.choice(pairs)
            a, b = list(out[i]), list(out[j])
            ka, kb = rng.randrange(len(a)), rng.randrange(len(b))
            a[ka], b[kb] = b[kb], a[ka]
            out[i], out[j] = order_slots(self.p, a), order_slots(self.p, b)
        return out

