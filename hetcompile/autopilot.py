"""`hetcompile autopilot OUT --spec SPEC`: observe the fleet, replan when it drifted, deploy; repeat.

One cycle:
  1. observe (observe/run.py) over the window, its corrections smoothed against the previous
     cycle's OUT/observed.yaml, and write the new one;
  2. decide (`decide`): what drifted past the dead band since the plan in OUT was built:
       a workload's rate        |lambda_obs - lambda_plan| / lambda_plan > dead_band
       a workload's lengths     |I_obs - I_plan| / I_plan > dead_band (same for O), from MIN_REQUESTS on
       a step-time correction   |log(k_obs / k_plan)| > log(1 + dead_band)   (k_plan = 1 where none)
     nothing -> `steady`; something, within `min_interval` of the last change -> `held`;
     else -> `replan`; and `incomplete` (no change) when a target could not be read: a replan on
     part of the fleet's metrics would plan for a fleet nobody measured;
  3. replan: build SPEC --observed --previous OUT/plan.json (the churn penalty keeps running
     replicas where they still fit) into OUT.next; a plan the migration planner has no step for
     (migrate/planner.plan_diff: the steps explain, migrate and deploy show) moves nothing; else (not --dry-run) it replaces OUT's artifacts and
     `hetcompile deploy OUT` converges the fleet to it.
Every cycle appends one line to OUT/autopilot.log: when, what was observed, what was decided and done.

Damping, against the oscillation autoscalers without it show: the dead band (noise in a steady
load moves nothing), the minimum interval between changes, the churn penalty of every replan, and
the geometric smoothing of corrections across windows (observe.SMOOTHING).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hetcompile.migrate.planner import plan_diff
from hetcompile.observe.run import dumps_observed, read_observed
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.io import read_plan_doc
from hetcompile.plan.observed import MIN_REQUESTS, ObservedDoc


@dataclass(frozen=True)
class Damping:
    dead_band: float = 0.15  # relative drift that counts as a change
    min_interval_s: float = 1800.0  # between two changes of the fleet
    churn_penalty: float = 0.05  # of the previous plan's objective, per replica launched or torn down


@dataclass(frozen=True)
class Decision:
    action: Literal["steady", "held", "incomplete", "replan"]
    drift: tuple[str, ...]


def drift(plan: PlanDoc, obs: ObservedDoc, dead_band: float) -> list[str]:
    """What moved past the dead band since `plan` was built (module docstring), in words."""
    out: list[str] = []
    seen = {w.name: w for w in obs.workloads}
    for w in plan.workloads:
        o = seen.get(w.name)
        if o is None:
            continue
        if w.demand_kind == "rate" and o.rate_per_s is not None and w.demand > 0 \
                and abs(o.rate_per_s - w.demand) / w.demand > dead_band:
            out.append(f"{w.name} rate {w.demand:.4g} -> {o.rate_per_s:.4g} req/s")
        for key, planned in (("input_tokens", w.input_tokens), ("output_tokens", w.output_tokens)):
            d = getattr(o, key)
            if d is not None and d.samples >= MIN_REQUESTS and planned > 0 and abs(d.mean - planned) / planned > dead_band:
                out.append(f"{w.name} {key.replace('_', ' ')} {planned:.4g} -> {d.mean:.4g}")
    before = {(c.gpu, c.tp): c.factor for c in (plan.observed.corrections if plan.observed else ())}
    for c in obs.corrections:
        k0 = before.get((c.gpu, c.tp), 1.0)
        if abs(math.log(c.factor / k0)) > math.log(1.0 + dead_band):
            out.append(f"{c.gpu} TP{c.tp} step times {k0:.3g}x -> {c.factor:.3g}x the model's")
    return out


def unread(obs: ObservedDoc) -> list[str]:
    """Targets the window could not read (down, malformed, refused, not deployed): a replan on part
    of the fleet's metrics would plan for a fleet nobody measured."""
    return [m for m in obs.missing if ": no correction:" not in m]


def decide(plan: PlanDoc, obs: ObservedDoc, now: float, last_change: float | None, damping: Damping) -> Decision:
    if unread(obs):
        return Decision("incomplete", tuple(unread(obs)))
    moved = tuple(drift(plan, obs, damping.dead_band))
    if not moved:
        return Decision("steady", ())
    if last_change is not None and now - last_change < damping.min_interval_s:
        return Decision("held", moved)
    return Decision("replan", moved)


@dataclass
class Autopilot:
    out: Path
    spec: Path
    observe: Callable[[ObservedDoc | None], ObservedDoc]  # previous -> this window's observation
    build: Callable[[Path, ObservedDoc, Path, Path, float], None]  # spec, observed, previous plan.json, out dir, churn
    deploy: Callable[[Path], int]  # OUT -> exit status
    damping: Damping = field(default_factory=Damping)
    dry_run: bool = False
    clock: Callable[[], float] = time.time
    last_change: float | None = None

    def cycle(self) -> str:
        """One observe / decide / act round; returns (and logs) its line."""
        prev_path = self.out / "observed.yaml"
        previous = read_observed(prev_path) if prev_path.is_file() else None
        obs = self.observe(previous)
        prev_path.write_text(dumps_observed(obs))  # an observation, not an action: --dry-run keeps it too
        now = self.clock()
        plan = read_plan_doc(self.out)
        d = decide(plan, obs, now, self.last_change, self.damping)
        done = "nothing"
        if d.action == "replan":
            nxt = self.out.parent / (self.out.name + ".next")
            if nxt.exists():
                shutil.rmtree(nxt)
            self.build(self.spec, obs, self.out / "plan.json", nxt, self.damping.churn_penalty)
            new = read_plan_doc(nxt)
            if not plan_diff(plan, new).migration.steps:  # the one diff explain, migrate and deploy show
                done = "replanned: the same fleet, nothing to deploy"
            elif self.dry_run:
                done = f"would deploy {len(new.replicas)} replicas ({len(plan.replicas)} now), plan in {nxt}"
            else:
                for f in nxt.iterdir():  # the new plan's artifacts over OUT's (deploy/ and secrets stay)
                    target = self.out / f.name
                    if f.is_dir():
                        shutil.rmtree(target, ignore_errors=True)
                        shutil.copytree(f, target)
                    else:
                        shutil.copy2(f, target)
                rc = self.deploy(self.out)
                done = f"deployed {len(new.replicas)} replicas (rc {rc})"
                if rc == 0:
                    self.last_change = now
            if not self.dry_run:
                shutil.rmtree(nxt, ignore_errors=True)
        rates = ", ".join(f"{w.name} {w.rate_per_s:.4g}/s" for w in obs.workloads if w.rate_per_s is not None) or "rates unknown"
        ks = ", ".join(f"{c.gpu} TP{c.tp} {c.factor:.3g}x" for c in obs.corrections) or "no corrections"
        line = (f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))} observed {obs.window_s:.0f} s: {rates}; {ks}"
                f"{'; ' + str(len(obs.missing)) + ' missing' if obs.missing else ''} | {d.action}"
                f"{': ' + '; '.join(d.drift) if d.drift else ''} | {done}")
        with (self.out / "autopilot.log").open("a") as fh:
            fh.write(line + "\n")
        return line
