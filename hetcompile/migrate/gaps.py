"""Capacity gaps: spans of steps after which a workload that has a target has no capacity at all.

The planner may dip below min(old, new) when the ceilings force a rolling replacement; a dip to
zero (the only replica serving a workload drained before its replacement is healthy) drops every
request of that workload for as long as the replacement takes to launch and load. Deploy and
migrate refuse such a rollout unless the user accepts it (`--allow-capacity-gap`); the refusal
names the workload, the steps, and how long: the launches in the gap, each bounded by the health
timeout (how long a launched replica may take to answer /health).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetcompile.migrate.actions import Rollout

ZERO = 1e-9  # req/s: below this a workload is not served


@dataclass(frozen=True)
class Gap:
    workload: str
    first: int  # the step after which the workload has no capacity
    last: int  # the last step after which it still has none
    texts: tuple[str, ...]  # (first step's text, the restoring step's text or "")
    launches: tuple[str, ...]  # what launches or restarts inside the gap (the wait the gap lasts)
    provisions: bool = False  # a launch among them (a new cluster is provisioned; a restart is not)


def capacity_gaps(ro: Rollout) -> list[Gap]:
    steps = ro.migration.steps
    out: list[Gap] = []
    for w in sorted({c.workload for s in steps for c in s.capacity}):
        run: list = []
        for s in [*steps, None]:
            cap = None if s is None else next((c for c in s.capacity if c.workload == w), None)
            empty = cap is not None and cap.target > ZERO and cap.requests_per_s <= ZERO
            if empty:
                run.append(s)
                continue
            if run:
                launches = tuple(x.unit.label for x in run if x.action in ("launch", "restart") and x.unit is not None)
                out.append(Gap(w, run[0].index, run[-1].index, (run[0].text, s.text if s is not None else ""), launches,
                               any(x.action == "launch" for x in run)))
                run = []
    return out


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g}min" if seconds >= 60 else f"{seconds:g}s"


def gap_text(g: Gap, health_timeout_s: float) -> str:
    span = f"step {g.first}" if g.first == g.last else f"steps {g.first}-{g.last}"
    until = f" until step {g.last + 1} ({g.texts[1]})" if g.texts[1] else " to the end"
    if g.launches:
        how = "launch(es) and load" if g.provisions else "restart(s) in place and load"
        long = (f"while {', '.join(g.launches)} {how}: up to {len(g.launches)} x the health timeout "
                f"({_duration(health_timeout_s)})" + (" plus provisioning" if g.provisions else ""))
    else:
        long = "with no launch in between: for the drains and routes of those steps"
    return f"workload {g.workload} would have no capacity after {span} (from: {g.texts[0]}){until}, {long}"
