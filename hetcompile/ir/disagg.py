"""A disaggregated group's KV transfer in one problem: one formula for the profile pass that sizes
the group and the plan document that states it (issue 35; perf/disagg.py has the model)."""

from __future__ import annotations

from hetcompile.ir.problem import PerfEntry, Problem
from hetcompile.perf.disagg import kv_transfer_s


def transfer_seconds(ir: Problem, table: tuple[PerfEntry, ...], workload: str, region: str) -> float:
    """T_KV of one prompt of `workload` between two nodes of `region`: every layer's K and V of its
    prompt (the memory table's bytes per token-layer) over the spec's intra-region link."""
    w = next(x for x in ir.workloads if x.name == workload)
    kv = next(e.kv_bytes_per_token_layer for e in table if e.model == w.model) * ir.model(w.model).arch.layers
    link = next(l for l in ir.links if l.a == region and l.b == region)
    return kv_transfer_s(w.input_tokens, kv, link.latency, link.bandwidth)
