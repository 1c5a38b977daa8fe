"""plan.md: the plan for a person, rendered from the same dict as plan.json."""

from __future__ import annotations

from typing import cast

from hetcompile.plan.canon import canon
from hetcompile.backends.templating import render
from hetcompile.plan import human


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


def _pct(x: float | None) -> str:
    return human.percent(x)


def summary(plan: dict) -> str:
    t = plan["totals"]
    if t["objective"] == "min-cost":
        return f"every workload rate met for {human.money(t['price_per_hour'])}."
    if t["objective"] == "min-makespan" and t.get("makespan_s") is not None:
        return f"all requests done in {_f(t['makespan_s'])} s."
    if t["objective"] == "max-throughput-per-dollar":
        if t.get("tokens_per_dollar") is None:
            return f"{_f(t['requests_per_s'])} requests/s on free GPUs alone (owned or priced $0/h), at $0/h (paying would lower throughput per dollar)."
        return f"{_f(t['tokens_per_dollar'])} tokens per dollar ({_f(t['objective_value'])}x the demand mix per $/h)."
    return f"{_f(t['requests_per_s'])} requests/s within budget and availability."


def plan_md(plan: dict, pictures: str = "") -> str:
    """`pictures`: a markdown block (explain/pictures.py) placed after the summary and what binds."""
    p = cast(dict, canon(plan))  # canon keeps a dict a dict
    return render("plan.md.j2", p=p, t=p["totals"], summary=summary(p), f=_f, f2=_f2, pct=_pct, n=human.plural,
                  money=human.money, pictures=pictures)
