"""`hetcompile deploy OUT`: reconcile the running fleet to OUT's plan (apply semantics).

The fleet that runs (diff.py: the record's applied plan, only the clusters `sky status` lists)
is the old side of a migration, OUT's plan the new side, and replicas are matched by task hash:

    kept      same replica id and same hash, cluster running   (nothing to do)
    restarted same id, another hash, same machines (engine args or layer split changed):
              drain, restart the new task on the same cluster, route back (planner.py)
    replaced  same id, another hash, other machines (or its cluster is gone)
              (launch new, route, drain old, down)
    added / removed                                            (launch / drain and down)

The planner orders the steps capacity-safely (new healthy and routed before the old is drained);
run.py executes them, the record follows every launch and teardown, and on success OUT's plan
becomes the applied one. Then come clusters of this plan nobody serves any more (launched toward
a plan that was rebuilt before it converged, or by a deploy.sh before the record): torn down last.

New clusters are `<plan>-<id>`, or `<plan>-<id>-<hash6>` while that name still runs the old task
(the replacement must be up before the old one goes). A re-run after a failure plans again from
what runs: a recorded cluster with the wanted hash is kept, so nothing launches twice.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from hetcompile.plan.canon import natural_key
from hetcompile.explain import read_plan
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.routing import RoutingTable
from hetcompile.migrate.actions import (
    Action, Rollout, RolloutError, _port, _table, _task, rollout_from,
)
from hetcompile.migrate.diff import APPLIED, ROUTER, DeployError, Launched, Record, legacy_clusters, sky_status, task_hash
from hetcompile.migrate.planner import plan_migration
from hetcompile.migrate.run import write_secret
from hetcompile.plan.routing import SECRET_FILES


@dataclass(frozen=True)
class Deployment:
    """A deploy's Rollout and what it was computed from."""

    out: Path
    rollout: Rollout
    record: Record
    hashes: dict[str, str]  # new replica id -> task hash
    clusters: dict[str, str]  # new replica id -> the cluster that serves it once converged
    status: dict[str, str]  # `sky status` when planned
    router_up: bool


def _empty_like(plan: PlanDoc) -> PlanDoc:
    """The plan of a fleet that runs nothing (a first deploy): no replicas, the new plan's workloads."""
    return plan.model_copy(update={"replicas": (), "nodes": ()})


def deploy_plan(out: Path, env: dict[str, str]) -> Deployment:
    new = read_plan(out, "plan")
    out = out if out.is_dir() else out.parent
    mixed = [r.id for r in new.replicas if r.mixed]
    if mixed:
        raise DeployError(f"`hetcompile deploy` does not handle mixed-GPU Job Groups yet ({', '.join(mixed)})",
                           hint=f"{out}/deploy.sh launches such a plan with `sky jobs launch`; {out}/teardown.sh cancels it")
    name = new.plan
    record = Record.load(out)
    if record.plan is not None and record.plan != name and any(True for _ in record.clusters):
        raise DeployError(f"{out} was deployed as plan {record.plan}; this build is plan {name}",
                           hint=f"tear the old one down first (`hetcompile teardown {out}`), or build the new plan into "
                                "another folder and roll it out with `hetcompile migrate OLD NEW`")
    status = sky_status(out, env)
    up = {c for c, s in status.items() if s == "UP"}
    applied_dir = out / APPLIED
    old = read_plan(applied_dir, "applied plan") if (applied_dir / "plan.json").exists() else _empty_like(new)

    hashes = {r.id: task_hash(out, r.id) for r in new.replicas}
    notes: list[str] = []
    old_cluster: dict[str, str] = {}
    running_old = []
    for r in old.replicas:
        c = record.applied.get(r.id)
        if c is not None and c in up:
            old_cluster[r.id] = c
            running_old.append(r)
        else:
            notes.append(f"applied {r.id} ({c or 'no cluster recorded'}) is not running (sky status): launched anew")
    old = old.model_copy(update={"replicas": tuple(running_old)})  # a subset of its own, already validated replicas
    old_hash = {rid: e.hash if (e := record.clusters.get(c)) is not None else None for rid, c in old_cluster.items()}

    news = {r.id: r for r in new.replicas}
    untouched, changed, added, removed = [], [], [], []
    for o in sorted(old.replicas, key=lambda r: natural_key(r.id)):
        n = news.get(o.id)
        if n is not None and old_hash[o.id] == hashes[n.id]:
            untouched.append((o, n, False))
        elif n is not None:
            changed.append((o, n))
        else:
            removed.append(o)
    paired = {n.id for _, n, _ in untouched} | {n.id for _, n in changed}
    added = [n for rid, n in sorted(news.items(), key=lambda kv: natural_key(kv[0])) if rid not in paired]
    mig = plan_migration(old, new, untouched, changed, added, removed)

    # new clusters: keep one already launched with this hash; else the plain name unless it runs
    taken = set(status) | set(old_cluster.values())
    restarted = {s.unit.id_on("new"): old_cluster[s.replaces.id_on("old")] for s in mig.steps
                 if s.action == "restart" and s.unit is not None and s.replaces is not None}
    clusters: dict[str, str] = {}
    for rid, h in hashes.items():
        if rid in restarted:
            clusters[rid] = restarted[rid]
            continue
        if rid in old_cluster and old_hash[rid] == h:
            clusters[rid] = old_cluster[rid]
            continue
        c = record.cluster_of(rid, h)
        if c is not None and c in up:
            clusters[rid] = c
        elif f"{name}-{rid}" not in taken:
            clusters[rid] = f"{name}-{rid}"
        else:
            clusters[rid] = f"{name}-{rid}-{h[:6]}"

    def names(side: str, rid: str) -> str:
        return old_cluster[rid] if side == "old" else clusters[rid]

    # the router this folder's record names and sky runs (after `migrate OLD NEW` to a renamed plan,
    # OLD's: clients keep their endpoint), else the plan's own name
    router_cluster = next((c for c, e in sorted(record.clusters.items()) if e.replica == ROUTER and c in up),
                          f"{name}-router")
    router_port = _port(_task(out, "router"), f"{out}/sky/router.yaml")
    ro = rollout_from(old, new, applied_dir, out, mig, names, router_cluster=router_cluster, router_port=router_port,
                      notes=tuple(notes), work="deploy", command=f"hetcompile deploy {out}", secrets_dir=out,
                      key_extra=" ".join(f"{k}={v}" for k, v in sorted(clusters.items())))
    actions = list(ro.actions)
    final_running = tuple(sorted(clusters.values(), key=natural_key))
    router_up = router_cluster in up
    was = applied_dir / "sky" / "router.yaml"
    if router_up and was.exists() and was.read_bytes() != (out / "sky" / "router.yaml").read_bytes():
        # tables reach the running router with `sky exec`; relaunching it would move the endpoint clients use
        notes.append(f"the router's task (sky/router.yaml) changed; {router_cluster} keeps running as launched "
                     f"(to move it: `hetcompile teardown {out}`, then deploy)")
    if not actions and new.replicas and (not router_up or _unfilled(out)):
        # the fleet is right but the router is not (never started, gone) or OUT's table was rebuilt:
        # one route step (re)starts it or pushes the plan's table with the running endpoints
        actions.append(_final_route(out, new, clusters, final_running))
    # clusters of this plan that serve nothing once converged: recorded ones and unrecorded ones
    keep = set(clusters.values()) | {router_cluster} | set(old_cluster.values())
    stray = sorted({c for c, e in record.clusters.items() if c not in keep and e.replica != ROUTER and c in status}
                   | set(c for c in legacy_clusters(name, status, record) if c not in keep), key=natural_key)
    for c in stray:
        actions.append(Action(len(actions) + 1, "teardown", f"tear down {c} (not part of plan {name})", c,
                              ("sky", "down", "-y", c), running=final_running))
    if stray:
        notes.append(f"{len(stray)} cluster(s) of this plan serve no replica of it: {', '.join(stray)}")
    # the journal's steps are this exact list from this exact fleet: a re-run that finds the fleet
    # changed (a teardown done, a launch recorded) plans afresh from it instead of skipping by index
    key = "\n".join([*(f"{a.index} {a.kind} {a.cluster} {' '.join(a.argv)} {a.text}" for a in actions),
                      *(f"old {k}={v}" for k, v in sorted(old_cluster.items())), ro.key_extra])
    ro = dataclasses.replace(ro, actions=tuple(actions), notes=tuple(notes), key_extra=key)
    return Deployment(out, ro, record, hashes, clusters, status, router_up)


def _unfilled(out: Path) -> bool:
    """Whether OUT's routing table lacks an endpoint (a rebuild writes it without them)."""
    try:
        return any(r.endpoint is None for r in _table(out).replicas)
    except RolloutError:
        return True


def _final_route(out: Path, new: PlanDoc, clusters: dict[str, str], running: tuple[str, ...]) -> Action:
    rt: RoutingTable = _table(out)
    eps = tuple((r.id, clusters[r.id], _port(_task(out, r.id), f"{out}/sky/{r.id}.yaml"))
                for r in sorted(rt.replicas, key=lambda x: natural_key(x.id)))
    table = rt.model_copy(update={"replicas": tuple(r.model_copy(update={"endpoint": None}) for r in rt.replicas)})
    return Action(1, "route", f"write the plan's routing table ({new.plan})", None, table=table, endpoints=eps,
                  running=running, final=True)


def recorder(d: Deployment):
    """The executor's after-step hook: the record follows every launch and teardown, at once."""
    rec, out = d.record, d.out
    rec.plan = d.rollout.new_plan
    by_cluster = {c: rid for rid, c in d.clusters.items()}

    def after(a: Action) -> None:
        if a.kind == "launch" and a.cluster == d.rollout.router_cluster:
            rec.clusters[a.cluster] = Launched(ROUTER)
        elif a.kind in ("launch", "restart") and a.cluster is not None:  # a restart: the cluster now runs the new task
            rid = a.rid or by_cluster.get(a.cluster)
            rec.clusters[a.cluster] = Launched(rid, d.hashes.get(rid) if rid is not None else None)
        elif a.kind == "teardown" and a.cluster is not None:
            rec.clusters.pop(a.cluster, None)
        else:
            return
        rec.save(out)

    return after


def converged(d: Deployment) -> None:
    """After every step succeeded: OUT's plan is the applied one, served by `d.clusters`."""
    out, rec = d.out, d.record
    rec.plan = d.rollout.new_plan
    for rid, c in d.clusters.items():  # kept clusters were recorded by an earlier run
        rec.clusters.setdefault(c, Launched(rid, d.hashes[rid]))
    rec.applied = dict(d.clusters)
    applied = out / APPLIED
    tmp = applied.with_name("applied.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "sky").mkdir(parents=True)
    (tmp / "router").mkdir()
    shutil.copy2(out / "plan.json", tmp / "plan.json")
    for f in (out / "sky").glob("*.yaml"):
        shutil.copy2(f, tmp / "sky" / f.name)
    shutil.copy2(out / "router" / "routing.json", tmp / "router" / "routing.json")
    shutil.rmtree(applied, ignore_errors=True)
    tmp.replace(applied)
    rec.save(out)


def adopt(ro: Rollout) -> dict[str, str]:
    """After `migrate OLD NEW` converged: NEW's deploy record lists the clusters that now serve NEW's
    plan (untouched and restarted replicas on OLD's cluster names, launched ones on NEW's), each with
    NEW's task hash, and NEW's plan as the applied one, so that a later `deploy NEW` (a rebuild into
    NEW) keeps them instead of seeing unrecorded clusters and launching the plan again beside them.
    Returns {replica id: cluster}."""
    new = read_plan(ro.new_dir, "new plan")
    final = next((a for a in reversed(ro.actions) if a.kind == "route" and a.final), None)
    if final is not None:
        clusters = {tid: c for tid, c, _ in final.endpoints}
    else:  # nothing moved: every replica is an untouched one, on the old plan's cluster
        clusters = {u.new: f"{ro.old_plan}-{u.old}" for u in ro.migration.untouched if u.new is not None}
    clusters = {r.id: clusters[r.id] for r in new.replicas if r.id in clusters}
    hashes = {rid: task_hash(ro.new_dir, rid) for rid in clusters}
    rec = Record.load(ro.new_dir)
    rec.plan = new.plan
    for rid, c in clusters.items():  # overwrites what an earlier deploy of NEW recorded for these names
        rec.clusters[c] = Launched(rid, hashes[rid])
    rec.clusters[ro.router_cluster] = Launched(ROUTER)
    # the fleet that now serves NEW holds OLD's replica key and router token: NEW's folder keeps them,
    # so a later `deploy NEW` reaches the router and launches replicas the router can call
    src = ro.secrets_dir or ro.old_dir
    if src.resolve() != ro.new_dir.resolve():
        for name in SECRET_FILES.values():
            if (src / name).is_file():
                write_secret(ro.new_dir / name, (src / name).read_text())
    converged(Deployment(ro.new_dir, ro, rec, hashes, clusters, {}, True))
    return clusters


def teardown(out: Path, env: dict[str, str], log, warn) -> int:
    """`hetcompile teardown OUT`: `sky down` every cluster of this folder's plan that sky lists: the
    record's (whatever plan built them), the router, the plan's own names and unrecorded replicas
    of its name. Every down runs; any that fails is named (it may still bill) and exits 1."""
    import subprocess

    record = Record.load(out)
    try:
        plan = read_plan(out, "plan")
    except Exception:  # noqa: BLE001 - a folder whose plan.json is gone still has its record
        plan = None
    name = record.plan or (plan.plan if plan else None)
    if name is None:
        raise DeployError(f"{out} has neither a deploy record nor a plan.json: nothing says which clusters are its own")
    status = sky_status(out, env)
    mine = set(record.clusters) | {f"{name}-router"} | set(legacy_clusters(name, status, record))
    mine |= {f"{name}-{r.id}" for r in (plan.replicas if plan and plan.plan == name else ())}
    router = f"{name}-router"
    targets = sorted((c for c in mine if c in status), key=lambda c: (c != router, natural_key(c)))
    failed = []
    for c in targets:  # the router first: clients stop reaching replicas that are about to go
        p = subprocess.run(["sky", "down", "-y", c], cwd=out, env=env, check=False)
        if p.returncode != 0:
            failed.append(c)
            continue
        record.clusters.pop(c, None)
        record.plan = name
        record.save(out)
        log(f"{c}: down")
    if failed:
        warn(f"teardown FAILED for {len(failed)} cluster(s); they may still be running and billing:")
        for c in failed:
            warn(f"  {c} (sky down -y {c})")
        return 1
    record.applied = {}
    shutil.rmtree(out / APPLIED, ignore_errors=True)
    (out / "deploy" / "state.json").unlink(missing_ok=True)
    record.plan = name
    record.save(out)
    log(f"teardown: all {len(targets)} cluster(s) of plan {name} are down")
    return 0
