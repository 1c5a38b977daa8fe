"""Bench: what one metric update costs on the router's hot path, ours against prometheus_client.

    python bench/metrics_cost.py [--n 200000]

The router (hetcompile/router/metrics.py) updates two labelled counters and two labelled
histograms per request. This times each operation both ways in one process, interleaved, and
prints microseconds per operation, their ratio, and the difference per request. prometheus_client
is not a hetcompile dependency: `pip install prometheus_client` to run this.
"""

from __future__ import annotations

import argparse
import timeit

from hetcompile.router.metrics import LATENCY_BUCKETS, Counter, Histogram

PER_REQUEST = {"counter": 2, "histogram": 2}  # requests_total + policy_choices_total; duration + first byte


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    n = ap.parse_args().n
    import prometheus_client as pc

    reg = pc.CollectorRegistry()
    theirs = {"counter": pc.Counter("bench_requests", "h", ("model", "class", "code"), registry=reg),
              "histogram": pc.Histogram("bench_seconds", "h", ("model",), registry=reg, buckets=LATENCY_BUCKETS)}
    ours = {"counter": Counter("bench_requests_total", "h", ("model", "class", "code")),
            "histogram": Histogram("bench_seconds", "h", ("model",))}
    ops = {
        ("counter", "ours"): lambda: ours["counter"].inc(("m", "chat", "200")),
        ("counter", "prometheus_client"): lambda: theirs["counter"].labels("m", "chat", "200").inc(),
        ("histogram", "ours"): lambda: ours["histogram"].observe(("m",), 0.123),
        ("histogram", "prometheus_client"): lambda: theirs["histogram"].labels("m").observe(0.123),
    }
    best = {k: min(timeit.repeat(f, number=n // 5, repeat=5)) / (n // 5) * 1e6 for k, f in ops.items()}
    extra = 0.0
    for kind in ("counter", "histogram"):
        a, b = best[(kind, "ours")], best[(kind, "prometheus_client")]
        extra += PER_REQUEST[kind] * (b - a)
        print(f"{kind:9}  ours {a:.3f} us  prometheus_client {b:.3f} us  ratio {b / a:.1f}x")
    print(f"per request ({PER_REQUEST['counter']} counters, {PER_REQUEST['histogram']} histograms): "
          f"+{extra:.1f} us with prometheus_client")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
