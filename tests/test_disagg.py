"""perf/disagg.py: one prefill instance and one decode instance of a disaggregated group, sized with
the step model every other estimate uses (issue 35, item 1). Small replica models straight from the
catalog: no spec, no build."""

from __future__ import annotations

import math

import pytest

from hetcompile.perf import analytic, catalog
from hetcompile.perf.capacity import chain_capacity, concurrency, prefill_time
from hetcompile.perf.disagg import (
    decode_capacity,
    erlang_c,
    kv_transfer_s,
    prefill_capacity,
    size,
    slot_wait,
    tpot,
)


def _rm(gpu: str = "H100", tp: int = 1, model: str = "llama-3.1-8b", max_num_seqs: int = 256):
    _, _, arch = catalog.lookup_model(model)
    g = catalog.lookup_gpu(gpu)
    e = analytic.perf_entry(model, arch, 2, g, tp, 0.9, 16384)
    kv = analytic.stage_kv_tokens(e, arch.layers, True, True)
    return arch, analytic.replica_model(arch, 2, [(g, tp, arch.layers, kv)], 5e-6, 100e9, max_num_seqs)


def test_erlang_c_matches_the_closed_forms() -> None:
    assert erlang_c(1, 0.6) == pytest.approx(0.6)  # M/M/1: an arrival waits with probability rho
    assert erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)  # 2 servers at a = 1: a^2/2 / (1 + a + a^2/2) x 2/(2-a) ...
    assert erlang_c(4, 0.0) == 0.0 and erlang_c(4, 4.0) == 1.0
    assert 0.0 < erlang_c(2000, 1900.0) < 1.0  # the recursion stays finite for thousands of slots


def test_slot_wait_is_zero_when_few_wait_and_grows_with_load() -> None:
    assert slot_wait(100, 0.1, 1.0, 0.99) == 0.0  # 10% busy: fewer than 1% wait at all
    waits = [slot_wait(10, 1.0, lam, 0.99) for lam in (8.0, 9.0, 9.5, 9.9)]
    assert waits == sorted(waits) and waits[-1] > waits[0] > 0
    assert math.isinf(slot_wait(10, 1.0, 10.0, 0.99))


def test_decode_runs_at_most_the_tpot_target_and_one_more_sequence_would_break_it() -> None:
    _, rm = _rm()
    I, O = 2048, 256
    context = I + O / 2
    free = decode_capacity(rm, I, O)
    assert free.max_num_seqs == math.floor(concurrency(rm, I, O))
    target = 0.5 * (tpot(rm, 1.0, context) + free.tpot_s)  # between one sequence's TPOT and the full batch's
    d = decode_capacity(rm, I, O, tpot_target=target)
    assert d.binding == "slo-tpot" and d.tpot_s <= target < tpot(rm, d.max_num_seqs + 1, context)
    assert d.full_rps == pytest.approx(d.max_num_seqs / (O * d.tpot_s))
    assert d.requests_per_s < free.requests_per_s  # a tighter target never serves more
    assert decode_capacity(rm, I, O, tpot_target=1e-5).binding == "slo-unmeetable"


def test_no_prompt_stalls_a_decode_step() -> None:
    """The point of the split: at the same sequences in flight, a decode instance's TPOT is below the
    aggregated replica's, whose steps also carry the prompts' chunks (long prompts: far below)."""
    _, rm = _rm()
    for I in (512, 8192):
        C = 32.0
        agg = chain_capacity(rm, I, 256, max_concurrency=C).tpot_s
        assert tpot(rm, C, I + 128) < agg
    long_gain = chain_capacity(rm, 8192, 256, max_concurrency=32.0).tpot_s / tpot(rm, 32.0, 8192 + 128)
    short_gain = chain_capacity(rm, 512, 256, max_concurrency=32.0).tpot_s / tpot(rm, 32.0, 512 + 128)
    assert long_gain > short_gain


def test_prefill_is_sized_to_its_ttft_budget() -> None:
    _, rm = _rm()
    idle = prefill_time(rm, 4096)
    free = prefill_capacity(rm, 4096)
    assert free.binding == "headroom" and free.idle_s == pytest.approx(idle)
    budget = idle + 0.3 * (free.ttft_s - idle)  # less than the wait at the headroom's load allows
    p = prefill_capacity(rm, 4096, ttft_budget=budget)
    assert p.binding == "slo-ttft" and p.ttft_s <= budget and 0 < p.requests_per_s < free.requests_per_s
    assert prefill_capacity(rm, 4096, ttft_budget=0.5 * idle).binding == "slo-unmeetable"


def test_kv_transfer_moves_the_uncached_prompt_over_the_link() -> None:
    arch, rm = _rm()
    per_token = arch.layers * 2 * arch.kv_heads * arch.head_dim * 2  # K and V, every layer, bf16
    assert per_token == 131072  # Llama-3.1-8B: 128 KiB per token
    assert kv_transfer_s(4096, per_token, 1e-4, 50e9) == pytest.approx(1e-4 + 4096 * 131072 / 50e9)
    fast = size(rm, rm, 4096, 256, 0, per_token, (1e-4, 50e9), 2.0, 0.05)
    slow = size(rm, rm, 4096, 256, 0, per_token, (1e-4, 1e9), 2.0, 0.05)
    cached = size(rm, rm, 4096, 256, 3072, per_token, (1e-4, 1e9), 2.0, 0.05)
    assert fast.transfer_s < cached.transfer_s < slow.transfer_s
    assert slow.ttft_s > fast.ttft_s or slow.prefill.requests_per_s < fast.prefill.requests_per_s


def test_a_sized_group_meets_both_targets_at_its_loads() -> None:
    arch, rm = _rm()
    per_token = arch.layers * 2 * arch.kv_heads * arch.head_dim * 2
    g = size(rm, rm, 2048, 256, 0, per_token, (1e-4, 50e9), 1.0, 0.03)
    assert g.feasible and g.ttft_s <= 1.0 + 1e-9 and g.tpot_s <= 0.03
    # a target the transfer and the decode side already spend is unmeetable on the prefill side
    tight = size(rm, rm, 2048, 256, 0, per_token, (1e-4, 50e9), 0.9 * g.transfer_s, 0.03)
    assert not tight.feasible and tight.prefill.binding == "slo-unmeetable"


def test_a_sized_group_holds_its_targets_in_the_simulator() -> None:
    """The analytic sizing against the engine model (simulate/disagg.py): 7 prefill replicas on one H100
    each and one decode replica on four, at the load perf/disagg sized them for, keep every request's
    p99 TTFT and TPOT within the targets, and every request finishes (no queue grows)."""
    from hetcompile.simulate.disagg import replay_group

    arch, rp = _rm("H100", 1)
    _, rd = _rm("H100", 4)
    per_token = arch.layers * 2 * arch.kv_heads * arch.head_dim * 2
    g = size(rp, rd, 8192, 256, 0, per_token, (5e-5, 50e9), 2.0, 0.02)
    n_prefill = math.ceil(g.decode.requests_per_s / g.prefill.requests_per_s)
    rate = min(n_prefill * g.prefill.requests_per_s, g.decode.requests_per_s)
    run = replay_group(rp, rd.model_copy(update={"max_num_seqs": g.decode.max_num_seqs}), n_prefill, 1, 8192, 256,
                       rate, g.transfer_s, 200.0, seed=1)
    assert run.arrived > 3000 and run.completed == run.arrived
    assert run.quantile(run.ttft_s, 0.99) <= 2.0
    assert run.quantile(run.tpot_s, 0.99) <= 0.02
    # the decode side runs decode-only steps: its TPOT never shows a prompt's chunk
    assert max(run.tpot_s) <= g.tpot_s * 1.001


def test_without_a_transfer_the_group_is_faster_and_a_slow_link_shows_in_ttft() -> None:
    from hetcompile.simulate.disagg import replay_group

    _, rm = _rm("H100", 1)
    runs = [replay_group(rm, rm, 2, 1, 4096, 128, 4.0, transfer, 100.0, seed=0) for transfer in (0.0, 0.5)]
    p50 = [r.quantile(r.ttft_s, 0.5) for r in runs]
    assert p50[1] - p50[0] == pytest.approx(0.5, abs=0.05)
    assert runs[0].quantile(runs[0].tpot_s, 0.5) == pytest.approx(runs[1].quantile(runs[1].tpot_s, 0.5), rel=0.05)


def test_the_engines_decode_runs_give_the_step_by_step_results_in_a_group() -> None:
    """A prefill's completion submits a request to a decode replica that may be inside a decode run
    computed before that submission existed (Driver.at_from_step cuts it back): with and without
    decode runs the group's every TTFT and TPOT are the same, bit for bit."""
    from hetcompile.simulate.disagg import replay_group

    _, rm = _rm("H100", 1)
    for transfer in (0.0, 0.02):
        fast, slow = (replay_group(rm, rm, 2, 1, 4096, 128, 4.0, transfer, 60.0, seed=3, decode_runs=runs)
                      for runs in (True, False))
        assert fast.ttft_s == slow.ttft_s and fast.tpot_s == slow.tpot_s
