"""The steps as actions: which cluster each step touches, the `sky` argv, the table to route.

Shared by migrate (two build directories) and deploy (the record's applied snapshot -> OUT).
Pure: reads the two build directories (plan.json, sky/*.yaml, router/routing.json) and the
Migration explain computed; runs nothing. A unit that runs in the old plan (removed, the old side
of a changed replica, or untouched) is the old plan's cluster `<old plan>-<old id>`; a new unit is
`<new plan>-<new id>`, launched from NEW/sky/<id>.yaml with a `--secret` for every secret the task
declares. Route and drain steps carry the routing table to serve after the step: each routed
unit with the replica entry of the plan whose mix it serves and the weights k_{r,w}/K_w of
explain's table (the new plan's own routing.json, unchanged, once only new-mix units are routed).
The router that runs is the old plan's (`<old plan>-router`); a table reaches it by
`sky exec` of a small task whose workdir holds the table (SkyPilot syncs a task's workdir to
~/sky_workdir, where the router reads routing.json, on every `sky exec`) and whose run POSTs
the router's own /admin/reload on loopback with the router token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hetcompile.plan.canon import dumps_yaml, natural_key
from hetcompile.explain import read_plan
from hetcompile.explain.diff import match
from hetcompile.explain.model import Migration, Routed, Unit
from hetcompile.errors import HetcompileError
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.routing import ROUTER_TOKEN_ENV, ReplicaWeight, RoutedReplica, RoutingTable
from hetcompile.migrate.planner import Plans, State, apply, plan_migration, unit_of

# the secrets every replica and the router task take by name (values from the environment)
REPLICA_SECRETS = ("HF_TOKEN", "HC_VLLM_API_KEY")
ROUTER_SECRETS = (ROUTER_TOKEN_ENV, "HC_VLLM_API_KEY")


def reload_paths(work: str) -> tuple[str, str]:
    """(reload task, its workdir) under NEW/<work>/: `migrate` or `deploy`."""
    return f"{work}/reload.yaml", f"{work}/router"


RELOAD_TASK, RELOAD_DIR = reload_paths("migrate")

Names = Callable[[str, str], str]  # (side "old" | "new", replica id) -> cluster name


class RolloutError(HetcompileError):
    """A migration that cannot be carried out as the plans stand (before anything runs)."""

    kind = "migrate error"


@dataclass(frozen=True)
class Target:
    """Where a unit runs: its cluster, the build directory and replica id of its task, its port."""

    cluster: str
    side: str  # "old" | "new": the build directory holding its task and routing entry
    rid: str
    port: int


@dataclass(frozen=True)
class Action:
    index: int
    kind: str  # launch | route | drain | teardown | restart
    text: str
    cluster: str | None = None
    argv: tuple[str, ...] = ()  # the sky command of launch / teardown / restart's exec (run in the NEW directory)
    stop: tuple[str, ...] = ()  # restart: the sky command that stops what the cluster runs first (`sky cancel`)
    table: RoutingTable | None = None  # route / drain: the table after the step (endpoints unfilled)
    endpoints: tuple[tuple[str, str, int], ...] = ()  # (table replica id, cluster, port) to fill in
    running: tuple[str, ...] = ()  # clusters running after the step
    final: bool = False  # route: the new plan's own table
    port: int = 0  # launch: the port its health is probed on; drain: the port its /metrics is read on
    leaving: tuple[str, ...] = ()  # route / drain: table ids a later step tears down (may be gone on a re-run)
    rid: str | None = None  # launch / restart: the new plan's replica id (deploy records its task hash)

    @property
    def on(self) -> str:
        """The cluster a launch, teardown, restart or drain acts on."""
        if self.cluster is None:
            raise ValueError(f"step {self.index}: {self.kind} names no cluster")
        return self.cluster

    @property
    def routing(self) -> RoutingTable:
        """The table a route or drain step serves."""
        if self.table is None:
            raise ValueError(f"step {self.index}: {self.kind} carries no routing table")
        return self.table


@dataclass(frozen=True)
class Rollout:
    old_dir: Path
    new_dir: Path
    old_plan: str
    new_plan: str
    migration: Migration
    router_cluster: str
    router_port: int
    actions: tuple[Action, ...]
    reload_task: str  # the text of NEW/migrate/reload.yaml
    running: tuple[str, ...] = ()  # clusters running before the first step
    incoming: tuple[str, ...] = ()  # clusters the steps launch
    notes: tuple[str, ...] = field(default=())
    work: str = "migrate"  # NEW/<work>/ holds the journal, the reload task and the tables pushed
    secrets_dir: Path | None = None  # where deploy keeps vllm.key / router.token (default: old_dir)
    command: str = ""  # how to re-run it, for the failure message
    router_task: str = "sky/router.yaml"  # launched (in NEW) when a route finds no router running
    key_extra: str = ""  # more that a journal entry must match (deploy: the clusters chosen)


def _task(d: Path, rid: str) -> dict:
    path = d / "sky" / f"{rid}.yaml"
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except OSError as e:
        raise RolloutError(f"cannot read {path}: {e.strerror or e}") from None
    return docs[0] if docs else {}


def _secret_args(d: Path, rid: str) -> list[str]:
    """`--secret NAME` for every secret the replica's task declares (values come from the environment)."""
    return [a for k in sorted(_task(d, rid).get("secrets") or {}) for a in ("--secret", k)]


def _port(task: dict, path: str) -> int:
    ports = (task.get("resources") or {}).get("ports")
    if isinstance(ports, list):
        ports = ports[0] if ports else None
    try:
        if not isinstance(ports, (int, float, str)):
            raise TypeError(ports)
        return int(ports)
    except (TypeError, ValueError):
        raise RolloutError(f"{path}: no single resources.ports to reach the server on") from None


def _table(d: Path) -> RoutingTable:
    path = d / "router" / "routing.json"
    try:
        return RoutingTable.model_validate_json(path.read_text())
    except OSError as e:
        raise RolloutError(f"cannot read {path}: {e.strerror or e}") from None


def plan_names(old: PlanDoc, new: PlanDoc) -> Names:
    """migrate's cluster names: `<plan>-<replica id>`, as deploy.sh launched them."""
    return lambda side, rid: f"{(old if side == 'old' else new).plan}-{rid}"


def target(old: PlanDoc, new: PlanDoc, u: Unit, old_dir: Path, new_dir: Path, names: Names | None = None) -> Target:
    side, rid = u.home
    d = old_dir if side == "old" else new_dir
    cluster = (names or plan_names(old, new))(side, rid)
    return Target(cluster=cluster, side=side, rid=rid, port=_port(_task(d, rid), f"{d}/sky/{rid}.yaml"))


def own_table(rows: tuple[Routed, ...], new_rt: RoutingTable) -> bool:
    """Whether `rows` route exactly the new plan's replicas on its own mix: its table serves them as is."""
    return all(r.mix == "new" for r in rows) and {r.unit.id_on("new") for r in rows} == {x.id for x in new_rt.replicas}


def routed_table(rows: tuple[Routed, ...], old_rt: RoutingTable, new_rt: RoutingTable) -> tuple[RoutingTable, dict[str, Unit]]:
    """The routing table serving `rows`, and which unit each of its replica ids is."""
    new_ids = {r.unit.id_on("new") for r in rows if r.mix == "new"}
    if own_table(rows, new_rt):
        return new_rt, {r.unit.id_on("new"): r.unit for r in rows}
    specs = {"old": {x.id: x for x in old_rt.replicas}, "new": {x.id: x for x in new_rt.replicas}}
    reps: list[RoutedReplica] = []
    ids: dict[str, Unit] = {}
    weights: dict[tuple[str, str], list[ReplicaWeight]] = {}
    for r in rows:
        rid = r.unit.id_on(r.mix)
        tid = rid if r.mix == "new" or rid not in new_ids else f"old-{rid}"
        spec = specs[r.mix][rid].model_copy(update={"id": tid, "endpoint": None})
        reps.append(spec)
        ids[tid] = r.unit
        for w, x in r.weights.items():
            weights.setdefault((spec.model, w), []).append(ReplicaWeight(replica=tid, weight=round(x, 6)))
    models = {m.name: m for m in old_rt.models} | {m.name: m for m in new_rt.models}
    out_models = []
    for name in sorted(models):
        classes = tuple(c.model_copy(update={"weights": tuple(sorted(weights.get((name, c.name), []), key=lambda w: natural_key(w.replica)))})
                        for c in models[name].classes)
        out_models.append(models[name].model_copy(update={"classes": classes}))
    table = new_rt.model_copy(update={"models": tuple(out_models), "replicas": tuple(sorted(reps, key=lambda x: natural_key(x.id)))})
    return RoutingTable.model_validate(table.model_dump()), ids


def reload_task(plan: str, port: int, workdir: str = RELOAD_DIR) -> str:
    code = ("import os, urllib.request as u; "
            f"r = u.Request('http://127.0.0.1:{port}/admin/reload', method='POST', "
            f"headers={{'Authorization': 'Bearer ' + os.environ['{ROUTER_TOKEN_ENV}']}}); "
            "print(u.urlopen(r, timeout=60).read().decode())")
    return dumps_yaml({
        "name": f"{plan}-router-reload",
        "workdir": workdir,
        "secrets": {ROUTER_TOKEN_ENV: None},
        "run": f'python3 -c "{code}"\n',
    })


def rollout_plan(old_dir: Path, new_dir: Path) -> Rollout:
    """`hetcompile migrate OLD NEW`: the migration explain shows, on the clusters deploy.sh named."""
    old, new = read_plan(old_dir, "old plan"), read_plan(new_dir, "new plan")
    old_dir = old_dir if old_dir.is_dir() else old_dir.parent
    new_dir = new_dir if new_dir.is_dir() else new_dir.parent
    refuse_mixed(old, new)
    mig = plan_migration(old, new, *match(old, new))
    router = _task(old_dir, "router")
    notes = []
    for u in mig.untouched:
        if u.old != u.new or old.plan != new.plan:
            notes.append(f"{u.label} keeps running as cluster {old.plan}-{u.old}; the new plan's teardown.sh calls it "
                         f"{new.plan}-{u.new}")
    for s in mig.steps:
        if s.action == "restart" and s.replaces is not None and s.unit is not None and \
                (s.replaces.old != s.unit.new or old.plan != new.plan):
            notes.append(f"{s.unit.label} runs on cluster {old.plan}-{s.replaces.old} (restarted in place); the new plan's "
                         f"teardown.sh calls it {new.plan}-{s.unit.new}")
    return rollout_from(old, new, old_dir, new_dir, mig, plan_names(old, new), router_cluster=f"{old.plan}-router",
                        router_port=_port(router, f"{old_dir}/sky/router.yaml"), notes=tuple(notes),
                        command=f"hetcompile migrate {old_dir} {new_dir}")


def refuse_mixed(old: PlanDoc, new: PlanDoc) -> None:
    mixed = [f"old {r.id}" for r in old.replicas if r.mixed] + [f"new {r.id}" for r in new.replicas if r.mixed]
    if mixed:  # managed Job Groups: no cluster to `sky launch` / `sky down`, no endpoint from `sky status`
        raise RolloutError(f"migrate does not handle mixed-GPU Job Groups yet ({', '.join(mixed)})",
                           hint="use the plans' deploy.sh / teardown.sh for those plans")


def refuse_group_step(old: PlanDoc, new: PlanDoc, index: int, final: bool) -> None:
    """A rollout between plans with prefill/decode groups may launch, restart and tear down, and write
    the new plan's own table, but not route or drain through a table of its own making: such a table
    gives each replica a share of a class, and a phase replica serves a class only through its group
    (plan/routing.py). Until those tables know groups, such a rollout is refused rather than run half-right."""
    if (old.groups or new.groups) and not final:
        raise RolloutError(
            f"rolling {'into' if new.groups else 'out of'} prefill/decode groups step by step is not supported yet "
            f"(step {index} would route through a table that splits a group's replicas)",
            hint="tear the old plan down (hetcompile teardown OLD) and deploy the new one, or build both with "
                 "`disaggregation: off`")


def rollout_from(old: PlanDoc, new: PlanDoc, old_dir: Path, new_dir: Path, mig: Migration, names: Names, *,
                 router_cluster: str, router_port: int, notes: tuple[str, ...] = (), work: str = "migrate",
                 command: str = "", secrets_dir: Path | None = None, key_extra: str = "") -> Rollout:
    """The Migration `mig` (from `old`, running on the clusters `names` gives, to `new`) as actions."""
    p = Plans(old, new)
    # a restarted replica runs on the cluster of the old unit it replaces, from the new task
    on_old = {s.unit: s.replaces for s in mig.steps if s.action == "restart" and s.replaces is not None}
    old_rt, new_rt = _table(old_dir) if (old_dir / "router" / "routing.json").exists() else _table(new_dir), _table(new_dir)
    state = State(list(mig.untouched) + sorted({s.unit for s in mig.steps if s.unit is not None and s.unit.new is None},
                                                  key=lambda u: natural_key(u.old or "")),
                  {})
    state = State(state.running, {u: "old" for u in state.running})
    actions = []

    def tgt(u: Unit) -> Target:
        t = target(old, new, u, old_dir, new_dir, names)
        if u in on_old:
            return Target(cluster=target(old, new, on_old[u], old_dir, new_dir, names).cluster, side=t.side, rid=t.rid,
                          port=t.port)
        return t

    def clusters(st: State) -> tuple[str, ...]:
        return tuple(sorted((tgt(x).cluster for x in st.running), key=natural_key))

    before = clusters(state)
    for s in mig.steps:
        state_before, state = state, apply(state, p, s)  # a launch, teardown or restart names its unit
        after = clusters(state)
        if s.action in ("launch", "teardown"):
            u = unit_of(s)
            t = tgt(u)
            if s.action == "launch":
                if t.cluster in clusters(state_before):
                    raise RolloutError(
                        f"step {s.index}: {u.label} would launch as cluster {t.cluster}, which already runs a replica of "
                        f"the old plan ({old.plan})", hint="build the new plan with `--previous OLD/plan.json`: "
                        "replica ids (and so cluster names) are then never reused")
                argv = ("sky", "launch", "-y", "-d", "-c", t.cluster, f"sky/{t.rid}.yaml", *_secret_args(new_dir, t.rid))
            else:
                argv = ("sky", "down", "-y", t.cluster)
            actions.append(Action(s.index, s.action, s.text, t.cluster, argv, running=after, port=t.port,
                                  rid=t.rid if s.action == "launch" else None))
        elif s.action == "restart":
            t = tgt(unit_of(s))
            argv = ("sky", "exec", t.cluster, f"sky/{t.rid}.yaml", "-d", *_secret_args(new_dir, t.rid))
            actions.append(Action(s.index, "restart", s.text, t.cluster, argv, stop=("sky", "cancel", "-y", "-a", t.cluster),
                                  running=after, port=t.port, rid=t.rid))
        else:
            rows = s.routed if s.action == "route" else state.table(p)
            refuse_group_step(old, new, s.index, own_table(rows, new_rt))
            table, ids = routed_table(rows, old_rt, new_rt)
            eps = []
            for tid, unit in sorted(ids.items(), key=lambda kv: natural_key(kv[0])):
                t = tgt(unit)
                eps.append((tid, t.cluster, t.port))
            tu = tgt(s.unit) if s.unit is not None else None
            cluster = tu.cluster if tu is not None else None
            later = {tgt(unit_of(x)).cluster for x in mig.steps if x.index > s.index and x.action == "teardown"}
            actions.append(Action(s.index, s.action, s.text, cluster, table=table, endpoints=tuple(eps), running=after,
                                  final=table is new_rt, leaving=tuple(t for t, c, _ in eps if c in later),
                                  port=tu.port if tu is not None and s.action == "drain" else 0))
    task, workdir = reload_paths(work)
    return Rollout(old_dir=old_dir, new_dir=new_dir, old_plan=old.plan, new_plan=new.plan, migration=mig,
                   router_cluster=router_cluster, router_port=router_port, actions=tuple(actions),
                   reload_task=reload_task(old.plan, router_port, workdir), notes=notes, running=before,
                   incoming=tuple(a.cluster for a in actions if a.kind == "launch" and a.cluster is not None), work=work,
                   secrets_dir=secrets_dir, command=command, key_extra=key_extra)
