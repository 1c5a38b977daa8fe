"""The one executor of deploy and migrate: a Rollout's actions, one at a time, a status line
each, stop at the first failure.

launch    `sky launch` unless `sky status` lists the cluster UP; then wait for GET <endpoint>/health
route     fill the table's endpoints (`sky status --endpoint`), write it, push it to the router
          (`sky launch` of the router task with the table when no router runs yet: a first deploy)
drain     the same with the unit left out, then wait until the replica's vLLM /metrics shows no
          request running or waiting (`vllm:num_requests_running` + `_waiting`), at most --drain
          seconds; when /metrics cannot be read it waits the whole --drain
teardown  `sky down -y` unless `sky status` no longer lists the cluster
restart   `sky cancel -y -a` (stop the drained replica's vLLM job) and `sky exec -d` of the new task on
          the same cluster (no provisioning, no setup), then wait for GET <endpoint>/health

Consecutive launches (and consecutive teardowns) do not depend on each other: the planner put them
next to each other because what runs before and after the run of them is capacity-safe either way.
They run at the same time, at most `parallel` at once (`--parallel`, default 8), each waited on for
its health; a first deploy then takes about one launch's time, not one per replica. A failure in
such a run lets the others finish (a half-started `sky launch` is worse than a finished one), marks
the ones that succeeded done, and reports the first failure.

NEW/<work>/state.json (work: migrate or deploy) records the steps done (for this pair of plans and
the clusters chosen); a re-run skips them, and
launch/teardown also skip what `sky status` shows already done, so re-running after a failure,
or after fixing something by hand, is safe. On a failure it prints what runs, what the router
serves, and how to continue or clean up, and returns 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from hetcompile.plan.canon import dumps_json
from hetcompile.router.health import parse_vllm_metrics
from hetcompile.migrate.actions import ROUTER_SECRETS, ROUTER_TOKEN_ENV, Action, Rollout, reload_paths
from hetcompile.migrate.gaps import capacity_gaps, gap_text
from hetcompile.plan.routing import SECRET_FILES

# secrets deploy.sh generated into the old build directory (mode 600, plan/routing.SECRET_FILES): a re-run reuses them


def write_secret(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only (mode 600 from creation, also over an older file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


class StepFailed(Exception):
    pass


def http_ok(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - an endpoint sky printed
            return r.status == 200
    except (OSError, ValueError):
        return False


def in_flight(url: str, headers: dict[str, str], timeout: float = 5.0) -> float | None:
    """Requests a vLLM server is running or holding in its queue, from its /metrics (None: unreadable)."""
    try:
        req = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - an endpoint sky printed
            g = parse_vllm_metrics(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    if g.running is None and g.waiting is None:
        return None
    return (g.running or 0.0) + (g.waiting or 0.0)


DRAIN_POLL_S = 2.0  # between /metrics reads while draining


class Runner:
    def __init__(self, ro: Rollout, *, env: dict[str, str] | None = None, probe: Callable[[str], bool] = http_ok,
                 health_timeout: float = 1200.0, poll: float = 10.0, drain_s: float = 60.0,
                 log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                 inflight: Callable[[str, dict[str, str]], float | None] = in_flight,
                 after: Callable[[Action], None] | None = None, allow_gap: bool = False, parallel: int = 8):
        self.ro, self.probe, self.log, self.sleep, self.inflight = ro, probe, log, sleep, inflight
        self.allow_gap, self.parallel = allow_gap, max(1, int(parallel))
        self.lock = threading.Lock()  # the journal, the record hook and the log, from parallel launches
        self.after = None if after is None else self._locked(after)
        self.reload_task, self.reload_dir = reload_paths(ro.work)
        self.env = dict(os.environ if env is None else env)
        self.health_timeout, self.poll, self.drain_s = health_timeout, poll, drain_s
        self.journal = ro.new_dir / ro.work / "state.json"
        old_plan = ro.old_dir / "plan.json"
        self.key = hashlib.sha256(((old_plan.read_bytes() if old_plan.exists() else b"") + b"\0" +
                                   (ro.new_dir / "plan.json").read_bytes() + b"\0" +
                                   ro.key_extra.encode())).hexdigest()[:16]

    def _locked(self, fn: Callable[[Action], None]) -> Callable[[Action], None]:
        def call(a: Action) -> None:
            with self.lock:
                fn(a)
        return call

    # -- sky -------------------------------------------------------------------------------
    def sky(self, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(["sky", *args], cwd=self.ro.new_dir, env=self.env, text=True,
                              capture_output=capture, check=False)

    def listed(self, cluster: str) -> str | None:
        """The status `sky status CLUSTER` shows for it (UP, INIT, STOPPED, ...), None when not listed."""
        p = self.sky("status", cluster, capture=True)
        for line in p.stdout.splitlines():
            f = line.split()
            if f and f[0] == cluster:
                return next((x for x in f[1:] if x in ("UP", "INIT", "STOPPED", "JOB")), f[-1])
        return None

    def endpoint(self, cluster: str, port: int) -> str:
        p = self.sky("status", "--endpoint", str(port), cluster, capture=True)
        ep = (p.stdout.strip().splitlines() or [""])[-1].strip()
        if p.returncode != 0 or not ep:
            raise StepFailed(f"no endpoint for {cluster} port {port} (`sky status --endpoint {port} {cluster}` "
                             f"exited {p.returncode}: {p.stderr.strip()[-300:]})")
        return ep if ep.startswith(("http://", "https://")) else f"http://{ep}"

    # -- journal ---------------------------------------------------------------------------
    def done(self) -> set[int]:
        try:
            j = json.loads(self.journal.read_text())
        except (OSError, ValueError):
            return set()
        return set(j.get("done", [])) if j.get("key") == self.key else set()

    def mark(self, index: int) -> None:
        with self.lock:
            d = self.done() | {index}
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            self.journal.write_text(dumps_json({"key": self.key, "done": sorted(d)}))

    # -- steps -----------------------------------------------------------------------------
    def preflight(self) -> list[str]:
        problems = []
        if shutil.which("sky", path=self.env.get("PATH")) is None:
            problems.append("'sky' is not on PATH (pip install 'skypilot==0.14.*')")
        needed = {ROUTER_TOKEN_ENV}
        for a in self.ro.actions:
            needed |= {a.argv[i + 1] for i, x in enumerate(a.argv[:-1]) if x == "--secret"}
        for k in sorted(needed):
            if self.env.get(k):
                continue
            f = (self.ro.secrets_dir or self.ro.old_dir) / SECRET_FILES.get(k, "")
            if k in SECRET_FILES and f.is_file() and f.read_text().strip():
                self.env[k] = f.read_text().strip()
            else:
                where = f" or in {f}" if k in SECRET_FILES else ""
                problems.append(f"{k} is not set in the environment{where}")
        return problems

    def launch(self, a: Action) -> str:
        st = self.listed(a.on)
        if st == "UP":
            how = "already UP, not relaunched"
        else:
            if self.after is not None:  # write-ahead: it may bill once `sky launch` starts, so deploy records it first
                self.after(a)
            if self.sky(*a.argv[1:]).returncode != 0:
                raise StepFailed(f"`{' '.join(a.argv)}` failed")
            how = "launched"
        self.healthy(a)
        return f"{how}, healthy"

    def healthy(self, a: Action) -> None:
        url = self.endpoint(a.on, a.port) + "/health"
        t0 = time.monotonic()
        while not self.probe(url):
            if time.monotonic() - t0 >= self.health_timeout:
                raise StepFailed(f"{a.cluster} not healthy after {self.health_timeout:g}s (GET {url}); "
                                 f"its logs: sky logs {a.cluster}")
            self.sleep(self.poll)

    def restart(self, a: Action) -> str:
        """Stop the cluster's jobs (the drained old vLLM), run the new task on it, wait for health.
        A re-run after a failure does both again: cancelling nothing and starting the task again is safe."""
        if self.listed(a.on) != "UP":
            raise StepFailed(f"{a.cluster} is not UP (sky status): nothing to restart in place; "
                             "rebuild with --previous or tear it down and deploy")
        for argv, what in ((a.stop, "stop"), (a.argv, "start")):
            if self.sky(*argv[1:]).returncode != 0:
                raise StepFailed(f"`{' '.join(argv)}` failed ({what}); its logs: sky logs {a.cluster}")
        self.healthy(a)
        return "restarted with the new engine args, healthy"

    def route(self, a: Action) -> str:
        eps, gone = {}, set()
        for tid, c, port in a.endpoints:
            # a re-run without the journal: a replica a later step tears down may be down already;
            # it leaves the table a little early (anything else missing is a failure)
            if tid in a.leaving and self.listed(c) is None:
                gone.add(tid)
                continue
            eps[tid] = self.endpoint(c, port)
        table = a.routing
        if gone:
            models = tuple(m.model_copy(update={"classes": tuple(
                c.model_copy(update={"weights": tuple(w for w in c.weights if w.replica not in gone)}) for c in m.classes)})
                for m in table.models)
            table = table.model_copy(update={"models": models,
                                             "replicas": tuple(r for r in table.replicas if r.id not in gone)})
        reps = tuple(r.model_copy(update={"endpoint": eps[r.id]}) for r in table.replicas)
        text = dumps_json(table.model_copy(update={"replicas": reps}).model_dump(mode="json"))
        d = self.ro.new_dir / self.reload_dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "routing.json").write_text(text)
        if a.final:  # NEW/router/routing.json now names the endpoints, as after deploy.sh
            (self.ro.new_dir / "router" / "routing.json").write_text(text)
        left = f" ({', '.join(sorted(gone))} already down)" if gone else ""
        rc = self.router_cluster_up(text)
        if rc is not None:
            return f"router launched ({rc}) serving {', '.join(sorted(eps)) or 'nothing'}{left}"
        p = self.sky("exec", self.ro.router_cluster, self.reload_task, "--secret", ROUTER_TOKEN_ENV)
        if p.returncode != 0:
            raise StepFailed(f"the router did not take the table (`sky exec {self.ro.router_cluster} {self.reload_task}` "
                             f"exited {p.returncode}; its logs: sky logs {self.ro.router_cluster})")
        return f"router serves {', '.join(sorted(eps)) or 'nothing'}{left}"

    def router_cluster_up(self, text: str) -> str | None:
        """Launch the router with `text` as its table when no router runs (a first deploy, or one
        that went down); None when it runs (the table is then pushed with `sky exec`)."""
        if self.listed(self.ro.router_cluster) == "UP":
            return None
        # the router task's workdir is NEW/router: it starts on the table written there
        (self.ro.new_dir / "router" / "routing.json").write_text(text)
        argv = ("launch", "-y", "-d", "-c", self.ro.router_cluster, self.ro.router_task,
                *[a for k in ROUTER_SECRETS for a in ("--secret", k)])
        if self.after is not None:  # recorded before it can bill, as a replica's launch
            self.after(Action(0, "launch", "router", self.ro.router_cluster, ("sky", *argv)))
        if self.sky(*argv).returncode != 0:
            raise StepFailed(f"`sky {' '.join(argv)}` failed; its logs: sky logs {self.ro.router_cluster}")
        return self.ro.router_cluster

    def drain(self, a: Action) -> str:
        """Route without the unit, then wait for its in-flight requests: until its vLLM reports none
        running or waiting, at most drain_s seconds of waiting (counted in the sleeps, so a test's
        clock is its own). Past the limit the migration goes on and says how many were left."""
        out = self.route(a)
        if self.drain_s <= 0:
            return f"{out}; no wait for in-flight requests (--drain 0)"
        if a.cluster is None or not a.port or self.listed(a.cluster) is None:
            return f"{out}; {a.cluster} is not running: nothing in flight"
        url = self.endpoint(a.cluster, a.port) + "/metrics"
        key = self.env.get("HC_VLLM_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        waited = 0.0
        while True:
            n = self.inflight(url, headers)
            if n == 0:
                return f"{out}; drained: no request in flight after {waited:g}s"
            if waited >= self.drain_s:
                left = f"{n:g} request(s) still in flight" if n is not None else f"in-flight count unknown (no {url})"
                return f"{out}; {left} after the {self.drain_s:g}s drain limit, going on"
            step = min(DRAIN_POLL_S, self.drain_s - waited)
            self.sleep(step)
            waited += step

    def teardown(self, a: Action) -> str:
        if self.listed(a.on) is None:
            return "already down"
        if self.sky(*a.argv[1:]).returncode != 0:
            raise StepFailed(f"`{' '.join(a.argv)}` failed; {a.cluster} may still be running and billing")
        return "down"

    # -- the whole migration ---------------------------------------------------------------
    def run(self) -> int:
        ro = self.ro
        n = len(ro.actions)
        w = ro.work
        self.log(f"{w} {ro.old_plan} -> {ro.new_plan}: {ro.migration.mode}, {n} step(s)")
        for note in ro.notes:
            self.log(f"  note: {note}")
        if n == 0:
            self.log("nothing to do: the new plan deploys exactly what runs")
            return 0
        gaps = capacity_gaps(ro)
        if gaps and not self.allow_gap:
            for g in gaps:
                self.log(f"{w}: refused: {gap_text(g, self.health_timeout)}")
            self.log(f"{w}: nothing was changed (--allow-capacity-gap accepts the gap; a larger budget, or a "
                     "spare replica kept serving, avoids it)")
            return 3
        problems = self.preflight()
        if problems:
            for p in problems:
                self.log(f"{w}: {p}")
            self.log(f"{w}: nothing was changed")
            return 2
        (ro.new_dir / w).mkdir(parents=True, exist_ok=True)
        (ro.new_dir / self.reload_task).write_text(ro.reload_task)
        done = self.done()
        running = ro.running
        for group in self.groups(ro.actions):
            todo = []
            for a in group:
                if a.index in done:
                    self.log(f"[{a.index}/{n}] {a.text}: done in an earlier run, skipped")
                    running = a.running
                else:
                    todo.append(a)
            if not todo:
                continue
            if len(todo) > 1 and self.parallel > 1:
                self.log(f"{len(todo)} {'launches' if todo[0].kind == 'launch' else 'teardowns'} at once "
                         f"(at most {self.parallel}): steps "
                         f"{', '.join(str(a.index) for a in todo)}")
            if len(todo) == 1 or self.parallel == 1:
                results = [self.step(a, n) for a in todo]
            else:
                with ThreadPoolExecutor(max_workers=min(self.parallel, len(todo))) as pool:
                    results = list(pool.map(lambda a: self.step(a, n), todo))
            failures = [(a, why) for a, why in zip(todo, results) if why is not None]
            if failures:
                ok = {a.on for a, why in zip(todo, results) if why is None and a.kind == "launch"}
                gone = {a.on for a, why in zip(todo, results) if why is None and a.kind == "teardown"}
                now = tuple(sorted((set(running) | ok) - gone))
                self.failed(failures[0][0], failures[0][1], now)
                return 1
            running = todo[-1].running
        self.log(f"{w}: done; {ro.new_plan} runs on {', '.join(running)} behind {ro.router_cluster}")
        return 0

    def router_url(self) -> str | None:
        """Where clients reach the router (`sky status --endpoint`), None when it does not run."""
        if self.listed(self.ro.router_cluster) != "UP":
            return None
        try:
            return self.endpoint(self.ro.router_cluster, self.ro.router_port)
        except StepFailed:
            return None

    @staticmethod
    def groups(actions: tuple[Action, ...]) -> list[list[Action]]:
        """Consecutive launches, and consecutive teardowns, together; every other step alone."""
        out: list[list[Action]] = []
        for a in actions:
            if out and a.kind in ("launch", "teardown") and out[-1][-1].kind == a.kind:
                out[-1].append(a)
            else:
                out.append([a])
        return out

    def step(self, a: Action, n: int) -> str | None:
        """Carry out one action; None when it succeeded, else why it failed."""
        self.log(f"[{a.index}/{n}] {a.text} ...")
        try:
            status = getattr(self, a.kind)(a)
        except StepFailed as e:
            return str(e)
        self.mark(a.index)
        if self.after is not None:
            self.after(a)
        self.log(f"[{a.index}/{n}] {a.kind}: {status}")
        return None

    def failed(self, a: Action, why: str, running: tuple[str, ...]) -> None:
        ro = self.ro
        last = max((x.index for x in ro.actions if x.kind in ("route", "drain") and x.index in self.done()), default=None)
        serving = f"the table of step {last}" if last else (f"the old plan's table ({ro.old_plan})" if ro.work == "migrate"
                                                            else "what it served before this run (if it runs)")
        self.log(f"{ro.work} FAILED at step {a.index} ({a.kind}): {why}")
        self.log(f"  running (billing): {', '.join(running) or 'nothing else'}" + (f"; and {a.cluster} may be partly up"
                 if a.kind == "launch" and a.cluster not in running else ""))
        self.log(f"  the router ({ro.router_cluster}) serves {serving}")
        self.log(f"  continue: fix the cause, then re-run `{ro.command}` (steps done are skipped)")
        new = [c for c in ro.incoming if c in running or (a.kind == "launch" and c == a.cluster)]
        if new:
            self.log(f"  or give up on the new plan's replicas: sky down -y {' '.join(new)} "
                     "(once the router routes none of them)")
