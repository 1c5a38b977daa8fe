"""The routing table: the contract between the compiler (route pass, router backend) and the router.

`OUT/router/routing.json` is serialized from `RoutingTable` and validated by
`schemas/routing.schema.json` (generated from this module). The router reads only this file.

Semantics:
- A request names a model (`model` field of the OpenAI body). The router finds the `RoutedModel`
  with that `name`, then the first `WorkloadClass` whose `match` accepts the request (prompt
  length in tokens, estimated as characters / `chars_per_token` when the prompt is text;
  `max_tokens`; an optional header). The last class of a model should match everything.
- `weights` of a class are the plan's shares of that class's traffic per replica (they sum to 1
  over the replicas listed; replicas absent get none of that class).
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
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hetcompile.frozen import Frozen

Policy = Literal["weighted", "kv-aware", "min-max", "round-robin", "least-outstanding"]
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
    replica: Annotated[str, Field(description="replica id")]
    weight: Annotated[float, Field(ge=0, description="share of the class's traffic (sums to 1 per class)")]


class WorkloadClass(Frozen):
    name: Annotated[str, Field(description="workload class name from the spec")]
    match: Annotated[ClassMatch, Field(default_factory=ClassMatch, description="which requests belong here")]
    input_tokens: Annotated[float, Field(gt=0, description="mean prompt tokens of this class (KV estimates)")]
    output_tokens: Annotated[float, Field(gt=0, description="mean output tokens of this class (KV estimates)")]
    weights: Annotated[tuple[ReplicaWeight, ...], Field(description="plan weights per replica, sorted by replica")]
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


class RoutingTable(Frozen):
    version: Annotated[Literal[1], Field(description="format version")] = 1
    plan: Annotated[str, Field(description="plan name")]
    spec_hash: Annotated[str, Field(default="", description="sha256 of the spec the plan came from")] = ""
    policy: Annotated[Policy, Field(default="weighted", description="default routing policy")] = "weighted"
    chars_per_token: Annotated[float, Field(default=4.0, gt=0, description="prompt chars per token estimate")] = 4.0
    models: Annotated[tuple[RoutedModel, ...], Field(description="models served, sorted by name")]
    replicas: Annotated[tuple[RoutedReplica, ...], Field(description="replicas, sorted by id")]

    @model_validator(mode="after")
    def _check_refs(self) -> "RoutingTable":
        ids = {r.id for r in self.replicas}
        if len(ids) != len(self.replicas):
            raise ValueError("replica ids must be unique")
        for m in self.models:
            for c in m.classes:
                for w in c.weights:
                    if w.replica not in ids:
                        raise ValueError(f"class {m.name}/{c.name} weights unknown replica {w.replica!r}")
        return self
