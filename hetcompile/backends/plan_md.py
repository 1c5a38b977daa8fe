"""plan.md: the plan for a person, rendered from the plan document as plan.json has it (rounded)."""

from __future__ import annotations

from hetcompile.backends.templating import render
from hetcompile.plan import human
from hetcompile.plan.doc import PlanDoc, Verification
from hetcompile.plan.groups import group_picture


def _f(x: object) -> str:
    """A number for a person: 4 significant digits, SI suffix from 10k on (23.4k), no exponent."""
    if x is None:
        return "-"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return human.number(float(x))
    return str(x)


def _f2(x: float | None) -> str:
    """Dollars (per hour) in a $/h column: cents, or two significant digits below a cent."""
    return "-" if x is None else human.money(float(x))[1:-2]


def _plain(x: object) -> object:
    """A number as plan.json writes it: a whole float without its '.0' (1200, not 1200.0)."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _pct(x: float | None) -> str:
    return human.percent(x)


def summary(plan: PlanDoc) -> str:
    t = plan.totals
    if t.objective == "min-cost":
        return f"every workload rate met for {human.money(t.price_per_hour)}."
    if t.objective == "min-makespan" and t.makespan_s is not None:
        return f"all requests done in {_f(t.makespan_s)} s."
    if t.objective == "max-throughput-per-dollar":
        if t.tokens_per_dollar is None:
            return f"{_f(t.requests_per_s)} requests/s on free GPUs alone (owned or priced $0/h), at $0/h (paying would lower throughput per dollar)."
        return f"{_f(t.tokens_per_dollar)} tokens per dollar ({_f(t.objective_value)}x the demand mix per $/h)."
    return f"{_f(t.requests_per_s)} requests/s within budget and availability."


def _replayed(v: Verification, at: str = "") -> str:
    """How the build replayed the plan: R replications of D s after W s warm-up, or each
    independent part's (simulate/verify.py)."""
    def one(r: int, d: float, w: float) -> str:
        return f"{r} replications of {_f(d)} s{at} after {_f(w)} s warm-up"

    if len(v.parts) < 2:
        return one(v.replications, v.duration_s, v.warmup_s)
    return f"{len(v.parts)} independent parts, " + "; ".join(
        f"{', '.join(q.workloads)}: {one(q.replications, q.duration_s, q.warmup_s)}" for q in v.parts)


def plan_md(plan: PlanDoc, pictures: str = "") -> str:
    """`plan`: the document as read back from plan.json's text (plan/io.check_plan_doc), so plan.md
    shows the rounded numbers plan.json states. `pictures`: a markdown block (explain/pictures.py)
    placed after the summary and what binds."""
    return render("plan.md.j2", p=plan, t=plan.totals, summary=summary(plan), f=_f, f2=_f2, pct=_pct, plain=_plain, n=human.plural,
                  money=human.money, pictures=pictures, group_picture=group_picture, replayed=_replayed)
