"""Deploy's preflight: everything that can fail before anything is launched, checked first.

`sky` on PATH; HF_TOKEN set (the replicas download weights with it); the hetcompile the router
task installs (HETCOMPILE_SRC: a source checkout or a .whl; default the checkout of this
hetcompile) exists; credentials for every cloud of the plan (`sky check CLOUD...` exits 0 even
when a cloud is disabled, SkyPilot 0.14.1 observed, so its "  Name: enabled" lines are read;
HC_SKIP_SKY_CHECK=1 skips). The replicas' key and the router token are generated once into OUT
(mode 600) unless the environment has them, and reach sky by name only (`--secret NAME`).
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from hetcompile.migrate.run import write_secret
from hetcompile.plan.routing import SECRET_FILES


class PreflightFailed(Exception):
    """What is missing, as the one line deploy prints (exit 2, nothing launched)."""


def check_tools(env: dict[str, str]) -> None:
    if shutil.which("sky", path=env.get("PATH")) is None:
        raise PreflightFailed("'sky' is not on PATH (pip install 'skypilot==0.14.*')")
    if not env.get("HF_TOKEN"):
        raise PreflightFailed("set HF_TOKEN (a Hugging Face token; the replicas get it as a SkyPilot secret to "
                              "download weights)")


def hetcompile_src(env: dict[str, str]) -> Path:
    src = env.get("HETCOMPILE_SRC", "")
    if not src:
        import hetcompile

        root = Path(hetcompile.__file__).resolve().parent.parent
        if not (root / "pyproject.toml").is_file():
            raise PreflightFailed("set HETCOMPILE_SRC to a hetcompile source checkout or a built .whl (the installed "
                                  "hetcompile has no source tree)")
        return root
    if not Path(src).exists():
        raise PreflightFailed(f"HETCOMPILE_SRC={src} does not exist")
    return Path(src).resolve()


def router_wheel(out: Path, src: Path) -> None:
    """OUT/router/dist/ holds the one wheel the router task installs (`pip install dist/*.whl`)."""
    dist = out / "router" / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir(parents=True)
    if src.suffix == ".whl":
        shutil.copy2(src, dist / src.name)
        return
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise PreflightFailed(f"cannot build a wheel from {src}: {p.stderr.strip()[-300:]}")


def check_clouds(clouds: list[str], cwd: Path, env: dict[str, str]) -> None:
    if env.get("HC_SKIP_SKY_CHECK") or not clouds:
        return
    p = subprocess.run(["sky", "check", *clouds], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    text = re.sub(r"\x1b\[[0-9;]*m", "", p.stdout + p.stderr)
    missing = [c for c in clouds if not re.search(rf"^ *{re.escape(c)}: enabled", text, re.I | re.M)]
    if missing:
        raise PreflightFailed(f"no usable credentials for: {' '.join(missing)} (`sky check {' '.join(missing)}` says why); "
                              "nothing was launched")


def ensure_secrets(out: Path, env: dict[str, str]) -> None:
    """HC_VLLM_API_KEY and HC_ROUTER_TOKEN: from the environment, else OUT/<file>, else new (mode 600).
    Running replicas hold the key, so a file once written is reused by every later deploy."""
    for var, name in sorted(SECRET_FILES.items()):
        if env.get(var):
            continue
        f = out / name
        if not (f.is_file() and f.read_text().strip()):
            write_secret(f, secrets.token_urlsafe(32) + "\n")
        env[var] = f.read_text().strip()
