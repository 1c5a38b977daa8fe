"""Shared pytest options: `--update-golden` rewrites golden files instead of comparing."""

from __future__ import annotations

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
