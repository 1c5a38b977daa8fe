"""The router's command-line options, shared by `hetcompile router` and `python -m hetcompile.router`.

Both entry points call `run(argv)`: one parser, one set of defaults, one validation. Secrets never
go on the command line: the client bearer token is read from the environment variable named by
`--auth-token-env`, backend tokens from each replica's `api_key_env` in routing.json.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from collections.abc import Sequence

from hetcompile.errors import HetcompileError
from hetcompile.plan.routing import POLICIES
from hetcompile.router.table import RouterError


def build_parser(prog: str = "python -m hetcompile.router") -> argparse.ArgumentParser:
    from hetcompile.router.app import RouterOptions

    d = RouterOptions()
    p = argparse.ArgumentParser(prog=prog, description="Run the bundled OpenAI-compatible router in front of a plan's replicas.")
    p.add_argument("--table", required=True, help="routing.json of a plan")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 to expose)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--policy", choices=POLICIES, default=None, help="override the table's policy for every class")
    p.add_argument("--auth-token-env", default=None, metavar="VAR", help="env var holding the bearer token clients must send")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="allow binding a non-loopback address without --auth-token-env")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--connect-timeout", type=float, default=d.connect_timeout)
    p.add_argument("--read-timeout", type=float, default=d.read_timeout)
    p.add_argument("--max-retries", type=int, default=d.max_retries)
    p.add_argument("--max-inflight", type=int, default=d.max_inflight, metavar="N",
                   help="requests in flight per replica before new ones get 429 (default: the plan's "
                        "planned_concurrency + max_queue per replica; 0: no bound)")
    p.add_argument("--first-byte-timeout", type=float, default=d.first_byte_timeout, metavar="S",
                   help="seconds an attempt may go without a first byte before it fails over and counts "
                        "against the replica (default: the plan's first_byte_timeout_s per replica, else 30)")
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
    """The client bearer token, or None without `--auth-token-env`; an unset or empty variable is
    an error, never a silent run without auth."""
    if var is None:
        return None
    token = os.environ.get(var)
    if not token:
        raise RouterError(f"--auth-token-env {var}: the variable is not set or empty; refusing to start without auth")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, allow_unauthenticated: bool) -> None:
    if token is None and not allow_unauthenticated and not is_loopback(host):
        raise RouterError(f"--host {host} is not loopback and no --auth-token-env is given: anyone who can reach it "
                          "could use the backends; set --auth-token-env VAR or pass --allow-unauthenticated")


def build(a: argparse.Namespace):
    """Validated (options, auth_token) from parsed arguments; raises RouterError before anything listens."""
    from hetcompile.router.app import RouterOptions

    token = auth_token_from_env(a.auth_token_env)
    check_exposure(a.host, token, a.allow_unauthenticated)
    options = RouterOptions(
        max_body_bytes=a.max_body_bytes,
        connect_timeout=a.connect_timeout,
        read_timeout=a.read_timeout,
        max_retries=a.max_retries,
        max_inflight=a.max_inflight,
        first_byte_timeout=a.first_byte_timeout,
        health_interval=a.health_interval,
        fail_threshold=a.fail_threshold,
        rise_threshold=a.rise_threshold,
        kv_high_water=a.kv_high_water,
        theta=a.theta,
        access_log=a.access_log,
    )
    return options, token


def run(argv: Sequence[str] | None = None, prog: str = "python -m hetcompile.router") -> int:
    """Parse, validate and serve; returns the exit status (2 with one line on stderr for a bad option)."""
    from hetcompile.router.app import serve

    a = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options, token = build(a)
        serve(a.table, host=a.host, port=a.port, policy=a.policy, auth_token=token, options=options,
              use_uvloop=not a.no_uvloop)
    except HetcompileError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0
