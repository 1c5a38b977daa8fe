"""Pass 7, verify: replay the plan at its planned load and replan until its targets hold (docs/DESIGN.md).

The plan's document (ir/document.py) is simulated at its planned load (simulate/verify.py: R seeded
replications, judged at the upper 95% confidence bound of the share of requests outside each target).
Where a workload w misses, the pass searches the share f_w of the tail model's load (`tail_factors`,
which the profile pass multiplies into every shape's planned capacity) at which its targets hold.
Each round measures, per workload and target, rho(f_w): the judged percentile over the target
(VerifiedWorkload.ttft_ratio / tpot_ratio; above 1 a miss). The search is regula falsi on a line
per target, in the coordinate where rho is about linear in the load:

    TTFT   1 / rho: queueing delay grows like 1 / (1 - load) (M/G/1: W ~ rho / (1 - rho)), so its
           reciprocal falls about linearly to 0 where the replicas saturate
    TPOT   rho: a decode step's time grows about linearly with the sequences in flight, and they
           with the load (Little)

and f*(r) = the smallest share at which a target's line reaches rho = r:

    missed, never held       first round: f_w <- f_w x tighten(miss)     (target / simulated, in [0.5, 0.9])
                             then: f*(AIM) on the lines through the two lowest shares that missed,
                             within [0.5, 0.9] x f_w; the tighten step again where their rho differ
                             by less than NOISE_RISE (noise: a line would extrapolate it)
    held at lo, missed at hi f_w <- lo once f*(1) - lo <= BISECT_TOLERANCE x hi: the gain the lines
                             promise is below the tolerance; else max(f*(AIM), (lo + f*(1)) / 2), at
                             most hi - (hi - lo) / 4 (so that a miss there still shrinks the
                             bracket); bisection's (lo + hi) / 2 where no target's rho grows with f
                             between them (the simulation's noise over a small step)

AIM (0.95) aims a step just inside the targets, so that it lands on the held side and can end the
search; a plan for shares already tried is the one built then (the replan is deterministic).
A plan too large to replay within the work budget (simulate/verify.beyond_budget: its settling
warm-up alone would take more than half of it) is not simulated: the pass says so, with the
requests a replay would need, and plan.md marks the targets unchecked.
Latency is steep in load, so the first ratio step overshoots; the lines take back what it overshot.
The result is the last plan whose every target held; else the last plan whose SLOs held, with
`verification.unmet` naming the queueing bounds it missed (an SLO is the user's promise, a queueing
bound the build's own: llama70b-pp's chat and long share replicas, so tightening one moves the
other, and a round where chat held and long's bound missed is a plan to keep). If no plan held its
SLOs, the SLO missed (or a tightened plan that no longer fits) is an error at the SLO's line with
what would meet it.

A replan changes only loads (f_w scales throughput_rps): placement results of unchanged chains are
reused (placement.remembering, opened by the driver), and each round logs one line.
"""

from __future__ import annotations

import math
import time
from typing import Callable

from hetcompile.errors import HetcompileError, InfeasibleError
from hetcompile.ir.document import plan_doc
from hetcompile.ir.problem import PassReport, Problem
from hetcompile.plan.doc import Verification, VerifiedPart
from hetcompile.passes.base import Pass, PassContext, add_report
from hetcompile.simulate import verify as replay
from hetcompile.simulate.verify import TIGHTEN_MAX, TIGHTEN_MIN, Miss, summary, tighten

BISECT_TOLERANCE = 0.05  # stop refining f_w once the held and missed shares are this close (relative)
AIM = 0.95  # the rho a step aims at (module docstring)
# two misses whose rho differ by less than this (relative) differ by the simulation's noise more than
# by their loads (a p99 of 2000 requests moves a few % between seeds): a line through them would
# extrapolate that noise far (llama70b-pp's chat, its plan replayed alone: TPOT rho 1.012 at both
# 73% and 81% of the tail model's load, a line to 36%), so the step is the tighten ratio's instead
NOISE_RISE = 0.05


LOG_MISSES = 5  # a round's log line names this many misses, then counts the rest


def _misses_text(misses: list[Miss]) -> str:
    """'; w: what missed' for the first LOG_MISSES misses, then how many more (a spec of thousands of
    workloads keeps a one-line round)."""
    text = "".join(f"; {m.workload}: {miss_text(m)}" for m in misses[:LOG_MISSES])
    more = len(misses) - LOG_MISSES
    return text + (f"; and {more} more miss(es) in {len({m.workload for m in misses[LOG_MISSES:]})} workload(s)" if more > 0 else "")


class Verify(Pass):
    name = "verify"
    requires = ("replicas", "routing")
    provides = ""  # `verification`, when the plan has a target to check (an SLO or a queueing bound)

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        factors: dict[str, float] = {}
        held: dict[str, float] = {}  # per workload, the highest f_w whose targets held
        missed: dict[str, float] = {}  # the lowest f_w whose targets missed
        ratios: dict[str, dict[float, Ratios]] = {}  # per workload and f_w, the newest rho measured there
        plans: dict[tuple, Problem] = {(): ir}  # the plan built for each set of shares tried
        best: tuple[Problem, Verification] | None = None  # the last plan whose every target held
        kept: tuple[Problem, Verification] | None = None  # the last plan whose SLOs held (a queueing bound may have missed)
        slo: list[Miss] = []
        max_rounds = replay.MAX_ROUNDS
        doc = plan_doc(ir)
        big = replay.beyond_budget(doc)
        if big is not None:
            needed, settle = big
            note = (f"not simulated: at its planned load the plan settles in {settle:.0f} s, so a replay needs "
                    f"{needed:,} requests, above the work budget of {replay.VERIFY_MAX_REQUESTS:,}; its SLOs and queueing "
                    "bounds are the tail model's, unchecked")
            ctx.log(f"verify: {note}")
            return add_report(ir, PassReport(name=self.name, status="skipped", time_s=0.0, notes=(note,)))
        for rounds in range(1, max_rounds + 1):
            start = time.perf_counter()
            docs, ws, misses = replay.verify(doc, workers=int(ctx.options.get("verify_workers", 1)))
            if docs is None:
                return add_report(ir, PassReport(name=self.name, status="skipped", time_s=0.0,
                                                 notes=("nothing to check: no SLO and no queueing bound",)))
            slo = [m for m in misses if m.kind == "slo"]
            unmet = tuple(sorted({f"{m.workload}: {miss_text(m)}" for m in misses if m.kind != "slo"}))
            ver = summary(docs, ws, rounds, factors, unmet)
            ctx.log(f"verify: round {rounds}" + (f" at {_factors_text(factors)} of the tail model's load" if factors else "")
                    + f": {ver.requests} requests simulated in {time.perf_counter() - start:.3f}s"
                    + _parts_text(ver) + _misses_text(misses))
            if not misses:
                best = (ir, ver)
            if not any(m.kind == "slo" for m in misses):
                kept = (ir, ver)
            bad = {m.workload for m in misses}
            for vw in ws:
                _record(held, missed, vw.name, factors.get(vw.name, 1.0), vw.name in bad)
                ratios.setdefault(vw.name, {})[factors.get(vw.name, 1.0)] = (vw.ttft_ratio, vw.tpot_ratio)
            trial = next_factors(factors, held, missed, tighten(misses), ratios)
            if trial == factors or rounds == max_rounds:
                break
            ctx.on_pass(f"{self.name} round {rounds + 1}: replan")
            key = tuple(sorted(trial.items()))
            try:
                ir = plans[key] if key in plans else ctx.replan({"tail_factors": key})
                plans[key] = ir
            except HetcompileError as exc:
                if best is not None or kept is not None:
                    ctx.log(f"verify: a plan at {_factors_text(trial)} of the tail model's load does not fit "
                            f"({str(exc).splitlines()[0]})")
                    return self._result(best or kept, rounds)
                w = slo[0].workload
                raise InfeasibleError(
                    f"the SLO of workload {w!r} is not met at the planned load (simulated: "
                    f"{'; '.join(miss_text(m) for m in slo if m.workload == w)}), and a plan that loads its replicas "
                    f"less ({trial.get(w, 1.0):.0%} of the tail model's load) does not fit: {str(exc).splitlines()[0]}",
                    ir.span(f"slo:{w}") or ir.span("budget"),
                    hint=_cheapest_change(slo, w),
                ) from None
            ctx.on_pass(self.name)
            factors = trial
            doc = plan_doc(ir)
        if best is not None or kept is not None:
            return self._result(best or kept, rounds)
        w = slo[0].workload
        raise InfeasibleError(
            f"the SLO of workload {w!r} is still missed after {max_rounds} plan(s), each loading its replicas less "
            f"(now {factors.get(w, 1.0):.0%} of the tail model's load); simulated at the planned load: "
            + "; ".join(miss_text(m) for m in slo if m.workload == w),
            ir.span(f"slo:{w}"),
            hint=_cheapest_change(slo, w),
        )

    def _result(self, chosen: tuple[Problem, Verification] | None, rounds: int) -> Problem:
        """The plan kept, with its round's verification and the number of plans simulated in all
        (the plan kept may be an earlier round's: the search went on above it and missed)."""
        assert chosen is not None
        ir, ver = chosen
        ver = ver.model_copy(update={"rounds": rounds})
        return add_report(ir.model_copy(update={"verification": ver}), _report(self.name, ver))


def _parts_text(v: Verification) -> str:
    """' in N parts' where the round replayed independent parts, and which of them stopped early
    because their targets missed beyond doubt on the first replications."""
    short = [p for p in v.parts if p.replications < replay.REPLICATIONS]
    if len(v.parts) < 2:
        return f" ({v.replications} of {replay.REPLICATIONS} replications: missed beyond doubt)" if short else ""
    return f" in {len(v.parts)} parts" + (
        f" ({'; '.join(f'{_part_name(p)}: {p.replications} of {replay.REPLICATIONS} replications' for p in short)}: "
        "missed beyond doubt)" if short else "")


def _part_name(p: VerifiedPart) -> str:
    """A part by its workloads, the first LOG_MISSES of them."""
    more = len(p.workloads) - LOG_MISSES
    return ", ".join(p.workloads[:LOG_MISSES]) + (f" and {more} more" if more > 0 else "")


def simulated_text(v: Verification, number: Callable[[float], str] = lambda x: f"{x:.4g}") -> str:
    """How the plan was replayed, in words: R x duration, or each independent part's."""
    if len(v.parts) < 2:
        return f"{v.replications} x {number(v.duration_s)} s at the planned load"
    return (f"{len(v.parts)} independent parts at the planned load, "
            + "; ".join(f"{_part_name(p)} {p.replications} x {number(p.duration_s)} s" for p in v.parts))


def _report(name: str, v: Verification) -> PassReport:
    """The pass's row in plan.md: what was simulated, and the load shares the plan holds at."""
    notes = [f"{simulated_text(v)}, {v.requests} requests; "
             f"{v.rounds} plan{'s' if v.rounds != 1 else ''} simulated"]
    notes += [f"{w.name} planned at {w.factor:.0%} of the tail model's load" for w in v.workloads if w.factor < 1.0]
    return PassReport(name=name, status="unmet" if v.unmet else "met", time_s=0.0, notes=tuple(notes))


def miss_text(m: Miss) -> str:
    """A miss in words: the judged percentile (the upper confidence bound, simulate/verify.py) over its target."""
    if m.simulated_s <= m.target_s:
        return (f"{m.what} {m.percentile} {m.simulated_s:.3g} s within target {m.target_s:.3g} s, but too few requests "
                f"within every target for a {m.percentile}")
    return f"{m.what} {m.percentile} {'unbounded' if m.simulated_s == float('inf') else f'{m.simulated_s:.3g} s'} > target {m.target_s:.3g} s"


def _record(held: dict[str, float], missed: dict[str, float], w: str, f: float, miss: bool) -> None:
    """Note that workload w's targets missed (or held) at share f. The newest outcome wins over an
    older one it contradicts: workloads share the budget, so another workload's tighter share can
    change what compose buys for this one, and a share that held in an earlier round can miss now
    (chat-rag: rag held at 100% in round 1 and missed at 100% from round 2; with the stale hold
    bracketing it, it was never tightened)."""
    if miss:
        missed[w] = min(missed.get(w, f), f)
        if held.get(w, 0.0) >= f:
            del held[w]
    else:
        held[w] = max(held.get(w, 0.0), f)
        if missed.get(w, 2.0) <= f:
            del missed[w]


Ratios = tuple[float | None, float | None]  # (TTFT's rho, TPOT's rho) of one round; None: no such target


def next_factors(factors: dict[str, float], held: dict[str, float], missed: dict[str, float],
                 steps: dict[str, float], ratios: dict[str, dict[float, Ratios]] | None = None) -> dict[str, float]:
    """The next round's f_w (module docstring): missed and never held -> f_w x its tighten step, or
    the lines through the two lowest misses; bracketed (held at lo, missed at hi) -> a step on the
    lines through both ends (the midpoint where no line can be drawn), until hi - lo or the gain the
    lines promise is within BISECT_TOLERANCE x hi; then the highest share that held. `ratios`: per
    workload and share, the rho measured there (None: the bisection alone)."""
    out = dict(factors)
    for w in sorted(set(held) | set(missed)):
        f = factors.get(w, 1.0)
        mine = (ratios or {}).get(w, {})
        if w in missed and w not in held:
            lower = sorted(x for x in mine if x >= missed[w])[:2]  # the two lowest shares that missed
            step = (_share_at((lower[0], mine[lower[0]]), (lower[1], mine[lower[1]]), rho=AIM, min_rise=NOISE_RISE)
                    if len(lower) == 2 else None)
            if step is not None:
                out[w] = min(TIGHTEN_MAX * f, max(TIGHTEN_MIN * f, step))
            elif w in steps:
                out[w] = f * steps[w]
            continue
        if w not in missed:
            continue
        lo, hi = held[w], missed[w]
        edge = aim = None  # the lines' shares at rho = 1 and at AIM: both or neither (the same targets qualify)
        if lo in mine and hi in mine:
            edge = _share_at((lo, mine[lo]), (hi, mine[hi]), rho=1.0)
            aim = _share_at((lo, mine[lo]), (hi, mine[hi]), rho=AIM)
        if hi - lo <= BISECT_TOLERANCE * hi:
            out[w] = lo
        elif edge is None or aim is None:
            out[w] = 0.5 * (lo + hi)
        elif edge - lo <= BISECT_TOLERANCE * hi:
            out[w] = lo
        else:
            out[w] = min(max(aim, 0.5 * (lo + edge)), hi - 0.25 * (hi - lo))
    return {w: round(f, 6) for w, f in out.items() if round(f, 6) < 1.0}


def _share_at(a: tuple[float, Ratios], b: tuple[float, Ratios], rho: float, min_rise: float = 0.0) -> float | None:
    """The smallest share f at which a target's line through the two rounds (f, rho) reaches rho
    (module docstring: TTFT in 1 / rho, TPOT in rho); None where no target's rho grows with f
    between them (by more than `min_rise`, relative), so no line says where the targets hold."""
    (fa, ra), (fb, rb) = sorted([a, b], key=lambda p: p[0])
    if not fb > fa:
        return None
    shares = []
    for k, coord in enumerate((_reciprocal, _identity)):
        x, y = ra[k], rb[k]
        if x is None or y is None or not 0 < x * (1.0 + min_rise) < y or (math.isinf(y) and coord is _identity):
            continue
        cx, cy = coord(x), coord(y)
        shares.append(fa + (coord(rho) - cx) * (fb - fa) / (cy - cx))
    return min(shares) if shares else None


def _reciprocal(r: float) -> float:
    """-1 / rho: rising with rho, 0 at rho = inf (a replica that never drains)."""
    return 0.0 if math.isinf(r) else -1.0 / r


def _identity(r: float) -> float:
    return r


def _factors_text(factors: dict[str, float]) -> str:
    return ", ".join(f"{w} {f:.0%}" for w, f in sorted(factors.items())) or "100%"


def _cheapest_change(misses: list[Miss], w: str) -> str:
    """The loosest targets the last plan meets, and the other ways out."""
    loose = [f"{m.what.lower()}: {m.simulated_s * 1.05:.3g}s" for m in misses if m.workload == w and m.simulated_s < float("inf")]
    return ((f"loosen the target to what the plan reaches ({', '.join(loose)}), " if loose else "") +
            "raise `budget` or offer faster GPUs so that more replicas share the load, or choose a lower `percentile`")
