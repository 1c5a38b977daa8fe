"""Shared pytest options: `--update-golden` rewrites golden files instead of comparing."""

from __future__ import annotations

import fcntl
import hashlib
import pickle
from pathlib import Path

import pytest

from hetcompile.testing.health import IDLE_METRICS, health_server

ROOT = Path(__file__).resolve().parent.parent
HEALTH: list[str] = []  # "127.0.0.1:PORT" of the session's stand-in replica /health (deploy, migrate tests)


@pytest.fixture(scope="session", autouse=True)
def _health_server():
    """One loopback stand-in replica for the session, stopped at its end: /health, and /metrics as an
    idle vLLM reports it (so a deploy's drains find nothing in flight instead of waiting their limit)."""
    with health_server(lambda: IDLE_METRICS) as addr:
        HEALTH.append(addr)
        yield
    HEALTH.clear()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False, help="rewrite tests/golden/ from current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


# -- one build per spec per test session ----------------------------------------------------------
# Building an example runs the whole compiler and its verification (seconds to a minute); many test
# files need the same plans. `build` compiles once per (spec, the files beside it, options) and hands
# every caller the same frozen IR. A test about the build itself (determinism, logs, errors) calls
# compile_spec directly.
_BUILDS: dict[tuple, object] = {}


def _content_key(path: Path) -> tuple:
    """The bytes a build of `path` can read: the spec and every file in its folder (profiles)."""
    path = Path(path).resolve()
    if path.is_dir():
        return (str(path),)
    files = sorted(p for p in path.parent.iterdir() if p.is_file())
    return (str(path), *((p.name, p.read_bytes()) for p in files))


_SHARED: list[Path] = []  # under xdist, a folder the workers of this run share (set per session below)


@pytest.fixture(scope="session", autouse=True)
def _shared_builds(tmp_path_factory: pytest.TempPathFactory):
    """Under xdist, the run's basetemp (the parent of each worker's popen-gwN, which pytest itself
    prunes after a few runs) holds the builds one worker made for the other: llama70b-pp (27 s) was
    built once per worker that needed it."""
    root = tmp_path_factory.getbasetemp()
    if root.name.startswith("popen-gw"):
        _SHARED.append(root.parent / "builds")
        _SHARED[0].mkdir(exist_ok=True)
    yield
    _SHARED.clear()


def _built_once(key: tuple, spec: Path, options: dict):
    """compile_spec, or the pickle another worker of this run wrote for the same key. Builds are
    deterministic (the same bytes for the same inputs, tests/test_examples.py), so which worker built
    it does not matter; a file lock makes the second worker wait instead of building it again."""
    from hetcompile.driver import compile_spec

    if not _SHARED:
        return compile_spec(Path(spec), **options)
    path = _SHARED[0] / hashlib.sha256(repr(key).encode()).hexdigest()
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return pickle.loads(path.read_bytes())
        result = compile_spec(Path(spec), **options)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(result))
        tmp.replace(path)
        return result


def build(spec: Path, **options):
    """`compile_spec(spec, **options)`, shared by the whole session, across xdist workers too (the
    PipelineResult's IR is frozen)."""
    key = (_content_key(spec), *sorted((k, _content_key(v) if isinstance(v, Path) else v) for k, v in options.items()))
    if key not in _BUILDS:
        _BUILDS[key] = _built_once(key, spec, options)
    return _BUILDS[key]


@pytest.fixture(scope="session")
def example_artifacts():
    """name -> what `hetcompile build examples/<name>` writes (plan.md's pictures and charts included), once per session."""
    from hetcompile.backends.emit import artifacts
    from hetcompile.explain.pictures import pictures

    cache: dict[str, dict[str, str]] = {}

    def get(name: str) -> dict[str, str]:
        if name not in cache:
            cache[name] = artifacts(build(ROOT / "examples" / name / "spec.yaml").ir, pictures)
        return cache[name]

    return get



def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with every file of tests/engine/ in one work unit: the real-vLLM tests run
    one at a time anyway (the lock below), so on two workers a second engine file only made its
    worker wait for the lock (74 s idle in a 10-minute run); as one unit they run back to back on
    one worker while the other runs everything else."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class EngineFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/engine" if nodeid.startswith("tests/engine/") else super()._split_scope(nodeid)

    return EngineFilesTogether(config, log)


@pytest.fixture(autouse=True)
def _one_engine_at_a_time(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The real-vLLM tests (marked `engine`) run one at a time, also under pytest-xdist: two CPU
    engines at once on a 2-core machine starve each other, and startup and the sweeps' timings are
    what these tests exercise. Each holds an exclusive lock on a file every worker of the run shares."""
    if request.node.get_closest_marker("engine") is None:
        yield
        return
    import fcntl

    root = tmp_path_factory.getbasetemp()  # under xdist <run>/popen-gwN: its parent is the run's, shared
    lock = (root.parent if root.name.startswith("popen-gw") else root) / "engine.lock"
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
