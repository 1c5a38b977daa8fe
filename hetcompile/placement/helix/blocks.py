"""Block price-and-branch: the primal heuristic that finds near-optimal shared placements.

A *block* covers a layer range of length l with parallel *branches*; a branch is m nodes of one
group g in series with the best split of the l layers (capacity T*_g(l, m), tables.py). Flows
merge and re-split at block boundaries, so blocks in series reach flow F when every block's
branches carry sum min(T*, F) >= F. This is the integral counterpart of the per-layer pattern
LP of bound.py (whose patterns mix k's that only a block of lcm length could realize), and it
contains chains (one block per group in series) and Swarm's equal stages as special cases.

For a target F (bisection between the incumbent and the bound):
    master LP   max sum_b l_b y_b  s.t.  sum_b units_gb y_b <= N_g,  y >= 0
    pricing     per l: min sum_g pi_g r_g  s.t.  sum_g cap_g(l, r_g) >= F, r_g <= N_g
                where cap_g(l, r) is the most capacity r nodes of g give over l layers as
                branches (a 1-D knapsack over branch sizes m); solved by DP over capacity in
                units of F / Q, rounded *down*, so every column is truly feasible
    integer     sum_b l_b y_b = L,  sum_b units_gb y_b <= N_g,  y integer  (small MILP)
An integer solution is a placement with flow >= F on a network whose links do not bind; its
exact flow is then computed on the real graph (evaluate.py). A failed F proves nothing.

Work (budget.py): one unit per LP or MILP solve; the integer master stops at MILP_NODES
branch-and-bound nodes. The wall clock is only the budget's cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hetcompile.opt.budget import Budget
from hetcompile.placement.result import StageUnit
from hetcompile.opt.dense import small_lp, small_milp
from hetcompile.placement.tables import GroupTable, best_split

Q = 400  # capacity resolution of the pricing DP (units of F / Q)
MILP_NODES = 200  # branch-and-bound nodes of one integer master (its gap target is 5%)
Block = tuple[int, tuple[tuple[int, int, int], ...]]  # (length, ((table j, branch size m, branches), ...))


@dataclass(frozen=True)
class BlockSolution:
    flow_target: float
    blocks: tuple[Block, ...]


class BlockSearch:
    def __init__(self, tables: tuple[GroupTable, ...], L: int):
        self.tables = tables
        self.L = L
        self.N = np.array([t.count * t.units_per_node for t in tables], dtype=int)
        self._branch_cache: dict[tuple[int, int], list[float]] = {}
        self.last_lp = 0.0

    def _branch_caps(self, j: int, length: int) -> list[float]:
        """cap of one branch of m = 1..N_j nodes of table j over `length` layers (0: impossible)."""
        key = (j, length)
        if key not in self._branch_cache:
            T = self.tables[j].T
            self._branch_cache[key] = [best_split(T, length, m)[0] for m in range(1, int(self.N[j]) + 1)]
        return self._branch_cache[key]

    def _group_dp(self, j: int, length: int, F: float) -> tuple[np.ndarray, list[list[int]]]:
        """best[r] = capacity units r nodes of j give (branches), and the branch sizes used."""
        n = int(self.N[j])
        caps = [min(c, F) for c in self._branch_caps(j, length)]
        units = [int(np.floor(c / F * Q + 1e-9)) for c in caps]
        best = np.full(n + 1, -1, dtype=int)
        best[0] = 0
        how: list[list[int]] = [[] for _ in range(n + 1)]
        for r in range(1, n + 1):
            for m in range(1, r + 1):
                if units[m - 1] <= 0 or best[r - m] < 0:
                    continue
                val = min(Q, best[r - m] + units[m - 1])
                if val > best[r]:
                    best[r], how[r] = val, how[r - m] + [m]
        return best, how

    def _price(self, length: int, F: float, pi: np.ndarray) -> tuple[float, Block | None]:
        """Cheapest block of this length reaching F under duals pi (DP over capacity units)."""
        INF = np.inf
        H = np.full(Q + 1, INF)
        H[0] = 0.0
        back = []
        idx = np.arange(Q + 1)
        for j in range(len(self.tables)):
            best, how = self._group_dp(j, length, F)
            newH = H.copy()
            ch_r = np.zeros(Q + 1, dtype=int)  # nodes of j taken to reach each state (0: none)
            ch_s = idx.copy()  # state before table j
            for r in range(1, len(best)):
                sh = int(best[r])
                if sh <= 0:
                    continue
                cand = H + pi[j] * r
                # unsaturated part: state s -> s + sh, one to one
                tgt = idx[: Q + 1 - sh] + sh
                better = cand[: Q + 1 - sh] < newH[tgt] - 1e-12
                newH[tgt[better]] = cand[: Q + 1 - sh][better]
                ch_r[tgt[better]] = r
                ch_s[tgt[better]] = idx[: Q + 1 - sh][better]
                # saturated part: every s >= Q - sh lands on Q
                tail = cand[Q - sh:]
                k = int(np.argmin(tail))
                if tail[k] < newH[Q] - 1e-12:
                    newH[Q], ch_r[Q], ch_s[Q] = tail[k], r, Q - sh + k
            back.append((ch_r, ch_s, how))
            H = newH
        if not np.isfinite(H[Q]):
            return INF, None
        # walk back through the tables
        s, parts = Q, []
        for j in range(len(self.tables) - 1, -1, -1):
            ch_r, ch_s, how = back[j]
            r = int(ch_r[s])
            if r == 0:
                continue
            sizes = how[r]
            for m in sorted(set(sizes)):
                parts.append((j, m, sizes.count(m)))
            s = int(ch_s[s])
        return float(H[Q]), (length, tuple(sorted(parts)))

    def _units(self, blk: Block) -> np.ndarray:
        u = np.zeros(len(self.tables))
        for j, m, cnt in blk[1]:
            u[j] += m * cnt
        return u

    def columns(self, F: float, budget: Budget, *, max_rounds: int = 60) -> list[Block]:
        """Column generation for the master LP at flow F; sets `last_lp` (layers coverable)."""
        lengths = range(1, self.L + 1)
        cols: dict[Block, None] = {}
        self.last_lp = 0.0
        for length in lengths:  # seed: cheapest block per length at unit prices
            _, blk = self._price(length, F, np.ones(len(self.tables)))
            if blk is not None:
                cols[blk] = None
        if not cols:
            return []
        for _ in range(max_rounds):
            if not budget.take():
                break
            cl = list(cols)
            R = np.array([self._units(b) for b in cl]).T
            res = small_lp(np.array([b[0] for b in cl], dtype=float), R, self.N)
            assert res.objective is not None and res.duals is not None  # x = 0 is feasible: the LP always solves
            self.last_lp = res.objective
            pi = res.duals
            added = 0
            for length in lengths:
                cost, blk = self._price(length, F, pi)
                if blk is not None and length - cost > 1e-7 and blk not in cols:
                    cols[blk] = None
                    added += 1
            if not added:
                break
        return list(cols)

    def solve_at(self, F: float, budget: Budget) -> BlockSolution | None:
        cols = self.columns(F, budget)
        if not cols or self.last_lp < self.L - 1e-6 or not budget.take():
            return None
        cl = list(cols)
        R = np.array([self._units(b) for b in cl])
        n = len(cl)
        A = np.vstack([np.array([[b[0] for b in cl]], dtype=float), R.T])
        lo = np.concatenate([[self.L], np.zeros(len(self.tables))])
        hi = np.concatenate([[self.L], self.N.astype(float)])
        cost = R.sum(axis=1)  # fewest nodes among the feasible ones
        out = small_milp(cost, A, lo, hi, np.zeros(n), np.full(n, float(self.L)), np.ones(n, dtype=bool),
                         time_limit_s=budget.seconds_left(), gap=0.05, node_limit=MILP_NODES)
        budget.note(out.timed_out)
        if out.x is None:
            return None
        y = np.round(out.x).astype(int)
        blocks = []
        for b, cnt in zip(cl, y):
            blocks += [b] * int(cnt)
        return BlockSolution(F, tuple(sorted(blocks, key=lambda b: (-b[0], b[1]))))

    def search(self, lo: float, hi: float, budget: Budget, *, rel_tol: float = 1e-3) -> BlockSolution | None:
        """Bisection on F; returns the best integer block solution found."""
        best = None
        if hi <= 1e-9 * max(1.0, lo):  # a bound of (numerically) zero: no flow to search for
            return None
        # try near the top first: when the bound is tight the first probe already succeeds
        probes = [hi * (1 - 1e-6)]
        while not budget.exhausted:
            F = probes.pop() if probes else 0.5 * (lo + hi)
            if hi - lo <= rel_tol * hi and not probes:
                break
            sol = self.solve_at(F, budget)
            if sol is not None:
                best, lo = sol, F
                if F >= hi * (1 - rel_tol):
                    break
            elif budget.exhausted:  # a probe cut off by the budget proves nothing
                break
            else:
                hi = F
        return best


def realize(tables: tuple[GroupTable, ...], sol: BlockSolution, node_ids: list[list[str]]) -> tuple[StageUnit, ...]:
    """Concrete units: blocks in order, branches on the next free nodes of each group."""
    nxt = [0] * len(tables)
    units = []
    a = 0
    for length, parts in sol.blocks:
        for j, m, cnt in parts:
            t = tables[j]
            _, split = best_split(t.T, length, m)
            for _ in range(cnt):
                s = a
                for k in split:
                    node = node_ids[j][nxt[j]]
                    nxt[j] += 1
                    units.append(StageUnit(node, node, t.gi, t.tp, tuple(range(t.tp)), s, s + k))
                    s += k
        a += length
    return tuple(units)
