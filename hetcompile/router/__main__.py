"""`python -m hetcompile.router --table OUT/router/routing.json`: run the bundled router.

Secrets never go on the command line: the client bearer token is read from the environment
variable named by `--auth-token-env`, backend tokens from each replica's `api_key_env`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from hetcompile.ir.errors import HetcompileError
from hetcompile.ir.routing import POLICIES
from hetcompile.router.app import RouterOptions, serve
from hetcompile.router.table import RouterError


def build_parser() -> argparse.ArgumentParser:
    d = RouterOptions()
    p = argparse.ArgumentParser(prog="python -m hetcompile.router", description=__doc__.splitlines()[0])
    p.add_argument("--table", required=True, help="routing.json of a plan")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--policy", choices=POLICIES, default=None, help="override the table's policy for every class")
    p.add_argument("--auth-token-env", default=None, metavar="VAR", help="env var holding the bearer token clients must send")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--connect-timeout", type=float, default=d.connect_timeout)
    p.add_argument("--read-timeout", type=float, default=d.read_timeout)
    p.add_argument("--max-retries", type=int, default=d.max_retries)
    p.add_argument("--health-interval", type=float, default=d.health_interval)
    p.add_argument("--fail-threshold", type=int, default=d.fail_threshold)
    p.add_argument("--rise-threshold", type=int, default=d.rise_threshold)
    p.add_argument("--kv-high-water", type=float, default=d.kv_high_water)
    p.add_argument("--theta", type=float, default=d.theta)
    p.add_argument("--access-log", action="store_true")
    p.add_argument("--no-uvloop", action="store_true", help="use asyncio's default loop even if uvloop is installed")
    p.add_argument("--log-level", default="INFO")
    return p


def auth_token_from_env(var: str | None) -> str | None:
    if var is None:
        return None
    token = os.environ.get(var)
    if not token:
        raise RouterError(f"--auth-token-env {var}: the variable is not set or empty")
    return token


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = RouterOptions(
            max_body_bytes=a.max_body_bytes,
            connect_timeout=a.connect_timeout,
            read_timeout=a.read_timeout,
            max_retries=a.max_retries,
            health_interval=a.health_interval,
            fail_threshold=a.fail_threshold,
            rise_threshold=a.rise_threshold,
            kv_high_water=a.kv_high_water,
            theta=a.theta,
            access_log=a.access_log,
        )
        serve(
            a.table,
            host=a.host,
            port=a.port,
            policy=a.policy,
            auth_token=auth_token_from_env(a.auth_token_env),
            options=options,
            use_uvloop=not a.no_uvloop,
        )
    except HetcompileError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
