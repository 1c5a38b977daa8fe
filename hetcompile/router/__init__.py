"""The bundled router: an OpenAI-compatible reverse proxy in front of a plan's vLLM replicas.

It reads `OUT/router/routing.json` (`hetcompile.plan.routing.RoutingTable`) and picks a replica
per request by the plan's policy: weighted (smooth WRR, Helix §5.1), kv-aware masking (Helix
§5.2), workload-aware min-max (seed 004 Alg. 2), round-robin and least-outstanding.

Modules: classify (request features, workload class), policies (the math and the pickers),
state (per-replica counters), disagg (prefill/decode groups: the two request bodies, a group's
state), table (load and compile the table), health (polling), metrics (Prometheus text),
upstream (the pooled HTTP/1.1 client of the hot path), proxy (the hot path), app (aiohttp app,
reload, `serve`).

Entry points: `serve(table, host, port, policy, auth_token, options=...)` blocks;
`Router(table, ...)` with `await start()` / `await stop()` runs inside an event loop;
`python -m hetcompile.router --table PATH`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetcompile.router.app import Router, RouterOptions, build_app, serve
    from hetcompile.router.table import RouterError

__all__ = ["Router", "RouterError", "RouterOptions", "build_app", "serve"]

# Loaded on first use (PEP 562): the simulator imports router.policies (one routing math for both),
# and a build should not pay for aiohttp (0.3 s) to do that.
_HOME = {"Router": "app", "RouterOptions": "app", "build_app": "app", "serve": "app", "RouterError": "table"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
