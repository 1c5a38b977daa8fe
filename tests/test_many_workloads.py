"""A spec of thousands of small workloads (issue 32: 3,000 copies of the quickstart's chat at a few
requests an hour each): the build's verification judges what it can, and plan.md's chart stays
drawable. Unit tests on hand-built inputs; no build."""

from __future__ import annotations

from hetcompile.explain.pictures import MAX_BARS, _tpot_rows
from hetcompile.simulate.engine import Request
from hetcompile.simulate.tail import requests_for_quantile
from hetcompile.simulate.verify import REPLICATIONS, Targets, judge, pooled_misses

BOUND = Targets(workload="", kind="queueing", percentile="p99", q=0.99, ttft_s=1.0, tpot_s=None)


def _runs(name: str, ttfts: list[float]) -> list[list[Request]]:
    """`ttfts` as finished requests of workload `name`, dealt round-robin over the replications."""
    runs: list[list[Request]] = [[] for _ in range(REPLICATIONS)]
    for i, t in enumerate(ttfts):
        r = Request(i, name, 0.0, 100, 10)
        r.first_token, r.finish = t, t + 0.5
        runs[i % REPLICATIONS].append(r)
    return runs


def _small(n: int, per: int, slow: dict[str, int]) -> tuple[list[Targets], dict[str, list[list[Request]]]]:
    """n workloads of `per` requests each within the bound, but `slow[w]` of w's over it."""
    names = [f"w{i:03d}" for i in range(n)]
    ts = [Targets(w, BOUND.kind, BOUND.percentile, BOUND.q, BOUND.ttft_s, BOUND.tpot_s) for w in names]
    return ts, {w: _runs(w, [5.0] * slow.get(w, 0) + [0.1] * (per - slow.get(w, 0))) for w in names}


def test_a_workload_too_small_for_its_percentile_is_judged_with_the_others_of_its_targets() -> None:
    ts, runs = _small(200, 5, {"w007": 1})
    assert 5 < requests_for_quantile(0.99)
    # alone, one request of five over the bound is a p99 missed, and no replan gives it more requests
    assert judge(ts[7], runs["w007"])[1]
    # pooled: 1 of 1,000 requests over it, within a p99 at the confidence bound
    pooled = pooled_misses(ts, runs)
    assert set(pooled) == {t.workload for t in ts} and not any(pooled.values())


def test_a_pooled_miss_is_a_miss_of_every_member() -> None:
    ts, runs = _small(200, 5, {f"w{i:03d}": 1 for i in range(0, 200, 4)})  # 5% of all requests over the bound
    pooled = pooled_misses(ts, runs)
    assert all(len(m) == 1 and m[0].workload == w and m[0].what == "TTFT" for w, m in pooled.items())
    assert len(pooled) == 200


def test_workloads_with_enough_requests_or_other_targets_are_judged_alone() -> None:
    ts, runs = _small(3, requests_for_quantile(0.99), {})
    assert pooled_misses(ts, runs) == {}  # each has the requests its p99 needs
    lone = Targets("solo", "slo", "p99", 0.99, 2.0, None)  # small, but no other workload has its targets
    assert pooled_misses([lone], {"solo": _runs("solo", [0.1] * 5)}) == {}


def test_the_tpot_chart_draws_one_bar_per_distinct_latency_beyond_max_bars() -> None:
    slo = {f"c{i}": 0.05 for i in range(3000)} | {"rag": None}
    few = _tpot_rows("r0", [("c0", 0.03), ("rag", 0.04)], slo)
    assert few == [("r0", "c0", 0.03, 0.05), ("r0", "rag", 0.04, None)]
    many = _tpot_rows("r0", [(f"c{i}", 0.03) for i in range(3000)] + [("rag", 0.04)], slo)
    assert len(many) == 2 < MAX_BARS
    assert many == [("r0", "3000 workloads (c0, ...)", 0.03, 0.05), ("r0", "rag", 0.04, None)]


def test_the_build_summary_names_a_few_workloads_missed_and_nearest_first() -> None:
    from hetcompile.cli import SUMMARY_WORKLOADS, _summary_workloads
    from hetcompile.plan.doc import VerifiedWorkload

    def vw(i: int, ttft: float, met: bool = True) -> VerifiedWorkload:
        return VerifiedWorkload(name=f"chat{i:04d}", target="queueing", percentile="p99", ttft_target_s=1.0, tpot_target_s=None,
                                ttft_s=ttft, tpot_s=None, p99_ttft_s=ttft, p99_tpot_s=None, attainment=1.0, met=met, factor=1.0)

    ws = [vw(i, 0.1 + (i % 7) / 100) for i in range(3000)]
    ws[1234] = vw(1234, 2.0, met=False)
    ws[42] = vw(42, 0.9)
    shown = _summary_workloads(ws)
    assert len(shown) == SUMMARY_WORKLOADS and [w.name for w in shown] == sorted(w.name for w in shown)
    assert {"chat1234", "chat0042"} <= {w.name for w in shown}  # the miss, then the nearest its bound
    assert _summary_workloads(ws[:3]) == ws[:3]
