"""Upper bounds on the Helix max flow that hold for every placement, without solving the MILP.

Two bounds, both valid with or without partial inference and for any network (they drop it):

1. Capped fixed point (closed form). Every token crosses every layer once and a node carries at
   most the total flow F, so L * F <= sum_g N_g max_k k * min(T_g(k), F). The largest F that
   satisfies it is the LP relaxation of the group-count model; Helix's own early-stop bound
   (sum_i max_k k T_i(k) / L) is the same thing without the cap, hence 30-600x loose.

2. Per-layer covering patterns (much tighter). At every layer l the nodes covering it carry F
   between them, so the multiset of (g, k) covering l is a *pattern* p with
   sum_{(g,k) in p} min(T_g(k), F) >= F; a node of g holding k layers appears in k patterns, so
   pattern p uses r_g(p) = sum_{(g,k) in p} 1/k nodes of g per layer. F is achievable only if
       max sum_p lambda_p  s.t.  sum_p r_g(p) lambda_p <= N_g,  lambda >= 0
   reaches L layers. Integral patterns are what make it tight (the fixed point spreads a node
   fractionally over layers). Columns come from pricing: min sum_g pi_g sum_k m_gk / k s.t.
   sum m_gk min(T_g(k), F) >= F, sum_k m_gk <= N_g (a tiny MILP), and feasibility is monotone in
   F, so bisection gives the bound. Columns found for one F are reused when still valid.

3. Forced crossings (when links between regions bind). If no region alone holds L layers
   (sum of its nodes' max layers < L), every path crosses regions; if moreover every node pair
   between regions carries less than F, some layer next to each crossing is covered by >= 2
   nodes: either the sending layer has several nodes, or the single node there hands F to >= 2
   successors (one cross pair cannot take F). With the converged duals pi of the pattern LP
   (value V(F) = pi . N, every reduced cost rc_p = 1 - pi . r(p) <= 0), a placement's layers
   give  L = sum_l (pi . r(p_l) + rc(p_l)) <= V(F) + max{rc_p : p has >= 2 nodes},  so F is
   infeasible when V(F) + rho_multi(F) < L. On the Helix geo cluster V = L exactly on a whole
   range of F (no slack at all), so any forced parallel layer rules it out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from hetcompile.opt.budget import Budget
from hetcompile.opt.dense import small_lp, small_milp
from hetcompile.placement.tables import GroupTable

Pattern = tuple[tuple[int, int, int], ...]  # ((table index, k, multiplicity), ...)


@dataclass(frozen=True)
class BoundResult:
    value: float
    kind: str  # "pattern" or "fixed-point"
    time_s: float
    iterations: int


def fixed_point_bound(tables: tuple[GroupTable, ...], L: int, hi: float = 1e12) -> float:
    """Largest F with L F <= sum_g N_g max_k k min(T_g(k), F) (bisection; the map is concave)."""
    lo = 0.0
    hi = min(hi, sum(t.count * t.units_per_node * max(t.T) for t in tables) + 1.0)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        rhs = sum(t.count * t.units_per_node * max(k * min(T, mid) for k, T in enumerate(t.T, 1)) for t in tables)
        if rhs >= L * mid * (1 - 1e-12):  # the map can be flat (= L F) on an interval
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(hi, 1.0):
            break
    return hi


@dataclass(frozen=True)
class Crossing:
    """Every path must cross regions, over node pairs carrying at most `pair_cap` tokens/s."""

    pair_cap: float


class PatternBound:
    """Column generation for the per-layer pattern LP, with a column pool shared across F."""

    def __init__(self, tables: tuple[GroupTable, ...], L: int, crossing: Crossing | None = None):
        self.tables = tables
        self.L = L
        self.crossing = crossing
        self.duals: np.ndarray | None = None
        self.N = np.array([t.count * t.units_per_node for t in tables], dtype=float)
        self.items = [(j, k) for j, t in enumerate(tables) for k in range(1, t.kmax + 1) if t.T[k - 1] > 0]
        self.pool: dict[Pattern, None] = {}
        self.lp_solves = 0

    def _weight(self, j: int, k: int, F: float) -> float:
        return min(self.tables[j].T[k - 1], F)

    def _usage(self, pat: Pattern) -> np.ndarray:
        r = np.zeros(len(self.tables))
        for j, k, m in pat:
            r[j] += m / k
        return r

    def _valid(self, pat: Pattern, F: float) -> bool:
        return sum(m * self._weight(j, k, F) for j, k, m in pat) >= F * (1 - 1e-12)

    def _price(self, F: float, pi: np.ndarray, min_nodes: int = 0) -> tuple[float, Pattern]:
        """Cheapest pattern at flow F under duals pi (exact small MILP), with >= min_nodes nodes."""
        c = np.array([pi[j] / k + 1e-9 * k for j, k in self.items])
        w = np.array([self._weight(j, k, F) for j, k in self.items])
        rows = [w] + [np.array([1.0 if jj == j else 0.0 for jj, _ in self.items]) for j in range(len(self.tables))]
        lo = [F] + [0.0] * len(self.tables)
        hi = [np.inf] + list(self.N)
        if min_nodes:
            rows.append(np.ones(len(self.items)))
            lo.append(float(min_nodes))
            hi.append(np.inf)
        n = len(c)
        res = small_milp(c, np.array(rows), np.array(lo), np.array(hi), np.zeros(n), np.full(n, np.inf), np.ones(n, dtype=bool))
        if res.x is None:
            return np.inf, ()
        m = np.round(res.x).astype(int)
        pat = tuple((j, k, int(x)) for (j, k), x in zip(self.items, m) if x > 0)
        return float(sum(pi[j] * mm / k for j, k, mm in pat)), pat

    def layers(self, F: float, budget: Budget, *, early: bool = True) -> tuple[float, bool]:
        """(max layers coverable at flow F, proven): proven means no improving column is left.

        `early`: stop as soon as L layers are reached (enough to call F LP-feasible); `duals`
        then holds the last duals, which are optimal only when the return is proven and not early.
        """
        cols = [pat for pat in self.pool if self._valid(pat, F)]
        if not cols:
            _, pat = self._price(F, np.ones(len(self.tables)))
            if not pat:
                return 0.0, True
            cols = [pat]
            self.pool[pat] = None
        val = 0.0
        for _ in range(500):
            if not budget.take():  # one unit per LP solve (budget.py)
                return val, False
            R = np.array([self._usage(pat) for pat in cols]).T
            res = small_lp(np.ones(len(cols)), R, self.N)
            assert res.objective is not None and res.duals is not None  # x = 0 is feasible: the LP always solves
            self.lp_solves += 1
            val = res.objective
            pi = res.duals
            self.duals = pi
            if early and val >= self.L * (1 - 1e-7):
                return val, True  # feasible already (LP tolerance counts as feasible: keeps the bound valid)
            cost, pat = self._price(F, pi)
            if not pat or 1.0 - cost <= 1e-9 or pat in cols:
                return val, True
            cols.append(pat)
            self.pool[pat] = None
        return val, False

    def infeasible(self, F: float, budget: Budget) -> bool | None:
        """True: no placement reaches F (proven); False: cannot tell; None: out of work or time."""
        val, proven = self.layers(F, budget)
        if not proven:
            return None
        if val < self.L * (1 - 1e-7):
            return True
        if self.crossing is None or F <= self.crossing.pair_cap:
            return False
        val, proven = self.layers(F, budget, early=False)
        if not proven or self.duals is None:
            return None
        pi = np.maximum(self.duals, 0.0)
        cost, pat = self._price(F, pi, min_nodes=2)
        if not pat:
            return True  # no layer can be covered by two nodes at all
        rho = 1.0 - cost
        return val + rho < self.L * (1 - 1e-6)

    def bound(self, lo: float, hi: float, budget: Budget | None = None, *, rel_tol: float = 2e-4) -> BoundResult:
        """Smallest proven F_hi with an infeasible pattern LP, by bisection on [lo, hi].

        Stops at rel_tol or when `budget` (one unit per LP solve; default: unlimited) runs out;
        every F_hi it returns is proven, so a cut-off only leaves the bound looser.
        """
        budget = budget if budget is not None else Budget(10**12)
        t0 = time.perf_counter()
        it = 0
        lo = max(lo, 0.0)
        while hi - lo > rel_tol * max(hi, 1e-9) and not budget.exhausted:
            it += 1
            mid = 0.5 * (lo + hi)
            verdict = self.infeasible(mid, budget)
            if verdict is None:
                break
            if verdict:
                hi = mid
            else:
                lo = mid
        kind = "pattern+crossing" if self.crossing is not None else "pattern"
        return BoundResult(value=hi * (1 + 1e-7), kind=kind, time_s=time.perf_counter() - t0, iterations=it)
