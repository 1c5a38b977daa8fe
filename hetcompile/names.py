"""The one pattern for identifiers that become file, cluster or host names.

A replica id becomes `sky/<id>.yaml`, `vllm/<id>/` and the SkyPilot cluster `<plan>-<id>`; a plan
name becomes every cluster's prefix; model, workload, region and GPU names end up in node ids,
routing tables and shell scripts. They are checked here, where they enter (the spec loader and
`read_plan_doc` for `--previous`), so nothing downstream has to wonder whether a name could hold
`$(...)`, a quote, a newline or `../`: letters, digits, '.', '_' and '-', starting with a letter
or digit, at most 63 characters (a DNS label, which is what cluster and host names become).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
PLAN_NAME_RE = r"^[a-z0-9][a-z0-9-]{0,39}$"      # cluster prefix: lowercase, and room for '-r123'
REPLICA_ID_RE = r"^r[0-9]{1,9}$"                 # what place hands out: r0, r1, ...
NODE_ID_RE = r"^[a-z0-9][a-z0-9-]{0,127}$"       # <region>-<gpu>-<k>[-s<j>], lowercased by place


def _checker(pattern: str, what: str):
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{what} {value[:80]!r} is not allowed: {_RULES[pattern]}")
        return value

    return check


_RULES = {
    NAME_RE: "use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters",
    PLAN_NAME_RE: "use lowercase letters, digits and '-', starting with a letter or digit, at most 40 characters",
    REPLICA_ID_RE: "replica ids are 'r' and a number (r0, r1, ...), as `hetcompile build` writes them",
    NODE_ID_RE: "node ids are lowercase letters, digits and '-', as `hetcompile build` writes them",
}


def _name_type(pattern: str, what: str, description: str):
    return Annotated[str, AfterValidator(_checker(pattern, what)),
                     Field(description=description, json_schema_extra={"pattern": pattern})]


Name = _name_type(NAME_RE, "name", "an identifier: letters, digits, '.', '_', '-'")
PlanName = _name_type(PLAN_NAME_RE, "plan name", "plan name (lowercase, digits, '-')")
ReplicaId = _name_type(REPLICA_ID_RE, "replica id", "replica id r<k>, never reused across replans (see next_replica)")
NodeId = _name_type(NODE_ID_RE, "node id", "node id (cluster hosts are named after it)")
