"""Prefill/decode (P/D) disaggregation: the two request bodies and a group's live state.

A `DisaggregatedGroup` of the routing table (plan/routing.py) pairs replicas that run only the
prefill with replicas that run only the decode; their vLLMs run with
`--kv-transfer-config '{"kv_connector":"NixlConnector","kv_load_failure_policy":"fail","kv_role":"kv_producer"}'`
on the prefill replicas and `"kv_role":"kv_consumer"` on the decode replicas (ir/engine.py; vLLM 0.32 deprecates `kv_both` for
NixlConnector: `nixl/connector.py` warns; the request's `kv_transfer_params` decide the direction,
the role only what each side keeps). The router
serves a request routed to a group in two steps (proxy.py, `Proxy.forward_group`):

1. prefill: the client's body with `kv_transfer_params` = `PREFILL_KV_PARAMS`
   (`do_remote_decode: true`: keep the KV for a remote decode), `stream: false`,
   `max_tokens: 1` (and `max_completion_tokens: 1` when the body has it), without
   `stream_options` (vLLM refuses them on a plain request) and without `min_tokens` /
   `min_completion_tokens` (above 1 they contradict `max_tokens: 1`), sent to a prefill replica.
   It answers a plain completion of one token whose top-level `kv_transfer_params` say where the
   KV is: `do_remote_prefill: true, do_remote_decode: false, remote_engine_id, remote_block_ids,
   remote_request_id, remote_host, remote_port, tp_size`.
2. decode: the client's body unchanged except for `kv_transfer_params` = exactly what the
   prefill answered, streamed or not as the client asked, sent to a decode replica; it pulls the
   KV (NIXL READ) and generates; its answer goes to the client as an aggregated replica's does.

Both steps of one try carry the same `X-Request-Id` (vLLM takes its request id from that header),
as vLLM's proxy sends them: before NIXL_CONNECTOR_VERSION 2 put `remote_request_id` into the
params, the decode could name the prefill's request only by its own id, so one id for both keeps
such versions working. Each try (a re-run prefill and its decode) gets a new id.

A prefill that answers 200 without `kv_transfer_params` (null or absent) is no failure: a
replica without a KV connector never returns any, and vLLM's NIXL scheduler hands the KV over only
for a request that finished by length or by a stop (`pull_scheduler.py`: FINISHED_LENGTH_CAPPED or
FINISHED_STOPPED in 0.32; releases before it returned none for a stop). The router then does what vLLM's proxy does: it
sends the decode the client's body without `kv_transfer_params`, and the decode computes the
prompt itself. Retrying such a prefill elsewhere would get the same answer and fail the request.

Checked against vLLM's source (repository vllm-project/vllm):
`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py` (the two requests and the fields
set, removed and copied; the shared X-Request-Id; a missing `kv_transfer_params` sent on
without), `vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`
(`NixlConnectorScheduler.request_finished`: the params returned and when; `update_state_after_alloc`
and `get_num_new_matched_tokens`: what the decode reads from them; NIXL_CONNECTOR_VERSION 2
added `remote_request_id`), `vllm/entrypoints/openai/completion/protocol.py`
(`CompletionRequest.kv_transfer_params`, `CompletionResponse.kv_transfer_params` at the top
level of the answer), and docs.vllm.ai's NixlConnector usage guide (features/nixl_connector_usage).

A group as a class candidate (`GroupState`): a class's picker sees the group as one more
replica, so it gives the group what a picker reads of a replica. Notation of policies.py:

  P, D       the group's prefill and decode replicas (their own `ReplicaState`s)
  routable   some s in P and some s in D are routable
  has_room   the prefill and the decode picker each have a candidate below its admission bound
  u_g, KV_g  u_s and KV_s of the decode replica with the most free KV below the high-water mark,
             argmax_{s in D, routable, not blocked} KV_s · (hwm - u_s); kv-aware then masks the
             group exactly when its decode picker would find every decode replica masked
  prefill_g  sum of prefill_s over P, decode_g sum of decode_s over D (the group's throughput
             for min-max's T_r^g)
  L_g, kv_g  the group's own counters, as a replica's (a lease per request on the group)
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hetcompile.plan.routing import DisaggregatedGroup
from hetcompile.router.state import InFlight

if TYPE_CHECKING:
    from hetcompile.router.policies import Candidate, Picker

# the kv_transfer_params of the prefill request (vLLM's proxy sends these six keys)
PREFILL_KV_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
# the connector whose kv_transfer_params the router speaks
NIXL = "NixlConnector"


def prefill_body(req: dict) -> bytes:
    """The prefill request: the client's body asking for one token and the KV kept for a decode."""
    p = dict(req)
    p["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    p["stream"] = False
    p["max_tokens"] = 1
    if "max_completion_tokens" in p:
        p["max_completion_tokens"] = 1
    p.pop("stream_options", None)
    p.pop("min_tokens", None)
    p.pop("min_completion_tokens", None)
    return json.dumps(p).encode()


def decode_body(req: dict, kv_params: dict | None) -> bytes:
    """The decode request: the client's body with the prefill's `kv_transfer_params` (none: the
    prefill handed no KV over, the decode computes the prompt itself)."""
    d = dict(req)
    if kv_params is None:
        d.pop("kv_transfer_params", None)
    else:
        d["kv_transfer_params"] = kv_params
    return json.dumps(d).encode()


def answered_kv_params(body: bytes) -> dict | None:
    """The `kv_transfer_params` of a prefill's 200 answer; None when it has none (see above).

    Raises ValueError for an answer that is not a JSON object or whose params are not an object:
    a broken replica, retried elsewhere.
    """
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"prefill answer is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError("prefill answer is not a JSON object")
    kv = doc.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise ValueError(f"prefill answer's kv_transfer_params is not an object: {kv!r:.80}")
    return kv


def pd_request_id(client_id: str | None) -> str:
    """A fresh X-Request-Id for one prefill and its decode: the client's id (when it sent a usable
    one) with a unique suffix, so that vLLM's logs still show it."""
    mine = uuid.uuid4().hex[:16]
    if client_id and "\r" not in client_id and "\n" not in client_id:
        return f"{client_id}-{mine}"
    return mine


@dataclass(slots=True)
class PdTries:
    """Where one request routed to a group stands, across its prefills and decodes."""

    prefills: int = 0  # prefill attempts so far
    prefill_fails: int = 0
    decodes: int = 0  # decode attempts so far (each after its own prefill)
    p_tried: list = field(default_factory=list)  # prefill replicas that failed
    d_tried: list = field(default_factory=list)  # decode replicas that failed
    last: str = "no replica was tried"


class GroupState(InFlight):
    """A disaggregated group: its members' pickers, and the face it shows a class's picker."""

    __slots__ = ("id", "model", "kv_connector", "policy", "prefill", "decode", "high_water", "prefill_tps", "decode_tps")

    prefill_tps: float
    decode_tps: float

    def __init__(self, spec: DisaggregatedGroup, prefill: "Picker", decode: "Picker", policy: str, high_water: float):
        super().__init__()  # kv_g, L_g
        self.update(spec, prefill, decode, policy, high_water)

    def update(self, spec: DisaggregatedGroup, prefill: "Picker", decode: "Picker", policy: str, high_water: float) -> None:
        """Take a (re)loaded table's members; the counters carry over (leases release into them)."""
        self.id = spec.id
        self.model = spec.model
        self.kv_connector = spec.kv_connector
        self.policy = policy  # of the member pickers
        self.prefill = prefill
        self.decode = decode
        self.high_water = high_water
        self.prefill_tps = sum((r.prefill_tps for r in prefill.replicas), 0.0)
        self.decode_tps = sum((r.decode_tps for r in decode.replicas), 0.0)

    # -- what a class's picker reads -----------------------------------------------------------

    @property
    def routable(self) -> bool:
        return any(r.routable for r in self.prefill.replicas) and any(r.routable for r in self.decode.replicas)

    @property
    def endpoint(self) -> str | None:
        """Not None when both sides have a deployed replica (a picker's "deployed" test)."""
        deployed = (any(r.endpoint is not None for r in self.prefill.replicas)
                    and any(r.endpoint is not None for r in self.decode.replicas))  # fmt: skip
        return f"group:{self.id}" if deployed else None

    def has_room(self) -> bool:
        return bool(self.prefill.eligible(None, bounded=True)) and bool(self.decode.eligible(None, bounded=True))

    def _roomiest(self) -> "Candidate | None":
        """The decode replica with the most KV free below the high-water mark (argmax in the notation)."""
        best: "Candidate | None" = None
        best_free = -math.inf
        for r in self.decode.replicas:
            if r.routable and not r.blocked():
                free = r.kv_capacity * (self.high_water - r.kv_usage())
                if free > best_free:
                    best, best_free = r, free
        return best

    def kv_usage(self) -> float:
        """u_g; with no open decode replica, the least used one's."""
        r = self._roomiest()
        if r is not None:
            return r.kv_usage()
        return min((r.kv_usage() for r in self.decode.replicas), default=0.0)

    @property
    def kv_capacity(self) -> float:
        """KV_g: the capacity that goes with u_g."""
        r = self._roomiest()
        if r is None:
            r = min(self.decode.replicas, key=lambda x: x.kv_usage(), default=None)
        return r.kv_capacity if r is not None else 1.0

    def blocked(self) -> bool:
        """Every routable decode replica has vLLM queueing (so the group has nowhere open)."""
        live = [r for r in self.decode.replicas if r.routable]
        return bool(live) and all(r.blocked() for r in live)

    @property
    def retry_after(self) -> int:
        """A full group frees up when its fuller side does: the later of the two sides' waits."""
        p = min((r.retry_after for r in self.prefill.replicas if r.endpoint is not None), default=1)
        d = min((r.retry_after for r in self.decode.replicas if r.endpoint is not None), default=1)
        return max(p, d)

    # -- accounting: InFlight's acquire and release, as a replica's --------------------------------

    def passive_failure(self, fall: int) -> None:
        """Nothing: each member that failed was counted against itself."""

    def passive_success(self) -> None:
        """Nothing, as `passive_failure`."""
