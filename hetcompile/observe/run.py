"""`hetcompile observe OUT`: the targets of a deployed plan, one window of samples, observed.yaml."""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml
from pydantic import ValidationError

from hetcompile.plan.observed import OBSERVED_FORMAT, ObservedDoc
from hetcompile.observe.observe import Fetch, ObserveError, http_fetch, sample, summarize, targets
from hetcompile.plan.canon import canon, dumps_yaml
from hetcompile.plan.io import read_plan_doc
from hetcompile.plan.routing import ROUTER_TOKEN_ENV, SECRET_FILES, VLLM_KEY_ENV, RoutingTable
from hetcompile.router.table import RouterError, load_table


def _secret(out: Path, env: str) -> str | None:
    """The environment's value, else the file deploy wrote into OUT (plan/routing.SECRET_FILES)."""
    if os.environ.get(env):
        return os.environ[env]
    f = out / SECRET_FILES[env]
    return f.read_text().strip() if f.is_file() else None


def read_table(out: Path) -> RoutingTable:
    """OUT's routing table, read as the router reads it (router/table.load_table)."""
    try:
        return load_table(out / "router" / "routing.json")
    except RouterError as e:
        raise ObserveError(e.message, hint="observe reads OUT of a deployed plan (`hetcompile deploy OUT`)") from None


def read_observed(path: Path) -> ObservedDoc:
    """An observed.yaml, or a clear error."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ObserveError(f"cannot read {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ObserveError(f"{path} is not YAML: {e}") from None
    if not isinstance(data, dict) or data.get("format") != OBSERVED_FORMAT:
        raise ObserveError(f"{path} is not an observed.yaml (no `format: {OBSERVED_FORMAT}`)",
                           hint="write one with `hetcompile observe OUT`")
    try:
        return ObservedDoc.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise ObserveError(f"{path}: {'.'.join(str(x) for x in first['loc'])}: {first['msg']}") from None


def dumps_observed(doc: ObservedDoc) -> str:
    return dumps_yaml(canon(doc.model_dump(mode="json")))


def observe_out(out: Path, window_s: float, interval_s: float, router_url: str | None, fetch: Fetch = http_fetch,
                clock=time.monotonic, sleep=time.sleep, previous: ObservedDoc | None = None,
                table: RoutingTable | None = None) -> ObservedDoc:
    """Scrape OUT's deployment for `window_s` seconds (a sample every `interval_s`) -> ObservedDoc."""
    plan = read_plan_doc(out)
    table = table or read_table(out)
    if table.spec_hash and table.spec_hash != plan.spec_hash:
        raise ObserveError("OUT/router/routing.json and OUT/plan.json come from different specs", hint="rebuild or redeploy OUT")
    tgts, absent = targets(table, router_url, _secret(out, VLLM_KEY_ENV), _secret(out, ROUTER_TOKEN_ENV))
    if not tgts:
        raise ObserveError("nothing to observe: no replica has an endpoint in OUT/router/routing.json and no --router was given",
                           hint="deploy the plan first (`hetcompile deploy OUT`), or pass --router URL")
    rounds = max(2, int(round(window_s / interval_s)) + 1)
    scrapes, errors = sample(tgts, fetch, rounds, interval_s, clock, sleep)
    return summarize(plan, scrapes, errors, interval_s, rounds, previous, absent)
