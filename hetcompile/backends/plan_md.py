"""plan.md: the plan for a person, rendered from the same dict as plan.json."""

from __future__ import annotations

from hetcompile.plan.canon import canon
from hetcompile.backends.templating import render



def _f(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, (int, float)):
        return f"{x:.4g}"
    return str(x)


def _f2(x: object) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x: object) -> str:
    return "-" if x is None else f"{100 * x:.3g}%"


def summary(plan: dict) -> str:
    t = plan["totals"]
    if t["objective"] == "min-cost":
        return f"every workload rate met for ${t['price_per_hour']:.2f}/h."
    if t["objective"] == "min-makespan" and t.get("makespan_s") is not None:
        return f"all requests done in {t['makespan_s']:.4g} s."
    if t["objective"] == "max-throughput-per-dollar":
        if t.get("tokens_per_dollar") is None:
            return f"{t['requests_per_s']:.4g} requests/s on free GPUs alone (owned or priced $0/h), at $0/h (paying would lower throughput per dollar)."
        return f"{t['tokens_per_dollar']:.4g} tokens per dollar ({t['objective_value']:.4g}x the demand mix per $/h)."
    return f"{t['requests_per_s']:.4g} requests/s within budget and availability."


def plan_md(plan: dict) -> str:
    p = canon(plan)
    return render("plan.md.j2", p=p, t=p["totals"], summary=summary(p), f=_f, f2=_f2, pct=_pct)
