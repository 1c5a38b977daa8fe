"""Migration from a running plan to a new one: ordered steps, and `replay`, which re-checks them.

A *unit* is a running replica: old only (removed, or the old side of a changed replica), new only
(added, or the new side), or both (untouched: the same cluster serves in both plans). Steps:

    launch U      bring U up, wait until healthy (costs money, serves nothing yet)
    route T       write the routing table T: which units serve, each with its plan's mix
    drain U       take U out of the table, wait for its in-flight requests
    teardown U    stop U (only once drained)
    restart U<-V  stop vLLM on drained V's cluster and start the new replica U there with its
                  engine args (same machines, same price: no provisioning), wait until healthy

Capacity after a step is K_w over the routed units (rates.py), each with the k_{r,w} of the plan
whose mix it serves; the target is min(K_w(old), K_w(new)) for every workload w.

Ceilings while migrating: money, max(new budget, old plan's $/h) (a budget cut cannot be met
before the old replicas go, and the old plan is what is paid now); GPUs per offer, max(the
availability the compose pass reported, what the old plan uses). When old + new fit under
both, the migration is *side-by-side*: launch every new unit, route to the new table, drain and
tear down the old ones; capacity never dips. Otherwise it is *rolling*: one unit at a time,
launching whatever fits and otherwise draining the outgoing unit that frees what is short at the
least capacity; the dips this forces are reported, step by step, in `dips`.

A changed replica that runs on the same machines (diff.in_place: same offers and TP; what
differs is engine args or the layer split) is restarted first, one at a time: drain, restart,
route it back, so every other replica keeps serving and nothing is provisioned. The one
exception is a replica that alone serves a workload: a restart would leave that workload with
no capacity, so it is replaced side by side when the ceilings allow a second copy for a while,
and restarted with the gap stated (migrate and deploy refuse gaps unless told) otherwise. Mode
`in-place` is a migration of restarts only.
"""

from __future__ import annotations

from hetcompile.plan import human
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetcompile.plan.canon import natural_key
from hetcompile.explain import rates
from hetcompile.explain.diff import diff_plans, in_place, match
from hetcompile.explain.doc import money
from hetcompile.explain.model import Dip, Migration, PlanDiff, Routed, Step, StepCapacity, Unit
from hetcompile.plan.doc import PlanDoc, PlanReplica

TOL = 1e-9


class MigrationError(ValueError):
    """A step sequence that cannot be carried out (a bug in the planner, or a hand-edited plan)."""


def _key(u: Unit) -> tuple:
    return (natural_key(u.old or ""), natural_key(u.new or ""))


class Plans:
    """Both plans, indexed: a unit's replica, price, GPUs per offer and full-load mix."""

    def __init__(self, old: PlanDoc, new: PlanDoc):
        self.old, self.new = old, new
        self.reps = {"old": {r.id: r for r in old.replicas}, "new": {r.id: r for r in new.replicas}}
        self.workloads = sorted(set(rates.served(old)) | set(rates.served(new)))
        ko, kn = rates.plan_capacity(old), rates.plan_capacity(new)
        self.target = {w: min(ko.get(w, 0.0), kn.get(w, 0.0)) for w in self.workloads}

    def side(self, u: Unit) -> tuple[PlanDoc, PlanReplica]:
        """(plan, replica) a unit is accounted by: its old replica while it has one."""
        return (self.old, self.reps["old"][u.old]) if u.old is not None else (self.new, self.reps["new"][u.new])

    def price(self, u: Unit) -> float:
        return rates.replica_price(*self.side(u))

    def gpus(self, u: Unit) -> dict[str, int]:
        plan, r = self.side(u)
        nodes = rates.node_index(plan)
        out: dict[str, int] = {}
        for s in r.stages:
            n = nodes[s.node] if s.node in nodes else None
            offer = n.offer if n is not None else "?"
            out[offer] = out.get(offer, 0) + ((n.gpus if n is not None else 0) or s.tp or 1)
        return out

    def mix(self, u: Unit, mix: str) -> dict[str, float]:
        rid = u.old if mix == "old" else u.new
        if rid is None:
            raise MigrationError(f"{u.label} cannot serve the {mix} plan's mix")
        plan = self.old if mix == "old" else self.new
        return rates.full_load(plan, self.reps[mix][rid])


@dataclass
class State:
    """What runs and what is routed after a step."""

    running: list[Unit] = field(default_factory=list)
    routed: dict[Unit, str] = field(default_factory=dict)

    def price(self, p: Plans) -> float:
        return sum(p.price(u) for u in self.running)

    def gpus(self, p: Plans) -> dict[str, int]:
        out: dict[str, int] = {}
        for u in self.running:
            for o, g in p.gpus(u).items():
                out[o] = out.get(o, 0) + g
        return out

    def capacity(self, p: Plans) -> dict[str, float]:
        out = {w: 0.0 for w in p.workloads}
        for u, mix in self.routed.items():
            for w, k in p.mix(u, mix).items():
                out[w] = out.get(w, 0.0) + k
        return out

    def table(self, p: Plans) -> tuple[Routed, ...]:
        cap = self.capacity(p)
        rows = []
        for u, mix in sorted(self.routed.items(), key=lambda kv: _key(kv[0])):
            k = p.mix(u, mix)
            rows.append(Routed(unit=u, mix=mix, weights={w: k[w] / cap[w] for w in sorted(k) if k[w] > 0 and cap[w] > 0}))
        return tuple(rows)


def unit_of(step: Step) -> Unit:
    """The replica a launch, drain, restart or teardown step acts on (MigrationError if it names none)."""
    if step.unit is None:
        raise MigrationError(f"step {step.index}: {step.action} names no replica")
    return step.unit


def apply(state: State, p: Plans, step: Step) -> State:
    """The state after `step`, or MigrationError when the step cannot be carried out."""
    running, routed = list(state.running), dict(state.routed)
    if step.action == "route":
        routed = {}
        for r in step.routed:
            if r.unit not in running:
                raise MigrationError(f"step {step.index}: routes to {r.unit.label}, which is not running")
            p.mix(r.unit, r.mix)
            routed[r.unit] = r.mix
        return State(running, routed)
    u = unit_of(step)
    if step.action == "launch":
        if u in running:
            raise MigrationError(f"step {step.index}: {u.label} is already running")
        p.side(u)  # raises KeyError for an unknown replica
        running.append(u)
    elif step.action == "drain":
        if u not in running:
            raise MigrationError(f"step {step.index}: drains {u.label}, which is not running")
        routed.pop(u, None)
    elif step.action == "restart":
        v = step.replaces
        if v is None or v not in running:
            raise MigrationError(f"step {step.index}: restarts {v.label if v else 'nothing'}, which is not running")
        if v in routed:
            raise MigrationError(f"step {step.index}: restarts {v.label} while it is routed (drain it first)")
        if u in running:
            raise MigrationError(f"step {step.index}: {u.label} is already running")
        p.side(u)
        running[running.index(v)] = u
    elif step.action == "teardown":
        if u in routed:
            raise MigrationError(f"step {step.index}: tears down {u.label} while it is routed (drain it first)")
        if u not in running:
            raise MigrationError(f"step {step.index}: tears down {u.label}, which is not running")
        running.remove(u)
    return State(running, routed)


def initial(p: Plans, units: list[Unit]) -> State:
    return State(list(units), {u: "old" for u in units})


@dataclass(frozen=True)
class Replayed:
    """One state of a replay: after step `index` (0: the old plan as it runs now)."""

    index: int
    running: tuple[Unit, ...]
    routed: dict
    price_per_hour: float
    gpus: dict[str, int]
    capacity: dict[str, float]


def replay(old: PlanDoc, new: PlanDoc, steps: tuple[Step, ...] | list[Step]) -> list[Replayed]:
    """Carry `steps` out from the old plan's replicas; the state after every step.

    Recomputes everything from the two plans and the steps' actions alone (not the numbers the
    steps report), so a test can check the planner against it.
    """
    p = Plans(old, new)
    from hetcompile.explain.diff import match  # the same matching the planner used

    untouched, changed, _, removed = match(old, new)
    start = [Unit(old=o.id, new=n.id) for o, n, _ in untouched] + [Unit(old=o.id) for o, _ in changed] + \
        [Unit(old=o.id) for o in removed]
    state = initial(p, start)
    out = []
    for i, step in enumerate([None, *steps]):
        if step is not None:
            state = apply(state, p, step)
        out.append(Replayed(i, tuple(state.running), dict(state.routed), state.price(p), state.gpus(p), state.capacity(p)))
    return out


def availability(plan: PlanDoc) -> dict[str, int]:
    """GPUs per offer the compose pass reported as binding (kind 'availability': subject = offer, limit = GPUs)."""
    return {b.subject: int(b.limit) for b in plan.totals.binding
            if b.kind == "availability" and b.subject and b.limit is not None}


class Planner:
    """Builds the steps (module docstring); one instance per migration."""

    def __init__(self, p: Plans, keep: list[Unit], outgoing: list[Unit], incoming: list[Unit],
                 restartable: Sequence[tuple[Unit, Unit]] = ()):
        self.p, self.keep, self.outgoing, self.incoming = p, keep, list(outgoing), list(incoming)
        self.restartable = list(restartable)  # (old unit, new unit) on the same machines
        self.restart_steps: set[int] = set()  # drain and restart steps of in-place restarts
        self.state = initial(p, keep + outgoing)
        old_gpus = self.state.gpus(p)
        budget = p.new.totals.budget_per_hour
        if budget is None:
            budget = p.old.totals.budget_per_hour
        self.old_price = self.state.price(p)
        self.budget = budget
        self.ceiling = None if budget is None else max(float(budget), self.old_price)
        avail = {**availability(p.old), **availability(p.new)}
        self.caps = {o: max(a, old_gpus.get(o, 0)) for o, a in avail.items()}
        self.steps: list[Step] = []
        self.checks: list[str] = []

    def fits(self, units: list[Unit]) -> tuple[bool, list[str]]:
        """Whether `units` run together under the ceilings, and what is short otherwise."""
        s = State(units, {})
        short = []
        if self.ceiling is not None and s.price(self.p) > self.ceiling + TOL:
            short.append("$")
        short += sorted(o for o, g in s.gpus(self.p).items() if o in self.caps and g > self.caps[o])
        return not short, short

    def emit(self, action: str, unit: Unit | None, text: str, routed: dict | None = None,
             replaces: Unit | None = None) -> None:
        step = Step(index=len(self.steps) + 1, action=action, unit=unit, text=text, price_per_hour=0.0, capacity=(),
                    replaces=replaces)
        if routed is not None:
            probe = State(self.state.running, routed)
            step = step.model_copy(update={"routed": probe.table(self.p)})
        self.state = apply(self.state, self.p, step)
        cap = self.state.capacity(self.p)
        caps = tuple(StepCapacity(workload=w, requests_per_s=cap[w], target=self.p.target[w]) for w in self.p.workloads)
        self.steps.append(step.model_copy(update={"price_per_hour": self.state.price(self.p), "capacity": caps}))

    def _describe(self, u: Unit) -> str:
        plan, r = self.p.side(u)
        st = r.stages
        where = "+".join(dict.fromkeys(s.region for s in st))
        gpu = "+".join(dict.fromkeys(s.gpu for s in st))
        return f"{gpu} tp{st[0].tp if st else '?'} pp{len(st)} in {where}, {money(self.p.price(u))}"

    def launch(self, u: Unit) -> None:
        self.emit("launch", u, f"launch {u.label} ({self._describe(u)}) and wait until healthy")

    def drain(self, u: Unit) -> None:
        self.emit("drain", u, f"drain {u.label}: out of the routing table, wait for its in-flight requests")

    def leave(self, u: Unit) -> None:
        self.drain(u)
        self.emit("teardown", u, f"tear down {u.label} (-{money(self.p.price(u))})")

    def final_route(self) -> None:
        routed = {u: "new" for u in self.state.running if u.new is not None}
        if routed == self.state.routed:  # the last rolling step already wrote this table
            return
        moved = [u.label for u in self.keep]
        text = "write the new plan's routing table"
        if moved:
            text += f" (untouched {', '.join(moved)} take their new weights)"
        self.emit("route", None, text, routed)

    def worst(self, routed: dict[Unit, str]) -> float:
        """min_w K_w / target_w of a routing: how well the least-served workload is off."""
        cap = State(self.state.running, routed).capacity(self.p)
        return min((cap[w] / t for w, t in self.p.target.items() if t > TOL), default=1.0)

    def best_table(self, u: Unit) -> dict[Unit, str]:
        """Route to `u` too; untouched units keep the old mix or take the new, whichever leaves the
        least-served workload better off."""
        add = {**self.state.routed, u: "new"}
        switched = {x: ("new" if x in self.keep else m) for x, m in add.items()}
        return switched if self.worst(switched) > self.worst(add) + TOL else add

    def victim(self, short: list[str], want: Unit, leaving: list[Unit]) -> Unit | None:
        """The outgoing unit to drain so `want` can launch: frees something short, and leaves the
        least-served workload best off (ties: frees all that is short, then by id)."""
        def helps(u: Unit) -> bool:
            return ("$" in short and self.p.price(u) > 0) or any(o in self.p.gpus(u) for o in short)

        def loss(u: Unit) -> float:
            return -self.worst({x: m for x, m in self.state.routed.items() if x != u})

        def solves(u: Unit) -> bool:
            rest = [x for x in self.state.running if x != u] + [want]
            return self.fits(rest)[0]

        cands = [u for u in leaving if helps(u)]
        return min(cands, key=lambda u: (not solves(u), loss(u), _key(u)), default=None)

    def alone(self, v: Unit) -> list[str]:
        """Workloads with a target that only `v` serves now (draining it leaves them nothing)."""
        cap = State(self.state.running, {x: m for x, m in self.state.routed.items() if x != v}).capacity(self.p)
        mine = self.p.mix(v, self.state.routed[v]) if v in self.state.routed else {}
        return sorted(w for w, k in mine.items() if k > TOL and self.p.target.get(w, 0.0) > TOL and cap.get(w, 0.0) <= TOL)

    def restarts(self) -> None:
        """The in-place restarts (module docstring), before anything else moves."""
        for v, u in self.restartable:
            lone = self.alone(v)
            if lone and self.fits(self.state.running + [u])[0]:
                self.checks.append(f"{v.label} alone serves {', '.join(lone)}: replaced side by side (launch, route, "
                                   "drain, tear down), not restarted, so that it keeps capacity")
                continue
            if lone:
                self.checks.append(f"{v.label} alone serves {', '.join(lone)} and a second copy does not fit the ceilings: "
                                   f"restarting it leaves {', '.join(lone)} unserved until it is healthy")
            self.outgoing.remove(v)
            self.incoming.remove(u)
            self.drain(v)
            self.restart_steps.add(len(self.steps))
            self.emit("restart", u, f"restart {v.label} in place as {u.label} with the new engine args (same "
                                    f"{self._describe(u)}; no provisioning) and wait until healthy", replaces=v)
            self.restart_steps.add(len(self.steps))
            self.emit("route", None, f"add {u.label} to the routing table", self.best_table(u))

    def run(self) -> str:
        self.restarts()
        if self.restart_steps and not self.outgoing and not self.incoming:
            self.final_route()
            return "in-place"
        together = self.state.running + self.incoming
        ok, short = self.fits(together)
        price = State(together, {}).price(self.p)
        if self.ceiling is not None and self.budget is not None:  # one is set when the other is
            verdict = "fits" if "$" not in short else "exceeds it: rolling replacement, one replica at a time"
            self.checks.append(
                f"budget: old and new side by side cost {money(price)}; the ceiling is {money(self.ceiling)} "
                f"(the larger of the new budget {money(float(self.budget))} and the old plan's {money(self.old_price)}); {verdict}")
        else:
            self.checks.append("budget: neither plan has one; old and new run side by side")
        gp = State(together, {}).gpus(self.p)
        for o in sorted(self.caps):
            if gp.get(o, 0) > self.caps[o]:
                self.checks.append(f"availability: {o} would need {gp[o]} GPUs side by side, {self.caps[o]} can be had; "
                                   "rolling replacement")
        if ok:
            for u in self.incoming:
                self.launch(u)
            self.final_route()
            for u in self.outgoing:
                self.leave(u)
            return "side-by-side"
        pending, leaving = list(self.incoming), list(self.outgoing)
        while pending:
            fit = next((x for x in pending if self.fits(self.state.running + [x])[0]), None)
            if fit is not None:
                u = fit
            else:
                short = self.fits(self.state.running + [pending[0]])[1]
                v = self.victim(short, pending[0], leaving)
                if v is not None:
                    leaving.remove(v)
                    self.leave(v)
                    continue
                u = pending[0]
                self.checks.append(f"{u.label} exceeds the ceiling ({', '.join(short)}) even with every old replica gone")
            pending.remove(u)
            self.launch(u)
            self.emit("route", None, f"add {u.label} to the routing table", self.best_table(u))
        self.final_route()
        for u in leaving:
            self.leave(u)
        return "rolling"


def _dip_cause(planner: Planner, steps: list[int]) -> str:
    if all(i in planner.restart_steps for i in steps):
        return "replicas restart in place one at a time (drained while they restart)"
    if not any(i in planner.restart_steps for i in steps):
        return "the ceiling cannot hold the outgoing and incoming replicas together"
    return "replicas restart in place, and the ceiling cannot hold the outgoing and incoming replicas together"


def _dips(p: Plans, steps: list[Step]) -> tuple[Dip, ...]:
    out = []
    for s in steps:
        for c in s.capacity:
            if c.requests_per_s < c.target * (1 - 1e-6) - TOL:
                out.append(Dip(step=s.index, workload=c.workload, requests_per_s=c.requests_per_s, target=c.target))
    return tuple(out)


def _spans(xs: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out: list[list[int]] = []
    for x in sorted(xs):
        if out and x == out[-1][1] + 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def _route_changes(p: Plans, keep: list[Unit]) -> bool:
    """Whether untouched units serve a different mix, or under other ids, in the new plan."""
    from hetcompile.plan.canon import canon

    return any(u.old != u.new or canon(p.mix(u, "old")) != canon(p.mix(u, "new")) for u in keep)


def plan_migration(old: PlanDoc, new: PlanDoc, untouched: list, changed: list, added: list, removed: list) -> Migration:
    """Steps from `old` to `new` given the replica matching of diff.match (PlanReplica tuples)."""
    p = Plans(old, new)
    keep = [Unit(old=o.id, new=n.id) for o, n, _ in untouched]
    outgoing = sorted([Unit(old=o.id) for o, _ in changed] + [Unit(old=o.id) for o in removed], key=_key)
    incoming = sorted([Unit(new=n.id) for _, n in changed] + [Unit(new=n.id) for n in added], key=_key)
    restartable = [(Unit(old=o.id), Unit(new=n.id)) for o, n in sorted(changed, key=lambda c: natural_key(c[0].id))
                   if in_place(old, o, new, n)]
    planner = Planner(p, keep, outgoing, incoming, restartable)
    if not outgoing and not incoming and not _route_changes(p, keep):
        return Migration(mode="none", ceiling_per_hour=planner.ceiling, peak_price_per_hour=planner.old_price, checks=(),
                         untouched=tuple(keep), steps=(), capacity_kept=True, dips=())
    mode = planner.run()
    dips = _dips(p, planner.steps)
    checks = list(planner.checks)
    if dips:
        for w in sorted({d.workload for d in dips}):
            ds = [d for d in dips if d.workload == w]
            low = min(ds, key=lambda d: d.requests_per_s)
            checks.append(
                f"capacity: {w} drops to {human.number(low.requests_per_s)} req/s ({human.number(100 * low.requests_per_s / low.target, 3)}% of "
                f"the target {human.number(low.target)}) at step(s) {_spans([d.step for d in ds])}: "
                + _dip_cause(planner, [d.step for d in ds]))
    else:
        checks.append("capacity: at or above min(old, new) for every workload after every step")
    peak = max([planner.old_price] + [s.price_per_hour for s in planner.steps])
    return Migration(mode=mode, ceiling_per_hour=planner.ceiling, peak_price_per_hour=peak, checks=tuple(checks),
                     untouched=tuple(keep), steps=tuple(planner.steps), capacity_kept=not dips, dips=dips)


def plan_diff(old: PlanDoc, new: PlanDoc) -> PlanDiff:
    """`explain OLD NEW`'s document: what changes (explain's diff) and the migration planned from the
    same matching, so that explain, migrate and deploy show one list of steps."""
    matching = match(old, new)
    return diff_plans(old, new, matching, plan_migration(old, new, *matching))
