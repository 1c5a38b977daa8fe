"""The routing table: the contract between the compiler (route pass, router backend) and the router.

`OUT/router/routing.json` is serialized from `RoutingTable` and validated by
`schemas/routing.schema.json` (generated from this module). The router reads only this file.

Semantics:
- A request names a model (`model` field of the OpenAI body). The router finds the `RoutedModel`
  with that `name`, then the first `WorkloadClass` whose `match` accepts the request (prompt
  length in tokens, estimated as characters / `chars_per_token` when the prompt is text;
  `max_tokens`; an optional header). The last class of a model should match everything.
- `weights` of a class are the plan's shares of that class's traffic per replica or group (they
  sum to 1 over the ids listed; replicas and groups absent get none of that class).
- A replica with `endpoint: null` is not deployed yet (deploy.sh fills endpoints in); the router
  sends it no traffic.
- `kv_capacity_tokens` is the replica's KV cache in tokens (minimum over its stages, as vLLM
  computes it); the kv-aware policy masks a replica whose estimated in-flight KV exceeds it.
- `prefill_tokens_per_s` / `decode_tokens_per_s` let the min-max policy (seed 004, Alg. 2)
  estimate a request's processing time T = I / prefill + O / decode.
- Admission (issue 18): the router keeps at most `planned_concurrency + max_queue` requests in
  flight on a replica (C running, as the plan sized it, plus a queue that drains at
  `capacity_requests_per_s` within the TTFT budget); a new request that finds every candidate
  full gets 429 with Retry-After instead of an unbounded wait. Absent fields: no bound.
- `first_byte_timeout_s`: an attempt that has sent the client nothing after this long (the
  first SSE chunk of a stream; the response head of a plain request, plus the time its
  `max_tokens` may take) is abandoned and retried on another replica, and counts toward
  ejecting the replica, whatever its /health says. Absent: the router's default (30 s).
- Prefill/decode disaggregation (issue 35): a `DisaggregatedGroup` pairs replicas that run only
  the prefill (`role: prefill`) with replicas that run only the decode (`role: decode`) of one
  model, their vLLMs started with `--kv-transfer-config` of the group's `kv_connector` (`kv_role`
  `kv_producer` on prefill replicas, `kv_consumer` on decode replicas). Class `weights` name a group id as they name a replica (replica and group ids are
  one namespace); a replica with a role never takes class traffic itself. A request routed to a
  group runs in two steps: the prefill replica (chosen by the group's `prefill` weights) computes
  the prompt's KV and answers one token with `kv_transfer_params`, then the decode replica (by
  the `decode` weights) pulls that KV and generates the answer the client gets
  (`hetcompile/router/disagg.py` has the protocol). Each step gets its replica's health,
  admission and first-byte timeout; the decode replica holds the request from admission on. A
  failed prefill is retried on another prefill replica, a decode that failed before the client
  got a byte on another decode replica after a new prefill. Tables without `groups` and `role`
  are the aggregated tables they always were; neither key is written when unused.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from hetcompile.frozen import Frozen

Policy = Literal["weighted", "kv-aware", "min-max", "round-robin", "least-outstanding"]
KV_CONNECTOR = "NixlConnector"  # vLLM's KV connector of every disaggregated group hetcompile plans (ir/engine.py)
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}  # its kv_role per phase (kv_both is deprecated for it)

# the phase a replica of a disaggregated group runs (None: the whole request)
Role = Literal["prefill", "decode"]
POLICIES: tuple[str, ...] = ("weighted", "kv-aware", "min-max", "round-robin", "least-outstanding")


# the env var that holds the replicas' bearer key, on the replicas (vLLM) and on the router
VLLM_KEY_ENV = "HC_VLLM_API_KEY"
# the env var that holds the router's bearer token (clients and `hetcompile router --auth-token-env`)
ROUTER_TOKEN_ENV = "HC_ROUTER_TOKEN"
# where deploy keeps the two in OUT (mode 600; a re-run, migrate and observe read them back)
SECRET_FILES = {ROUTER_TOKEN_ENV: "router.token", VLLM_KEY_ENV: "vllm.key"}




class HeaderMatch(Frozen):
    name: Annotated[str, Field(description="HTTP header name (case-insensitive)")]
    value: Annotated[str, Field(description="exact header value that selects the class")]


class ClassMatch(Frozen):
    """Conditions that all must hold; an absent bound does not constrain."""

    prompt_tokens_min: Annotated[int | None, Field(default=None, description="prompt tokens >= this")] = None
    prompt_tokens_max: Annotated[int | None, Field(default=None, description="prompt tokens < this")] = None
    max_tokens_min: Annotated[int | None, Field(default=None, description="request max_tokens >= this")] = None
    max_tokens_max: Annotated[int | None, Field(default=None, description="request max_tokens < this")] = None
    header: Annotated[HeaderMatch | None, Field(default=None, description="header that selects the class")] = None


class ReplicaWeight(Frozen):
    replica: Annotated[str, Field(description="replica id (in a class's weights, a group id too)")]
    weight: Annotated[float, Field(ge=0, description="share of the class's traffic (sums to 1 per class), or of a group side's")]


class WorkloadClass(Frozen):
    name: Annotated[str, Field(description="workload class name from the spec")]
    match: Annotated[ClassMatch, Field(default_factory=ClassMatch, description="which requests belong here")]
    input_tokens: Annotated[float, Field(gt=0, description="mean prompt tokens of this class (KV estimates)")]
    output_tokens: Annotated[float, Field(gt=0, description="mean output tokens of this class (KV estimates)")]
    weights: Annotated[
        tuple[ReplicaWeight, ...],
        Field(description="plan weights per replica or disaggregated group (by its id), sorted by replica"),
    ]
    policy: Annotated[Policy | None, Field(default=None, description="overrides the table's policy")] = None


class RoutedModel(Frozen):
    name: Annotated[str, Field(description="model name clients send (vLLM --served-model-name)")]
    classes: Annotated[tuple[WorkloadClass, ...], Field(min_length=1, description="first match wins")]


class RoutedReplica(Frozen):
    id: Annotated[str, Field(description="replica id, unique in the plan")]
    model: Annotated[str, Field(description="served model name")]
    endpoint: Annotated[
        str | None, Field(default=None, description="base URL of the replica head, e.g. http://10.0.0.1:8000; null until deployed")
    ] = None
    kv_capacity_tokens: Annotated[int, Field(gt=0, description="KV cache capacity in tokens (min over stages)")]
    max_num_seqs: Annotated[int, Field(gt=0, description="vLLM --max-num-seqs of the replica")]
    prefill_tokens_per_s: Annotated[float, Field(gt=0, description="estimated prompt tokens/s at full batch")]
    decode_tokens_per_s: Annotated[float, Field(gt=0, description="estimated output tokens/s at full batch")]
    api_key_env: Annotated[
        str | None, Field(default=None, description="name of the env var holding the backend's bearer token")
    ] = None
    planned_concurrency: Annotated[
        int | None, Field(default=None, ge=1, description="C: requests the plan sized the replica to run at once")
    ] = None
    max_queue: Annotated[
        int | None, Field(default=None, ge=0, description="requests admitted beyond C to wait in the replica's queue")
    ] = None
    capacity_requests_per_s: Annotated[
        float | None, Field(default=None, gt=0, description="h: requests/s at capacity for the planned mix (queue drain rate)")
    ] = None
    first_byte_timeout_s: Annotated[
        float | None, Field(default=None, gt=0, description="seconds an attempt may go without a first byte before it fails over")
    ] = None
    gpu: Annotated[str, Field(default="", description="GPU type(s), informational")] = ""
    region: Annotated[str, Field(default="", description="region, informational")] = ""
    role: Annotated[
        Role | None,
        Field(default=None, description="prefill or decode: one phase of a disaggregated group, reached only through "
                                        "the group; null: an ordinary replica that runs whole requests"),
    ] = None

    @model_serializer(mode="wrap")
    def _omit_no_role(self, handler: SerializerFunctionWrapHandler) -> dict:
        # an aggregated replica is written as before P/D existed: its routing.json stays byte for byte
        data = handler(self)
        if self.role is None:
            data.pop("role", None)
        return data


class DisaggregatedGroup(Frozen):
    """Prefill and decode replicas of one model that serve a request together (P/D disaggregation)."""

    id: Annotated[str, Field(description="group id, unique among replica and group ids; class weights name it")]
    model: Annotated[str, Field(description="served model name; every member serves it")]
    prefill: Annotated[
        tuple[ReplicaWeight, ...],
        Field(min_length=1, description="replicas with role prefill and their shares of the group's prefills, sorted by replica"),
    ]
    decode: Annotated[
        tuple[ReplicaWeight, ...],
        Field(min_length=1, description="replicas with role decode and their shares of the group's decodes, sorted by replica"),
    ]
    kv_connector: Annotated[
        str,
        Field(default=KV_CONNECTOR, description="vLLM KV connector of the members' --kv-transfer-config (kv_role kv_producer on prefill replicas, kv_consumer on decode replicas)"),
    ] = KV_CONNECTOR


class RoutingTable(Frozen):
    version: Annotated[Literal[1], Field(description="format version")] = 1
    plan: Annotated[str, Field(description="plan name")]
    spec_hash: Annotated[str, Field(default="", description="sha256 of the spec the plan came from")] = ""
    policy: Annotated[Policy, Field(default="weighted", description="default routing policy")] = "weighted"
    chars_per_token: Annotated[float, Field(default=4.0, gt=0, description="prompt chars per token estimate")] = 4.0
    models: Annotated[tuple[RoutedModel, ...], Field(description="models served, sorted by name")]
    replicas: Annotated[tuple[RoutedReplica, ...], Field(description="replicas, sorted by id")]
    groups: Annotated[
        tuple[DisaggregatedGroup, ...],
        Field(default=(), description="prefill/decode disaggregated groups, sorted by id (none: every replica is aggregated)"),
    ] = ()

    @model_serializer(mode="wrap")
    def _omit_no_groups(self, handler: SerializerFunctionWrapHandler) -> dict:
        # a table without P/D is written as before P/D existed (golden routing.json files, hashes)
        data = handler(self)
        if not self.groups:
            data.pop("groups", None)
        return data

    @model_validator(mode="after")
    def _check_refs(self) -> "RoutingTable":
        replicas = {r.id: r for r in self.replicas}
        if len(replicas) != len(self.replicas):
            raise ValueError("replica ids must be unique")
        groups = {g.id: g for g in self.groups}
        if len(groups) != len(self.groups):
            raise ValueError("group ids must be unique")
        both = sorted(set(replicas) & set(groups))
        if both:
            raise ValueError(f"{both[0]!r} is both a replica id and a group id (class weights name either, so ids are one namespace)")
        for g in self.groups:
            _check_group(g, replicas)
        for m in self.models:
            for c in m.classes:
                for w in c.weights:
                    _check_class_ref(f"{m.name}/{c.name}", m.name, w.replica, replicas, groups)
        return self


def _check_group(g: DisaggregatedGroup, replicas: dict[str, RoutedReplica]) -> None:
    """Each member of a group exists, has the role of its side and serves the group's model."""
    for side, weights in (("prefill", g.prefill), ("decode", g.decode)):
        for w in weights:
            r = replicas.get(w.replica)
            if r is None:
                raise ValueError(f"group {g.id} {side} weights unknown replica {w.replica!r}")
            if r.role != side:
                has = f"role {r.role!r}" if r.role else "no role (an aggregated replica)"
                raise ValueError(f"group {g.id} lists {w.replica!r} as {side} but it has {has}; give it role {side!r}")
            if r.model != g.model:
                raise ValueError(f"group {g.id} serves model {g.model!r} but its {side} replica {w.replica!r} serves {r.model!r}")


def _check_class_ref(where: str, model: str, ref: str, replicas: dict[str, RoutedReplica],
                     groups: dict[str, DisaggregatedGroup]) -> None:
    """A class weight names an aggregated replica or a group of the class's model."""
    g = groups.get(ref)
    if g is not None:
        if g.model != model:
            raise ValueError(f"class {where} weights group {ref!r}, which serves model {g.model!r}")
        return
    r = replicas.get(ref)
    if r is None:
        raise ValueError(f"class {where} weights unknown replica {ref!r}")
    if r.role is not None:
        raise ValueError(f"class {where} weights {ref!r}, a {r.role} replica: prefill and decode replicas take "
                         f"requests only through their group; weight the group instead")
