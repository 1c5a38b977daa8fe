"""Region segments: block placements for clusters whose inter-region links bind.

When a node pair between two regions carries less than the flow (the Helix geo cluster: ~0.6-0.9k
tokens/s per pair against ~2k through the pipeline), the flow must cross regions over several
node pairs at once. A placement is then a sequence of region *segments* sigma_1..sigma_m (each
region at most once); segment sigma is

    [entry fan] + interior blocks (blocks.py, only groups of the segment's region) + [exit fan]

where a *fan* is w nodes of one group in parallel holding the same k layers (w T(k) >= F). At
a crossing sigma -> sigma+1 the exit fan (w_out branches) hands the flow to the entry fan (w_in)
over w_out * w_in node pairs, so it needs cap_rs * w_out * w_in >= F (cap_rs: a representative
pair capacity). For a target F and a region order, one small MILP decides everything:

    y_b in Z+ (interior blocks),  o_f, i_f in {0,1} (exit / entry fan per segment),
    psi_{sigma,(a,c)} in {0,1} (width pair a * c * cap >= F at crossing sigma)
    sum lengths = L,  sum units per group <= N_g,  one fan per segment side,  sum_psi = 1,
    W_out(sigma) >= sum a psi,  W_in(sigma+1) >= sum c psi.
Interior block columns come from column generation per region (blocks.py pricing). The exact
flow of the realized placement (evaluate.py, after node swaps) is what `place` reports.
Work (budget.py): one unit per LP or MILP solve; each master stops at MILP_NODES nodes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from hetcompile.placement.helix.blocks import Block, BlockSearch
from hetcompile.opt.budget import Budget
from hetcompile.placement.result import StageUnit
from hetcompile.opt.dense import small_milp
from hetcompile.placement.tables import GroupTable, best_split

W_MAX = 4
MILP_NODES = 200  # branch-and-bound nodes of one segment master (its gap target is 10%)


@dataclass(frozen=True)
class Fan:
    j: int  # table index (global)
    width: int
    k: int


@dataclass(frozen=True)
class SegmentSolution:
    flow_target: float
    order: tuple[str, ...]
    segments: tuple[tuple[Fan | None, tuple[Block, ...], Fan | None], ...]  # (entry, interior, exit)


class SegmentSearch:
    def __init__(self, tables: tuple[GroupTable, ...], L: int, pair_cap: dict[tuple[str, str], float]):
        self.tables = tables
        self.L = L
        self.cap = pair_cap
        self.regions = tuple(sorted({t.region for t in tables if t.count}))
        self.local = {}
        for r in self.regions:
            idx = [j for j, t in enumerate(tables) if t.region == r and t.count]
            self.local[r] = (idx, BlockSearch(tuple(tables[j] for j in idx), L))
        self.N = np.array([t.count * t.units_per_node for t in tables], dtype=float)

    def _fans(self, r: str, F: float) -> list[Fan]:
        out = []
        for j in self.local[r][0]:
            T = self.tables[j].T
            for w in range(1, min(W_MAX, int(self.N[j])) + 1):
                ks = [k for k in range(1, len(T) + 1) if w * min(T[k - 1], F) >= F * (1 - 1e-12)]
                if ks:
                    out.append(Fan(j, w, max(ks)))
        return out

    def _interior(self, r: str, F: float, budget: Budget) -> list[tuple[Block, np.ndarray]]:
        """Region-pure block columns (local table indices mapped back to global)."""
        idx, bs = self.local[r]
        cols = bs.columns(F, budget)
        out = []
        for length, parts in cols:
            units = np.zeros(len(self.tables))
            gparts = tuple((idx[j], m, c) for j, m, c in parts)
            for j, m, c in gparts:
                units[j] += m * c
            out.append(((length, gparts), units))
        return out

    def solve_at(self, F: float, budget: Budget) -> SegmentSolution | None:
        interior = {r: self._interior(r, F, budget) for r in self.regions}
        fans = {r: self._fans(r, F) for r in self.regions}
        best = None
        for m in range(1, len(self.regions) + 1):
            for order in itertools.permutations(self.regions, m):
                if not budget.take():
                    return best
                sol = self._master(F, order, interior, fans, budget)
                if sol is not None:
                    return sol
        return best

    def _master(self, F, order, interior, fans, budget: Budget) -> SegmentSolution | None:
        """The segment MILP for one region order at flow F: columns, rows, HiGHS, then the segments."""
        cols = self._columns(order, interior, fans)
        pairs = self._link_pairs(F, order)
        if pairs is None:
            return None
        n = len(cols) + len(pairs)
        A, lo, hi = self._rows(cols, pairs, len(order), n)
        integer = np.ones(n, dtype=bool)
        col_hi = np.array([self.L if c[0] == "blk" else 1 for c in cols] + [1] * len(pairs), dtype=float)
        cost = np.array([float(c[3].sum()) for c in cols] + [0.0] * len(pairs))
        res = small_milp(cost, A, lo, hi, np.zeros(n), col_hi, integer,
                         time_limit_s=budget.seconds_left(), gap=0.1, node_limit=MILP_NODES)
        budget.note(res.timed_out)
        if res.x is None:
            return None
        return SegmentSolution(F, tuple(order), self._segments(cols, np.round(res.x).astype(int), len(order)))

    def _columns(self, order, interior, fans) -> list[tuple[str, tuple, float, np.ndarray, float]]:
        """(kind, key, length, units, width): each region's interior blocks, and its fans as the
        segment's entry (not the first region) or exit (not the last)."""
        cols: list[tuple[str, tuple, float, np.ndarray, float]] = []
        S = len(order)
        for s, r in enumerate(order):
            for blk, units in interior[r]:
                cols.append(("blk", (s, blk), blk[0], units, 0.0))
            for f in fans[r]:
                u = np.zeros(len(self.tables))
                u[f.j] = f.width
                if s > 0:
                    cols.append(("in", (s, f), f.k, u, f.width))
                if s < S - 1:
                    cols.append(("out", (s, f), f.k, u, f.width))
        return cols

    def _link_pairs(self, F, order) -> list[tuple[int, int, int]] | None:
        """(s, a, b): a exit fans of segment s and b entry fans of s + 1 whose links carry F; None
        when some consecutive regions have no such pair."""
        pairs = []
        for s in range(len(order) - 1):
            c = self.cap.get((order[s], order[s + 1]), 0.0)
            for a in range(1, W_MAX + 1):
                for b in range(1, W_MAX + 1):
                    if c * a * b >= F:
                        pairs.append((s, a, b))
            if not any(p[0] == s for p in pairs):
                return None
        return pairs

    def _rows(self, cols, pairs, S: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The constraints: layers sum to L, node counts, one entry and one exit per segment, one
        link pair per boundary whose widths the chosen fans cover."""
        rows, lo, hi = [], [], []

        def row(coef: dict[int, float], low: float, high: float) -> None:
            v = np.zeros(n)
            for i, x in coef.items():
                v[i] = x
            rows.append(v)
            lo.append(low)
            hi.append(high)

        row({i: c[2] for i, c in enumerate(cols)}, self.L, self.L)
        for j in range(len(self.tables)):
            coef = {i: c[3][j] for i, c in enumerate(cols) if c[3][j]}
            if coef:
                row(coef, 0, self.N[j])
        for s in range(S):
            if s > 0:
                row({i: 1 for i, c in enumerate(cols) if c[0] == "in" and c[1][0] == s}, 1, 1)
            if s < S - 1:
                row({i: 1 for i, c in enumerate(cols) if c[0] == "out" and c[1][0] == s}, 1, 1)
        off = len(cols)
        for s in range(S - 1):
            ps = [k for k, p in enumerate(pairs) if p[0] == s]
            row({off + k: 1 for k in ps}, 1, 1)
            w_out = {i: c[4] for i, c in enumerate(cols) if c[0] == "out" and c[1][0] == s}
            w_in = {i: c[4] for i, c in enumerate(cols) if c[0] == "in" and c[1][0] == s + 1}
            row({**w_out, **{off + k: -pairs[k][1] for k in ps}}, 0, np.inf)
            row({**w_in, **{off + k: -pairs[k][2] for k in ps}}, 0, np.inf)
        return np.array(rows), np.array(lo, float), np.array(hi, float)

    @staticmethod
    def _segments(cols, x: np.ndarray, S: int) -> tuple:
        """Per segment (entry fan, its blocks longest first, exit fan) from the solution x."""
        segs = []
        for s in range(S):
            entry = next((c[1][1] for i, c in enumerate(cols) if c[0] == "in" and c[1][0] == s and x[i]), None)
            exit_ = next((c[1][1] for i, c in enumerate(cols) if c[0] == "out" and c[1][0] == s and x[i]), None)
            blocks = []
            for i, c in enumerate(cols):
                if c[0] == "blk" and c[1][0] == s:
                    blocks += [c[1][1]] * int(x[i])
            segs.append((entry, tuple(sorted(blocks, key=lambda b: (-b[0], b[1]))), exit_))
        return tuple(segs)

    def search(self, lo: float, hi: float, budget: Budget, *, rel_tol: float = 2e-3) -> SegmentSolution | None:
        best = None
        floor = 1e-9 * max(hi, 1e-300)  # with lo = 0 and every probe failing, hi would halve down to 0
        while hi - lo > rel_tol * hi and hi > floor and not budget.exhausted:
            F = 0.5 * (lo + hi)
            sol = self.solve_at(F, budget)
            if sol is not None:
                best, lo = sol, F
            elif budget.exhausted:  # a probe cut off by the budget proves nothing
                break
            else:
                hi = F
        return best


def realize_segments(tables: tuple[GroupTable, ...], sol: SegmentSolution, node_ids: list[list[str]]) -> list[StageUnit]:
    nxt = [0] * len(tables)
    units: list[StageUnit] = []
    a = 0

    def take(j: int) -> str:
        node = node_ids[j][nxt[j]]
        nxt[j] += 1
        return node

    def fan(f: Fan, a: int) -> int:
        t = tables[f.j]
        for _ in range(f.width):
            node = take(f.j)
            units.append(StageUnit(node, node, t.gi, t.tp, tuple(range(t.tp)), a, a + f.k))
        return a + f.k

    for entry, blocks, exit_ in sol.segments:
        if entry is not None:
            a = fan(entry, a)
        for length, parts in blocks:
            for j, m, cnt in parts:
                t = tables[j]
                _, split = best_split(t.T, length, m)
                for _ in range(cnt):
                    s = a
                    for k in split:
                        node = take(j)
                        units.append(StageUnit(node, node, t.gi, t.tp, tuple(range(t.tp)), s, s + k))
                        s += k
            a += length
        if exit_ is not None:
            a = fan(exit_, a)
    return units
