"""The router's own Prometheus metrics, in the text exposition format (version 0.0.4).

Hand-written, not on prometheus_client: counters, gauges and histograms keyed by a tuple of
label values. Updating one is a dict lookup and an add on the hot path (0.14 us a counter, 0.22 us
a histogram); prometheus_client's labelled updates take a lock and build a child (2.6 and 1.7 us),
8 us more per request, 4% of the 200 us of router CPU a request gets at 5,000 req/s
(`python bench/metrics_cost.py`). Rendering happens only when /metrics is scraped. Per-replica gauges (in flight, KV usage, health) are not stored:
they are read from the live table at scrape time.

Histograms follow the format: cumulative `_bucket{le=...}` series ending in `le="+Inf"`,
then `_sum` and `_count`; a bucket counts observations <= its bound.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


def _fmt(v: float) -> str:
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(float(v))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()):
        self.name = name
        self.help = help
        self.labels = tuple(labels)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()):
        if not name.endswith("_total"):
            raise ValueError("counter names end in _total")
        super().__init__(name, help, labels)
        self.values: dict[tuple, float] = {}

    def inc(self, key: tuple = (), v: float = 1.0) -> None:
        self.values[key] = self.values.get(key, 0.0) + v

    def get(self, key: tuple = ()) -> float:
        return self.values.get(key, 0.0)

    def render(self) -> list[str]:
        out = self.header()
        for key in sorted(self.values):
            out.append(f"{self.name}{_labels(self.labels, key)} {_fmt(self.values[key])}")
        return out


class Gauge(_Metric):
    """A gauge whose samples come from a callback at scrape time (or from `set`)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), fn: Callable[[], Iterable[tuple[tuple, float]]] | None = None):
        super().__init__(name, help, labels)
        self.fn = fn
        self.values: dict[tuple, float] = {}

    def set(self, key: tuple, v: float) -> None:
        self.values[key] = v

    def render(self) -> list[str]:
        out = self.header()
        samples = dict(self.values)
        if self.fn is not None:
            samples.update(self.fn())
        for key in sorted(samples):
            out.append(f"{self.name}{_labels(self.labels, key)} {_fmt(samples[key])}")
        return out


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS):
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        # per label key: [per-bucket counts (last = above every bound), sum, count]
        self.series: dict[tuple, list] = {}

    def observe(self, key: tuple, v: float) -> None:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
        s[0][bisect_left(self.buckets, v)] += 1
        s[1] += v
        s[2] += 1

    def count(self, key: tuple = ()) -> int:
        s = self.series.get(key)
        return 0 if s is None else s[2]

    def render(self) -> list[str]:
        out = self.header()
        for key in sorted(self.series):
            counts, total, n = self.series[key]
            acc = 0
            for bound, c in zip(self.buckets, counts):
                acc += c
                le = 'le="' + _fmt(bound) + '"'
                out.append(f"{self.name}_bucket{_labels(self.labels, key, le)} {acc}")
            inf = 'le="+Inf"'
            out.append(f"{self.name}_bucket{_labels(self.labels, key, inf)} {n}")
            out.append(f"{self.name}_sum{_labels(self.labels, key)} {_fmt(total)}")
            out.append(f"{self.name}_count{_labels(self.labels, key)} {n}")
        return out


M = TypeVar("M", bound=_Metric)


class Registry:
    def __init__(self) -> None:
        self.metrics: list[_Metric] = []

    def add(self, m: M) -> M:
        if any(x.name == m.name for x in self.metrics):
            raise ValueError(f"duplicate metric {m.name}")
        self.metrics.append(m)
        return m

    def render(self) -> str:
        lines: list[str] = []
        for m in self.metrics:
            lines.extend(m.render())
        return "\n".join(lines) + "\n"


P = "hetcompile_router_"


class RouterMetrics:
    """Every metric the router exports. `replicas` returns the live ReplicaStates at scrape time."""

    def __init__(self, replicas: Callable[[], Iterable] = lambda: ()):
        self._replicas = replicas
        r = self.registry = Registry()
        self.requests = r.add(Counter(P + "requests_total", "Requests answered, by model, workload class and HTTP status.", ("model", "class", "code")))
        self.errors = r.add(Counter(P + "errors_total", "Errors by kind (upstream_connect, first_byte_timeout, upstream_5xx, stream_broken, no_replica, bad_request, client_disconnect, ...).", ("kind",)))
        self.retries = r.add(Counter(P + "retries_total", "Failed attempts that were retried (on another replica while one is left), by the replica that failed.", ("replica",)))
        self.choices = r.add(Counter(P + "policy_choices_total", "Replica choices, by policy and replica.", ("policy", "replica")))
        self.kv_overflow = r.add(Counter(P + "kv_overflow_total", "kv-aware choices made with every candidate masked, by model and class.", ("model", "class")))
        self.rejected = r.add(Counter(P + "rejected_total", "New requests refused with 429 because every candidate replica was at its admission bound, by model and class.", ("model", "class")))
        self.reloads = r.add(Counter(P + "reloads_total", "Routing table reloads, by result.", ("result",)))
        self.latency = r.add(Histogram(P + "request_duration_seconds", "Time from request received to response finished, by model.", ("model",)))
        self.ttfb = r.add(Histogram(P + "upstream_first_byte_seconds", "Time from sending upstream to the first response byte, by replica.", ("replica",)))
        # prefill/decode disaggregation (disagg.py): each phase of a request routed to a group
        self.pd_phase = r.add(Histogram(P + "pd_phase_duration_seconds", "Successful phases of requests routed to a disaggregated group: prefill from sending to its kv_transfer_params read, decode from sending to the response finished, by group and role.", ("group", "role")))
        self.pd_attempts = r.add(Counter(P + "pd_attempts_total", "Phase attempts of requests routed to a disaggregated group, by group, role (prefill, decode) and result (ok; failed; no_kv_params: the prefill handed no KV over and the decode computed the prompt itself; client_error: the prefill refused the request and the client got its answer).", ("group", "role", "result")))
        r.add(Gauge(P + "inflight_requests", "Requests in flight, by replica.", ("replica",), fn=lambda: self._per_replica(lambda s: s.inflight)))
        r.add(Gauge(P + "max_inflight", "Admission bound: requests in flight beyond which new ones are refused (absent: unbounded), by replica.", ("replica",),
                    fn=lambda: [((s.id,), float(s.max_inflight)) for s in self._replicas() if s.max_inflight is not None]))
        r.add(Gauge(P + "first_byte_timeout_seconds", "Seconds an attempt may wait for its first byte before failing over, by replica.", ("replica",),
                    fn=lambda: self._per_replica(lambda s: s.first_byte_timeout)))
        r.add(Gauge(P + "inflight_kv_tokens", "Estimated KV tokens of requests in flight (kv_s), by replica.", ("replica",), fn=lambda: self._per_replica(lambda s: s.inflight_kv)))
        r.add(Gauge(P + "kv_usage_ratio", "Corrected KV usage fraction u_s, by replica.", ("replica",), fn=lambda: self._per_replica(lambda s: s.kv_usage())))
        r.add(Gauge(P + "minmax_load", "min-max workload L_s of requests in flight, by replica.", ("replica",), fn=lambda: self._per_replica(lambda s: s.load)))
        r.add(Gauge(P + "replica_healthy", "1 if the replica is admitted by health checks.", ("replica",), fn=lambda: self._per_replica(lambda s: 1.0 if s.healthy else 0.0)))
        r.add(Gauge(P + "replica_routable", "1 if the replica has an endpoint and is healthy.", ("replica",), fn=lambda: self._per_replica(lambda s: 1.0 if s.routable else 0.0)))
        r.add(Gauge(P + "replica_role", "1 for a replica that runs one phase of a disaggregated group, labelled with that role (prefill, decode): join per-replica series on it.", ("replica", "role"),
                    fn=lambda: [((s.id, s.role), 1.0) for s in self._replicas() if s.role is not None]))
        self.table_info = r.add(Gauge(P + "table_info", "The loaded routing table.", ("plan", "spec_hash")))

    def _per_replica(self, f) -> list[tuple[tuple, float]]:
        return [((s.id,), float(f(s))) for s in self._replicas()]

    def render(self) -> str:
        return self.registry.render()
