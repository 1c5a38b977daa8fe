"""A recording stand-in for the `sky` CLI (SkyPilot 0.14), for deploy/teardown tests.

`install(bin_dir, state_dir)` writes an executable `sky` into bin_dir that runs this module.
Every call is appended as one JSON line (argv) to state_dir/calls.jsonl. Behaviour, per cluster:
- `sky launch ... -c NAME TASK`: fails (exit 1) when NAME is listed in state_dir/fail_launch,
  else records NAME as UP in state_dir/clusters.json and keeps the task it got as
  state_dir/launched/NAME.yaml (what the cluster runs). When NAME is listed in state_dir/kill_after,
  it then kills the process that called it (SIGKILL: a deploy killed between two steps).
- `sky jobs launch ... TASK`: records the job group; fails when its task path is in fail_launch.
- `sky down -y NAME...`: fails when a NAME is in state_dir/fail_down, else removes it.
- `sky jobs cancel -y -n NAME`: fails when NAME is in fail_down.
- `sky status [--endpoint PORT NAME]`: a table of UP clusters / `127.0.0.1:PORT`.
- `sky check CLOUD...`: like SkyPilot 0.14.1, exits 0 and prints `  Name: enabled [compute]` per
  cloud, or `  Name: disabled` (with ANSI dim codes) for a cloud listed in state_dir/fail_check.
- `sky status --endpoint PORT NAME`: state_dir/endpoint_default ("host:port") for every cluster
  when present (tests point it at a local /health server).
- `--secret NAME` (launch, jobs launch, exec): like SkyPilot, takes NAME's value from the
  environment; an unset or empty NAME fails the call (exit 1) before anything is recorded as UP.
- `sky exec NAME TASK ...`: fails when NAME is not UP or is in fail_exec; else copies the task's
  `workdir` (relative to the cwd) to state_dir/exec/<n>/, n = 1, 2, ... (what the cluster got).
  A task with a `run` and no workdir (a replica's task, restarted in place) becomes what NAME runs:
  it replaces state_dir/launched/NAME.yaml, and NAME's job is no longer cancelled.
- `sky cancel -y -a NAME`: fails when NAME is not UP; else NAME's jobs are cancelled (state_dir/
  cancelled lists it) until the next exec of a replica task.
- `sky status --endpoint PORT NAME`: state_dir/endpoints.json {NAME: "host:port"} overrides.
- state_dir/launch_delay (seconds): every `sky launch` first sleeps that long, outside the lock
  that serializes the calls, and appends [NAME, start, end] to state_dir/launch_windows.jsonl
  (whether a deploy launches at the same time).
The fail_* files hold one name per line.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path


def install(bin_dir: Path, state_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    sky = bin_dir / "sky"
    sky.write_text(
        f"#!/bin/sh\nHC_STUB_SKY_STATE={str(state_dir)!r} exec {sys.executable!r} -m hetcompile.testing.stub_sky \"$@\"\n"
    )
    sky.chmod(0o755)
    return sky


def _names(state: Path, name: str) -> set[str]:
    p = state / name
    return set(p.read_text().split("\n")) - {""} if p.exists() else set()


def _set_cancelled(state: Path, name: str, on: bool) -> None:
    names = _names(state, "cancelled")
    names = names | {name} if on else names - {name}
    (state / "cancelled").write_text("".join(f"{n}\n" for n in sorted(names)))


def main(argv: list[str]) -> int:
    state = Path(os.environ["HC_STUB_SKY_STATE"])
    window = None
    delay = state / "launch_delay"
    if argv[:1] == ["launch"] and delay.exists():  # provisioning takes a while, outside the lock
        import time

        t0 = time.time()
        time.sleep(float(delay.read_text()))
        window = (t0, time.time())
    # deploy.sh launches in parallel: one call at a time, so clusters.json has no lost updates
    with (state / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if window is not None:
            with (state / "launch_windows.jsonl").open("a") as f:
                f.write(json.dumps([argv[argv.index("-c") + 1], *window]) + "\n")
        return _locked(state, argv)


class _Exit(Exception):
    """A command that ends early: its exit code, clusters.json left as it was."""

    def __init__(self, code: int) -> None:
        self.code = code


def _locked(state: Path, argv: list[str]) -> int:
    with (state / "calls.jsonl").open("a") as f:
        f.write(json.dumps(argv) + "\n")
    cpath = state / "clusters.json"
    clusters: dict[str, str] = json.loads(cpath.read_text()) if cpath.exists() else {}
    for i, a in enumerate(argv[:-1]):
        if a == "--secret" and "=" not in argv[i + 1] and not os.environ.get(argv[i + 1]):
            print(f"sky: --secret {argv[i + 1]}: not set in the environment", file=sys.stderr)
            return 1
    command = _COMMANDS.get(tuple(argv[:2])) or _COMMANDS.get(tuple(argv[:1]))
    if command is None:
        print(f"stub sky: unsupported {argv}", file=sys.stderr)
        return 2
    try:
        rc = command(state, argv, clusters)
    except _Exit as e:
        return e.code
    cpath.write_text(json.dumps(clusters, sort_keys=True))
    return rc


def _launch(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    name = argv[argv.index("-c") + 1]
    if name in _names(state, "fail_launch"):
        print(f"sky launch: stub failure for {name}", file=sys.stderr)
        raise _Exit(1)
    clusters[name] = "UP"
    task = next((a for a in argv[argv.index("-c") + 2:] if a.endswith((".yaml", ".yml"))), None)
    if task is not None:
        (state / "launched").mkdir(exist_ok=True)
        (state / "launched" / f"{name}.yaml").write_bytes(Path(task).read_bytes())
    if name in _names(state, "kill_after"):
        (state / "clusters.json").write_text(json.dumps(clusters, sort_keys=True))
        import signal

        os.kill(os.getppid(), signal.SIGKILL)
    return 0


def _jobs_launch(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    task = argv[-1]
    if task in _names(state, "fail_launch"):
        raise _Exit(1)
    clusters[task] = "JOB"
    return 0


def _down(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    rc = 0
    for name in [a for a in argv[1:] if not a.startswith("-")]:
        if name in _names(state, "fail_down"):
            print(f"sky down: stub failure for {name}", file=sys.stderr)
            rc = 1
        else:
            clusters.pop(name, None)
    return rc


def _jobs_cancel(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    return 1 if argv[argv.index("-n") + 1] in _names(state, "fail_down") else 0


def _status(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    if "--endpoint" in argv:
        i = argv.index("--endpoint")
        port, name = argv[i + 1], argv[i + 2]
        if clusters.get(name) != "UP":
            raise _Exit(1)
        eps = json.loads((state / "endpoints.json").read_text()) if (state / "endpoints.json").exists() else {}
        default = state / "endpoint_default"
        print(eps.get(name, default.read_text().strip() if default.exists() else f"127.0.0.1:{port}"))
        return 0
    wanted = [a for a in argv[1:] if not a.startswith("-")]
    print("NAME  INFRA  STATUS")
    for name, st in sorted(clusters.items()):
        if not wanted or name in wanted:
            print(f"{name}  stub  {st}")
    return 0


def _exec(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    name, task = argv[1], argv[2]
    if clusters.get(name) != "UP" or name in _names(state, "fail_exec"):
        print(f"sky exec: stub failure for {name}", file=sys.stderr)
        raise _Exit(1)
    import shutil

    import yaml

    doc = yaml.safe_load(Path(task).read_text()) or {}
    workdir = doc.get("workdir")
    if doc.get("run") and not workdir:
        (state / "launched").mkdir(exist_ok=True)
        (state / "launched" / f"{name}.yaml").write_bytes(Path(task).read_bytes())
        _set_cancelled(state, name, False)
    runs = state / "exec"
    n = len(list(runs.iterdir())) + 1 if runs.exists() else 1
    dest = runs / str(n)
    if workdir:
        shutil.copytree(workdir, dest)
    else:
        dest.mkdir(parents=True)
    return 0


def _cancel(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    name = next((a for a in argv[1:] if not a.startswith("-")), None)
    if name is None or clusters.get(name) != "UP":
        print(f"sky cancel: cluster {name} is not UP", file=sys.stderr)
        raise _Exit(1)
    _set_cancelled(state, name, True)
    return 0


def _check(state: Path, argv: list[str], clusters: dict[str, str]) -> int:
    print("Checking credentials to enable infra for SkyPilot.")
    for c in argv[1:]:
        if c in _names(state, "fail_check"):
            print(f"\x1b[2m  {c.upper()}: disabled \x1b[0m\n    Reason: stub has no credentials for {c}")
        else:
            print(f"  {c.upper()}: enabled [compute]")
    return 0


# `sky` subcommands the stub answers, by their first one or two words
_COMMANDS = {("launch",): _launch, ("jobs", "launch"): _jobs_launch, ("down",): _down, ("jobs", "cancel"): _jobs_cancel,
             ("status",): _status, ("exec",): _exec, ("cancel",): _cancel, ("check",): _check}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
