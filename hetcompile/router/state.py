"""Live state of one replica: what the router has in flight there and what polling last saw.

A `ReplicaState` outlives table reloads while its id and endpoint stay the same, so in-flight
counts, min-max loads and health carry over and every request releases into the object it
acquired from. Everything runs on one event loop: no locks.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

from hetcompile.plan.routing import RoutedReplica
from hetcompile.router.upstream import parse_endpoint

log = logging.getLogger("hetcompile.router")

def corrected_kv_usage(est_tokens: float, capacity: float, observed: float | None, est_at_poll: float) -> float:
    """u_s: the router's estimate kv_s / KV_s, corrected by vLLM's reported usage.

    The estimate reserves each request's full predicted length, so it is the conservative
    measure for admission; vLLM's `kv_cache_usage_perc` (observed, at the last poll) sees what
    the estimate cannot: other clients, and outputs longer than predicted. The observation is
    aged by what the router added or released since the poll (est_tokens - est_at_poll).
    """
    est = est_tokens / capacity
    if observed is None:
        return est
    return max(est, observed + (est_tokens - est_at_poll) / capacity)


PASSIVE_BACKOFF_MIN = 5.0  # seconds out after the first passive ejection
PASSIVE_BACKOFF_MAX = 120.0
DEFAULT_FIRST_BYTE_TIMEOUT = 30.0  # seconds, for a table that does not state one per replica
RETRY_AFTER_MAX = 60  # seconds: a 429's Retry-After never asks a client to wait longer


@dataclass(frozen=True, slots=True)
class Limits:
    """Router-wide overrides of the table's per-replica admission bound and first-byte timeout.

    max_inflight: None keeps each replica's planned bound (planned_concurrency + max_queue;
    none when the table has neither), 0 turns bounds off, N > 0 bounds every replica at N.
    first_byte_timeout: None keeps each replica's `first_byte_timeout_s` (else the default).
    """

    max_inflight: int | None = None
    first_byte_timeout: float | None = None


def admission_bound(spec: RoutedReplica, limits: Limits) -> int | None:
    """Requests the router may have in flight on the replica; None: unbounded."""
    if limits.max_inflight is not None:
        return limits.max_inflight or None
    if spec.planned_concurrency is None and spec.max_queue is None:
        return None  # a table from before admission limits: behave as it always did
    return (spec.planned_concurrency or spec.max_num_seqs) + (spec.max_queue or 0)


def retry_after(queue: int, capacity_rps: float | None) -> int:
    """Seconds a refused client should wait: the time the replica's queue takes to drain at its
    capacity (the wait an admitted request was promised), 1 to RETRY_AFTER_MAX whole seconds."""
    if not capacity_rps or queue <= 0:
        return 1
    return max(1, min(RETRY_AFTER_MAX, math.ceil(queue / capacity_rps)))


def health_transition(healthy: bool, fails: int, oks: int, ok: bool, fall: int, rise: int) -> tuple[bool, int, int]:
    """One health observation -> (healthy, consecutive fails, consecutive oks).

    A healthy replica is ejected after `fall` consecutive failures; an ejected one is
    re-admitted after `rise` consecutive successes (HAProxy's fall/rise).
    """
    if ok:
        oks, fails = oks + 1, 0
        if not healthy and oks >= rise:
            healthy = True
    else:
        fails, oks = fails + 1, 0
        if healthy and fails >= fall:
            healthy = False
    return healthy, fails, oks


class InFlight:
    """What a lease holds of a class candidate (a replica, or a disaggregated group, disagg.py): the
    requests in flight, their KV estimate kv and their load L (policies.py's notation)."""

    __slots__ = ("inflight", "inflight_kv", "load")

    def __init__(self) -> None:
        self.inflight = 0
        self.inflight_kv = 0.0  # kv
        self.load = 0.0  # L

    def acquire(self, kv_tokens: float, load: float) -> "Lease":
        self.inflight += 1
        self.inflight_kv += kv_tokens
        self.load += load
        return Lease(self, kv_tokens, load)

    def _release(self, kv_tokens: float, load: float) -> None:
        self.inflight -= 1
        self.inflight_kv -= kv_tokens
        self.load -= load
        if self.inflight == 0:
            # float sums drift; with nothing in flight the true values are zero
            self.inflight_kv = 0.0
            self.load = 0.0


class ReplicaState(InFlight):
    """Counters for one replica; see policies.py for the notation (kv_s, L_s, u_s)."""

    __slots__ = (
        "id", "model", "endpoint", "kv_capacity", "max_num_seqs", "prefill_tps", "decode_tps",
        "headers", "conn_key", "base_path", "head_static", "routable", "healthy", "fails", "oks",
        "obs_kv", "obs_running", "obs_waiting", "est_at_poll", "released_since_poll",
        "passive_until", "passive_backoff", "passive_fails", "max_inflight", "first_byte_timeout", "retry_after",
        "token_time", "role",
    )  # fmt: skip

    def __init__(self, spec: RoutedReplica, limits: Limits = Limits()):
        super().__init__()  # kv_s, L_s
        self.endpoint: str | None = None
        self.healthy = True  # optimistic until polling or passive failures say otherwise
        self.fails = 0
        self.oks = 0
        self.obs_kv: float | None = None
        self.obs_running: float | None = None
        self.obs_waiting: float | None = None
        self.est_at_poll = 0.0
        self.released_since_poll = 0
        # passive ejection: a replica whose /health is fine but whose requests fail or hang is
        # kept out until this monotonic time, however many health probes pass meanwhile
        self.passive_until = 0.0
        self.passive_backoff = PASSIVE_BACKOFF_MIN
        self.passive_fails = 0  # consecutive failed proxied requests, apart from probes
        self.update_spec(spec, limits)

    def update_spec(self, spec: RoutedReplica, limits: Limits = Limits()) -> None:
        """Take the static fields of a (re)loaded table entry."""
        self.id = spec.id
        self.model = spec.model
        self.role = spec.role  # prefill, decode (a member of a disaggregated group) or None
        self.endpoint = spec.endpoint.rstrip("/") if spec.endpoint else None
        self.conn_key = None
        self.base_path = b""
        host = b""
        if self.endpoint is not None:
            try:
                self.conn_key, host, self.base_path = parse_endpoint(self.endpoint)
            except ValueError as e:
                log.error("replica %s: %s; it gets no traffic", spec.id, e)
                self.endpoint = None
        self.kv_capacity = float(spec.kv_capacity_tokens)
        self.max_num_seqs = spec.max_num_seqs
        self.prefill_tps = spec.prefill_tokens_per_s
        self.decode_tps = spec.decode_tokens_per_s
        self.max_inflight = admission_bound(spec, limits)
        self.first_byte_timeout = limits.first_byte_timeout or spec.first_byte_timeout_s or DEFAULT_FIRST_BYTE_TIMEOUT
        queue = (self.max_inflight - (spec.planned_concurrency or 0)) if self.max_inflight else 0
        self.retry_after = retry_after(queue, spec.capacity_requests_per_s)
        # seconds per output token of one sequence in a full batch, doubled: the slowest decode
        # the plan allows, which bounds how long a plain (non-streamed) answer may take
        self.token_time = 2.0 * spec.max_num_seqs / spec.decode_tokens_per_s
        headers = {"Content-Type": "application/json"}
        if spec.api_key_env:
            key = os.environ.get(spec.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
            else:
                log.warning("replica %s: env var %s (api_key_env) is not set; sending no credentials", spec.id, spec.api_key_env)
        self.headers = headers  # for health polls (aiohttp)
        # the fixed part of every proxied request's head, prebuilt once (proxy.py adds the
        # request line, forwarded trace headers and Content-Length)
        self.head_static = b"Host: " + host + b"\r\n" + b"".join(
            f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()
        ) + b"User-Agent: hetcompile-router\r\n"
        self._refresh()

    def _refresh(self) -> None:
        # cached: the hot path reads one attribute instead of two
        self.routable = self.endpoint is not None and self.healthy

    # -- request accounting ------------------------------------------------------------------

    def has_room(self) -> bool:
        """Below its admission bound: a new request may be sent here."""
        return self.max_inflight is None or self.inflight < self.max_inflight

    def _release(self, kv_tokens: float, load: float) -> None:
        super()._release(kv_tokens, load)
        self.released_since_poll += 1

    def kv_usage(self) -> float:
        """u_s, the corrected KV usage fraction."""
        return corrected_kv_usage(self.inflight_kv, self.kv_capacity, self.obs_kv, self.est_at_poll)

    def blocked(self) -> bool:
        """vLLM reported waiting requests at the last poll and none of ours finished since."""
        return bool(self.obs_waiting) and self.released_since_poll == 0

    # -- health ------------------------------------------------------------------------------

    def observe_health(self, ok: bool, fall: int, rise: int) -> bool:
        """Record one health observation; returns True when the state flipped."""
        was = self.healthy
        if ok and not was and time.monotonic() < self.passive_until:
            ok = False  # still in its passive-ejection back-off: the probe does not count yet
        self.healthy, self.fails, self.oks = health_transition(self.healthy, self.fails, self.oks, ok, fall, rise)
        self._refresh()
        if was != self.healthy:
            log.warning("replica %s (%s) %s", self.id, self.endpoint, "re-admitted" if self.healthy else "ejected")
            return True
        return False

    def passive_failure(self, fall: int) -> None:
        """A proxied request failed to connect, got a 5xx or no first byte in time: counts toward
        ejection only.

        Re-admission is left to the active /health poll, so live traffic never probes a
        replica that was ejected.
        """
        self.passive_fails += 1
        if not self.healthy:
            return
        flipped = self.observe_health(False, fall, 1)  # live and probe failures add up
        if not flipped and self.passive_fails >= fall:
            # `fall` live failures in a row eject even when probes passed in between: a replica
            # whose /health answers 200 while its completions hang resets `fails` every poll,
            # and at low traffic its first-byte timeouts come further apart than the polls
            self.healthy, self.oks = False, 0
            self._refresh()
            log.warning("replica %s (%s) ejected: %d requests in a row failed", self.id, self.endpoint, fall)
            flipped = True
        if flipped:
            # ejected by live traffic (requests failed or timed out, whatever /health says):
            # stay out for a back-off that doubles on each such ejection, then a probe re-admits
            self.passive_fails = 0
            self.passive_until = time.monotonic() + self.passive_backoff
            self.passive_backoff = min(self.passive_backoff * 2, PASSIVE_BACKOFF_MAX)

    def passive_success(self) -> None:
        self.passive_fails = 0
        if self.healthy:
            self.fails = 0
            self.passive_backoff = PASSIVE_BACKOFF_MIN

    def observe_metrics(self, kv: float | None, running: float | None, waiting: float | None) -> None:
        self.obs_kv = kv
        self.obs_running = running
        self.obs_waiting = waiting
        self.est_at_poll = self.inflight_kv
        self.released_since_poll = 0


class Lease:
    """One request's hold on a replica (or a disaggregated group, disagg.py); `release` is
    idempotent so every exit path may call it."""

    __slots__ = ("replica", "kv_tokens", "load", "done")

    def __init__(self, replica: InFlight, kv_tokens: float, load: float):
        self.replica = replica
        self.kv_tokens = kv_tokens
        self.load = load
        self.done = False

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.replica._release(self.kv_tokens, self.load)
