"""Local search over deployable chains: which node (or TP slice) serves which replica.

State: a set of chains (each with one TP) and the nodes' modes (a node runs whole, or cut into
G / t slices of TP t; its slices may serve different chains). Value: the sum over chains of the
objective's chain value, each at its best split (splits.py): depth-aware capacity or Helix's
bottleneck T. First-improvement moves, repeated until none improves or time runs out:
    drop a slot, move a slot to another chain, swap slots of two groups between chains,
    add a free slot (a free node may take any TP it has a profile for), open a new chain
    from free slots (greedy, fastest per layer first)
Seeds come from the chain MILP, per-group pipelines and the greedy opener. With time left, an
iterated local search kicks the best state (a few random slot swaps between chains of one TP,
seeded RNG) and descends again, keeping the better state, until `patience` kicks in a row fail.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable

from hetcompile.placement.problem import PlacementProblem
from hetcompile.placement.splits import Slot, depth_split, helix_split, profile

Chain = tuple[Slot, ...]


def all_modes(p: PlacementProblem) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """node -> (group index, GPUs, TPs it can run at)."""
    return {n: (gi, g.gpus_per_node, tuple(sorted(pr.tp for pr in g.profiles))) for gi, g in enumerate(p.groups) for n in g.ids}


def slots_of(p: PlacementProblem, node: str, tp: int) -> list[Slot]:
    gi, G, _ = all_modes(p)[node]
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
    best, best_key = None, None
    for perm in itertools.permutations(regions):
        seq = [s for r in perm for s in by_region[r]]
        caps = [p.edge_capacity(a.node, b.node) for a, b in zip(seq, seq[1:]) if a.node != b.node]
        lat = sum(p.link(a.node, b.node).latency for a, b in zip(seq, seq[1:]) if a.node != b.node)
        key = (-min(caps, default=float("inf")), lat, perm)
        if best_key is None or key < best_key:
            best, best_key = seq, key
    return tuple(best)


class ChainSearch:
    def __init__(self, p: PlacementProblem, objective: str):
        self.p = p
        self.objective = objective
        self.modes = all_modes(p)
        self._memo: dict[tuple[str, ...], tuple[float, list[int]]] = {}
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
        return sum(self.split(c)[0] for c in chains)

    # -- free capacity -----------------------------------------------------------------------
    def free_slots(self, chains: list[Chain], tp: int) -> list[Slot]:
        used = {s.unit for c in chains for s in c}
        mode = {s.node: s.tp for c in chains for s in c}
        out = []
        for node, (gi, G, tps) in sorted(self.modes.items()):
            if tp not in tps or mode.get(node, tp) != tp:
                continue
            out += [s for s in slots_of(self.p, node, tp) if s.unit not in used]
        return out

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
    def improve(self, chains: list[Chain], deadline: float) -> list[Chain]:
        chains = [order_slots(self.p, c) for c in chains if self.split(order_slots(self.p, c))[0] > 0]
        best = self.value(chains)
        tps = sorted({t for _, _, ts in self.modes.values() for t in ts})
        while time.perf_counter() < deadline:
            found = None
            for trial in self._neighbours(chains, tps):
                if time.perf_counter() > deadline:
                    break
                val = self.value(trial)
                if val > best * (1 + 1e-9) + 1e-9:
                    found = (trial, val)
                    break
            if found is None:
                break
            chains, best = found
        return chains

    def _neighbours(self, chains: list[Chain], tps: list[int]):
        p = self.p
        n = len(chains)
        for t in tps:  # open a new chain from free slots
            new = self.open_chain(chains, t)
            if new is not None:
                yield chains + [new]
        for i, c in enumerate(chains):  # add a free slot
            for s in self.free_slots(chains, c[0].tp):
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

    def iterate(self, chains: list[Chain], deadline: float, *, seed: int = 0, patience: int = 15) -> list[Chain]:
        """Iterated local search from a local optimum (deterministic for a given time budget)."""
        rng = random.Random(seed)
        best, best_val = chains, self.value(chains)
        fails = 0
        while fails < patience and time.perf_counter() < deadline:
            trial = self._kick(best, rng)
            if trial is None:
                break
            trial = self.improve(trial, deadline)
            val = self.value(trial)
            if val > best_val * (1 + 1e-9):
                best, best_val, fails = trial, val, 0
            else:
                fails += 1
        return best

    def _kick(self, chains: list[Chain], rng: random.Random) -> list[Chain] | None:
        pairs = [(i, j) for i, j in itertools.combinations(range(len(chains)), 2) if chains[i][0].tp == chains[j][0].tp]
        if not pairs:
            return None
        out = list(chains)
        for _ in range(2):
            i, j = rng.choice(pairs)
            a, b = list(out[i]), list(out[j])
            ka, kb = rng.randrange(len(a)), rng.randrange(len(b))
            a[ka], b[kb] = b[kb], a[ka]
            out[i], out[j] = order_slots(self.p, a), order_slots(self.p, b)
        return out

