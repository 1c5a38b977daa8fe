"""Loading the routing table and compiling it into the router's lookup structures.

`compile_table` turns a validated `RoutingTable` into a `RouteTable`: a dict from model name to
its workload classes, each class holding its candidate `ReplicaState`s (plan weight > 0) and the
picker of its policy. The policy of a class is, by precedence: the router's `--policy` flag,
the class's own `policy`, the table's `policy`.

Reloads pass the previous replica states in: a replica whose id and endpoint are unchanged keeps
its state (in-flight counts, min-max load, health), so requests in flight across a reload release
into the object they acquired from and nothing is dropped or double-counted.

Disaggregated groups (disagg.py) compile into `GroupState`s: a prefill and a decode picker over
the members (with the router's `--policy` or the table's `policy`: a group serves every class
that weights it), and a candidate of each class that weights the group. A group keeps its
counters across a reload by id, as a replica does by id and endpoint.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from hetcompile.errors import HetcompileError
from hetcompile.plan.routing import ClassMatch, RoutingTable, WorkloadClass
from hetcompile.router.disagg import NIXL, GroupState
from hetcompile.router.policies import Picker, make_picker
from hetcompile.router.state import Limits, ReplicaState

if TYPE_CHECKING:
    from hetcompile.router.policies import Candidate

log = logging.getLogger("hetcompile.router")


class RouterError(HetcompileError):
    """The router cannot start or reload: unreadable or invalid table, bad option."""

    kind = "router error"


@dataclass(slots=True)
class ClassRoute:
    name: str
    match: ClassMatch
    input_tokens: float
    output_tokens: float
    policy: str
    picker: Picker


@dataclass(slots=True)
class ModelRoute:
    name: str
    classes: tuple[ClassRoute, ...]
    matches: tuple[ClassMatch, ...]


@dataclass(slots=True)
class RouteTable:
    source: RoutingTable
    models: dict[str, ModelRoute]
    replicas: dict[str, ReplicaState]
    chars_per_token: float
    models_json: bytes = field(default=b"")
    only_model: str | None = None
    groups: dict[str, GroupState] = field(default_factory=dict)


def load_table(path: Path) -> RoutingTable:
    """Read and validate `routing.json`; errors become `RouterError` with the path.

    Whatever the file holds (binary bytes, JSON nested past the parser's limit, numbers the
    schema allows but the router's float arithmetic cannot carry), the answer is a
    `RouterError`, so a reload answers 400 and the old table keeps serving.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise RouterError(f"cannot read routing table {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RouterError(f"invalid routing table {path}: not UTF-8 text ({e})") from None
    try:
        table = RoutingTable.model_validate_json(text)
    except ValidationError as e:
        raise RouterError(f"invalid routing table {path}:\n{e}") from None
    bad = _unusable_number(table.model_dump(), "")
    if bad is not None:
        raise RouterError(f"invalid routing table {path}: {bad}")
    return table


# RFC 8259 §6's interoperable integer range; kv_capacity_tokens and friends are divided as
# floats on the hot path, where 10**400 raises OverflowError and inf turns loads into NaN
_MAX_INT = 2**53 - 1


def _unusable_number(value: object, where: str) -> str | None:
    """The first number in a dumped table that is not finite or beyond ±(2**53 - 1), described."""
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value}"
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_INT:
        return f"{where} must be at most {_MAX_INT} in magnitude"
    else:
        return None
    for sub, v in items:
        found = _unusable_number(v, sub)
        if found is not None:
            return found
    return None


def compile_table(
    table: RoutingTable,
    previous: dict[str, ReplicaState] | None = None,
    *,
    policy_override: str | None = None,
    high_water: float = 0.95,
    theta: float = 2.0,
    limits: Limits = Limits(),
    previous_groups: dict[str, GroupState] | None = None,
) -> RouteTable:
    """Build the lookup structures; reuse `previous` states whose id and endpoint are unchanged,
    and `previous_groups` by id."""
    previous = previous or {}
    replicas: dict[str, ReplicaState] = {}
    for spec in table.replicas:
        old = previous.get(spec.id)
        endpoint = spec.endpoint.rstrip("/") if spec.endpoint else None
        if old is not None and old.endpoint == endpoint:
            old.update_spec(spec, limits)
            replicas[spec.id] = old
        else:
            # a new or moved replica starts fresh; the old state lives on in its leases
            replicas[spec.id] = ReplicaState(spec, limits)

    # classes with the same candidates and weights share one picker: a smooth WRR is exact over a
    # window of its own picks, and a class of a few requests an hour never completes one (its first
    # ten picks give a 4%-weight replica one of them); shared, 3,000 such classes are one sequence
    shared: dict[tuple, Picker] = {}

    def picker_of(policy: str, cands: list[tuple[Candidate, float]]) -> Picker:
        key = (policy, tuple(r.id for r, _ in cands), tuple(w for _, w in cands))
        if (picker := shared.get(key)) is None:
            picker = shared[key] = make_picker(policy, [r for r, _ in cands], [w for _, w in cands],
                                               high_water=high_water, theta=theta)
        return picker

    groups = _compile_groups(table, replicas, previous_groups or {}, policy_override or table.policy, high_water, picker_of)
    models: dict[str, ModelRoute] = {}
    for m in table.models:
        classes = []
        for c in m.classes:
            policy = policy_override or c.policy or table.policy
            picker = picker_of(policy, _candidates(m.name, c, replicas, groups))
            classes.append(ClassRoute(c.name, c.match, c.input_tokens, c.output_tokens, policy, picker))
        models[m.name] = ModelRoute(m.name, tuple(classes), tuple(c.match for c in classes))

    listing = {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "hetcompile"} for name in sorted(models)],
    }
    return RouteTable(
        source=table,
        models=models,
        replicas=replicas,
        chars_per_token=table.chars_per_token,
        models_json=json.dumps(listing).encode(),
        only_model=next(iter(models)) if len(models) == 1 else None,
        groups=groups,
    )


def _candidates(model: str, c: WorkloadClass, replicas: dict[str, ReplicaState],
                groups: dict[str, GroupState]) -> list[tuple[Candidate, float]]:
    """A class's candidates: the replicas and groups it weights > 0 (the table validated the ids)."""
    cands: list[tuple[Candidate, float]] = []
    for w in c.weights:
        r: Candidate = groups[w.replica] if w.replica in groups else replicas[w.replica]
        if w.weight <= 0:
            continue
        if r.model != model:
            log.warning("class %s/%s weights replica %s which serves %r; ignored", model, c.name, r.id, r.model)
            continue
        cands.append((r, w.weight))
    if not cands:
        # no positive weight: every aggregated replica and group of the model, equally (keeps the
        # class served); a prefill or decode replica serves only through its group
        cands = [(r, 1.0) for r in replicas.values() if r.model == model and r.role is None]
        cands += [(g, 1.0) for g in groups.values() if g.model == model]
        if cands:
            log.warning("class %s/%s has no positive weight; spreading it evenly", model, c.name)
    return cands


def _compile_groups(table: RoutingTable, replicas: dict[str, ReplicaState], previous: dict[str, GroupState],
                    policy: str, high_water: float, picker_of) -> dict[str, GroupState]:
    """A `GroupState` per disaggregated group, its pickers over its members with weight > 0
    (all of a side, equally, when none has)."""
    groups: dict[str, GroupState] = {}
    for g in table.groups:
        if g.kv_connector != NIXL:
            log.warning("group %s uses kv_connector %s; the router speaks %s's kv_transfer_params", g.id, g.kv_connector, NIXL)
        sides = []
        for weights in (g.prefill, g.decode):
            cands: list[tuple[Candidate, float]] = [(replicas[w.replica], w.weight) for w in weights if w.weight > 0]
            sides.append(picker_of(policy, cands or [(replicas[w.replica], 1.0) for w in weights]))
        old = previous.get(g.id)
        if old is not None:
            old.update(g, sides[0], sides[1], policy, high_water)
            groups[g.id] = old
        else:
            groups[g.id] = GroupState(g, sides[0], sides[1], policy, high_water)
    return groups
