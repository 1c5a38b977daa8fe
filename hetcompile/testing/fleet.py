"""A simulated running fleet: the plan's replicas at a hidden true speed and demand, exporting the
/metrics that vLLM and hetcompile's router export, so the observe / replan loop is testable end to
end without GPUs (issue 34).

The fleet replays `warmup` + `duration` seconds of Poisson arrivals (and more after, so the load
stays on) at `demand[w]` x the plan's served rate of each workload w, through the plan's routing, on replicas whose step times are `speed` x what the
plan's step model says (perf/stepmodel.scaled). `metrics(target, t)` is the exposition text a
scrape at simulated time t would read: counters and histograms over the requests finished by t,
gauges of the requests in the engine at t. A request's inter-token intervals are taken as even
((finish - first token) / (O - 1) each), which keeps the ITL histogram's sum and count exact.
`fetch` and `clock`/`sleep` plug it into observe/observe.sample with simulated time, starting
after the warm-up: observe sees a fleet that has been running, as in production.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from hetcompile.observe.observe import ScrapeError
from hetcompile.perf.stepmodel import scaled
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.step_record import record_of
from hetcompile.simulate.engine import Request
from hetcompile.simulate.run import poisson_arrivals, replay

# vLLM V1's default buckets (vllm/v1/metrics/loggers.py) for the metrics observe reads
TOKEN_BUCKETS = tuple(float(m * 10 ** e) for e in range(0, 6) for m in (1, 2, 5))
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


def true_plan(plan: PlanDoc, speed: float, demand: dict[str, float]) -> PlanDoc:
    """The plan as the fleet really runs it: step times x speed, served rates x demand[w]."""
    reps = tuple(r.model_copy(update={"step_model": record_of(scaled(m, speed))}) if (m := r.replica_model()) else r
                 for r in plan.replicas)
    works = tuple(w.model_copy(update={"served_requests_per_s": w.served_requests_per_s * demand.get(w.name, 1.0)})
                  for w in plan.workloads)
    return plan.model_copy(update={"replicas": reps, "workloads": works})


def _hist(name: str, labels: str, values: list[tuple[float, float]], bounds: tuple[float, ...]) -> list[str]:
    """(value, weight) observations as a cumulative histogram's lines."""
    counts = [0.0] * (len(bounds) + 1)
    for v, n in values:
        counts[bisect.bisect_left(bounds, v)] += n
    out, cum = [], 0.0
    for b, c in zip(bounds + (math.inf,), counts):
        cum += c
        le = "+Inf" if math.isinf(b) else repr(b)
        out.append(f'{name}_bucket{{{labels},le="{le}"}} {cum}')
    out.append(f"{name}_sum{{{labels}}} {sum(v * n for v, n in values)}")
    out.append(f"{name}_count{{{labels}}} {sum(n for _, n in values)}")
    return out


@dataclass
class SimulatedFleet:
    plan: PlanDoc
    speed: float = 1.0
    demand: dict[str, float] = field(default_factory=dict)
    duration: float = 600.0
    seed: int = 0
    warmup: float = 300.0  # the fleet has run this long when the first scrape comes: a running fleet, not an empty one
    down: set[str] = field(default_factory=set)  # targets that do not answer
    garbled: set[str] = field(default_factory=set)  # targets whose /metrics is not Prometheus text
    now: float = 0.0

    def __post_init__(self) -> None:
        truth = true_plan(self.plan, self.speed, self.demand)
        span = self.warmup + self.duration
        self.requests, _ = replay(truth, poisson_arrivals(truth, span * 1.5, self.seed), span)
        self.now = self.warmup
        self.kv = {r.id: max(r.kv_capacity_tokens, 1) for r in self.plan.replicas}
        self.model_of = {r.id: r.model for r in self.plan.replicas}
        self.served = {r.id: r.served_name for r in self.plan.replicas}
        self.workload_model = {w.name: w.model for w in self.plan.workloads}

    # -- observe's hooks: simulated time, no waiting
    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def url(self, target: str) -> str:
        return f"http://fleet.invalid/{target}/metrics"

    def fetch(self, url: str, headers: dict[str, str]) -> str:
        target = url.split("/")[-2]
        if target in self.down:
            raise ScrapeError("unreachable (connection refused)")
        if target in self.garbled:
            return "<html>not metrics</html>\n"
        return self.router_metrics(self.now) if target == "router" else self.replica_metrics(target, self.now)

    # -- the exposition texts
    def _done(self, t: float, replica: str | None = None) -> list[Request]:
        return [q for q in self.requests if q.finish is not None and q.finish <= t and (replica is None or q.replica == replica)]

    def replica_metrics(self, rid: str, t: float) -> str:
        done = self._done(t, rid)
        inside = [q for q in self.requests if q.replica == rid and q.submitted <= t and (q.finish is None or q.finish > t)]
        running = [q for q in inside if q.first_token is not None and q.first_token <= t]
        labels = f'engine="0",model_name="{self.served[rid]}"'
        lines = [f"vllm:request_success_total{{{labels},finished_reason=\"length\"}} {float(len(done))}",
                 f"vllm:num_requests_running{{{labels}}} {float(len(running))}",
                 f"vllm:num_requests_waiting{{{labels}}} {float(len(inside) - len(running))}",
                 f"vllm:kv_cache_usage_perc{{{labels}}} {min(1.0, sum(q.input_tokens + q.output_tokens / 2 for q in inside) / self.kv[rid])}"]
        lines += _hist("vllm:request_prompt_tokens", labels, [(q.input_tokens, 1.0) for q in done], TOKEN_BUCKETS)
        lines += _hist("vllm:request_generation_tokens", labels, [(q.output_tokens, 1.0) for q in done], TOKEN_BUCKETS)
        lines += _hist("vllm:time_to_first_token_seconds", labels, [(q.first_token - q.arrival, 1.0) for q in done if q.first_token is not None],
                       TTFT_BUCKETS)
        itl = [((q.finish - q.first_token) / (q.output_tokens - 1), q.output_tokens - 1.0) for q in done
               if q.first_token is not None and q.finish is not None and q.output_tokens > 1]
        lines += _hist("vllm:inter_token_latency_seconds", labels, itl, ITL_BUCKETS)
        lines += _hist("vllm:request_time_per_output_token_seconds", labels, [(v, 1.0) for v, _ in itl], ITL_BUCKETS)
        return "\n".join(lines) + "\n"

    def router_metrics(self, t: float) -> str:
        counts: dict[str, int] = {}
        for q in self._done(t):
            counts[q.workload] = counts.get(q.workload, 0) + 1
        return "".join(f'hetcompile_router_requests_total{{model="{self.workload_model[w]}",class="{w}",code="200"}} {float(n)}\n'
                       for w, n in sorted(counts.items()))
