"""bench/fidelity.py: every published row is cited and replayable, and the held-out error cannot regress."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import yaml

from conftest import ROOT

MODES = {"closed_loop", "open_loop", "burst", "offline_batch", "static_batch"}
METRIC_KEYS = {"throughput", "tpot_ms", "itl_ms", "ttft_ms", "req_s", "total_tok_s", "batch_latency_s"}
# CI gate: a held-out median may exceed the committed figure by this much (absolute, as a fraction)
# before the test fails; the simulation is deterministic, so this only absorbs float noise across
# numpy versions. Improve the model, then `python bench/fidelity.py --update-figures` on purpose.
GATE_TOLERANCE = 0.005


def _bench():
    spec = importlib.util.spec_from_file_location("fidelity", ROOT / "bench/fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows() -> list[dict]:
    return yaml.safe_load((ROOT / "bench/data/fidelity.yaml").read_text())


def test_rows_are_cited_and_well_formed() -> None:
    from hetcompile.perf import catalog

    rows = _rows()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    for r in rows:
        rid = r["id"]
        assert r["source"].startswith("https://"), rid
        assert r.get("note") and r.get("engine"), rid
        assert catalog.lookup_model(r["model"]) is not None and catalog.lookup_gpu(r["gpu"]) is not None, rid
        assert r["mode"] in MODES, rid
        assert r["metrics"] and set(r["metrics"]) <= METRIC_KEYS, rid
        assert r["input"] > 0 and r["output"] > 0 and r["tp"] >= 1, rid
        if r["mode"] == "open_loop":
            assert r["rate"] > 0 and r.get("concurrency") is None, rid
        elif r["mode"] == "closed_loop":
            assert r["concurrency"] >= 1 and not r.get("rate"), rid
        else:
            assert (r.get("concurrency") or r.get("num_prompts")) and not r.get("rate"), rid


def test_excluded_metrics_carry_a_reason_and_leave_every_column() -> None:
    """A metric a source contradicts is left out only with its reason written in the data file, and
    then from the measured numbers every column is built from (train, held-out, LOGO, uncal.)."""
    fid = _bench()
    rows = _rows()
    excluded = [r for r in rows if r.get("excluded_metrics")]
    assert excluded  # dennislee22's TTFTs (prefix-cache hits below the FLOP floor)
    for r in excluded:
        for m, why in r["excluded_metrics"].items():
            assert m in r["metrics"] and isinstance(why, str) and len(why) > 80, r["id"]
        got = fid.measured(r)
        assert not set(r["excluded_metrics"]) & set(got), r["id"]
        kept = {k: v for k, v in r.items() if k != "excluded_metrics"}
        assert set(r["excluded_metrics"]) <= set(fid.measured(kept)), r["id"]  # it would count otherwise


def test_v0_rows_get_the_v0_host_costs() -> None:
    """Rows measured before vLLM 0.8 run with the V0 step / sequence / request overheads; V1 rows (and
    so plans) with the shipped V1 ones, except that a V1 row measured through the in-process engine
    (no HTTP server) pays its own per-request cost; a batch submitted to LLM.generate pays none."""
    fid = _bench()
    rows, _ = fid.usable(_rows())
    params = fid.catalog_params(rows)
    v0 = next(r for r in rows if fid.engine_core(r) == "v0" and r["mode"] == "open_loop")
    v1 = next(r for r in rows if fid.engine_core(r) == "v1" and r["mode"] == "burst")
    offline = next(r for r in rows if r["mode"] == "offline_batch")
    m0, m1, mo = (fid.replica(r, params) for r in (v0, v1, offline))
    assert (m0.step_overhead_s, m0.seq_overhead_s, m0.request_overhead_s) == \
        (params.v0_step_overhead_s, params.v0_seq_overhead_s, params.v0_request_overhead_s)
    assert (m1.step_overhead_s, m1.seq_overhead_s, m1.request_overhead_s) == \
        (params.step_overhead_s, params.seq_overhead_s, params.request_overhead_s)
    assert params.v0_request_overhead_s != params.request_overhead_s and mo.request_overhead_s == 0.0
    inproc = next(r for r in rows if fid.engine_core(r) == "v1" and fid.frontend(r) == "in_process")
    assert fid.frontend(v1) == "http"
    assert fid.replica(inproc, params).request_overhead_s == params.inproc_request_overhead_s != params.request_overhead_s


def test_the_set_covers_real_load() -> None:
    """Issue 17 item 1: >= 80 usable rows, >= 5 GPU types, 3+ model sizes, TP 1-8, load 1..128+."""
    fid = _bench()
    rows, _ = fid.usable(_rows())
    assert len(rows) >= 80
    assert len({r["gpu"] for r in rows}) >= 5
    assert len({r["model"] for r in rows}) >= 3
    assert {1, 2, 4, 8} <= {r["tp"] for r in rows}
    loads = [r.get("concurrency") or r.get("num_prompts") or 0 for r in rows if r["mode"] != "open_loop"]
    assert min(loads) == 1 and max(loads) >= 128


def test_split_is_deterministic_and_stratified() -> None:
    from hetcompile.perf import calibrate

    rows = _rows()
    train, held = calibrate.split(rows)
    again, _ = calibrate.split(list(reversed(rows)))
    assert [r["id"] for r in train] == [r["id"] for r in again]
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    for g in {r["gpu"] for r in rows}:
        n = sum(r["gpu"] == g for r in rows)
        k = sum(r["gpu"] == g for r in train)
        assert k == max(1, round(calibrate.TRAIN_SHARE * n)), g


def test_fit_recovers_known_parameters() -> None:
    """calibrate.fit on synthetic decode/prefill times made with known efficiencies and overheads
    (the roofline shape: weights / (B eta_m) + o + q m, prompt FLOPs / (F eta_c) + r) finds them
    (without the ridge toward the prior, which would pull them toward the start by design)."""
    from hetcompile.perf import calibrate

    truth = calibrate.Params(eta={"X": (0.66, 0.52), "Y": (0.85, 0.7)}, step_overhead_s=1.3e-3,
                             seq_overhead_s=30e-6, request_overhead_s=15e-3)
    # two model sizes (weight bytes W) per GPU: what separates eta_m from the step overhead o
    points = [(g, w, m, p) for g in ("X", "Y") for w in (1e9, 16e9) for m in (1, 8, 32, 128) for p in (128, 1024, 4096)]

    def predict(par: calibrate.Params, g: str, w: float, m: int, p: int) -> tuple[float, float]:
        em, ec = par.eta[g]
        bw, fl = (2e12, 300e12) if g == "X" else (1e12, 150e12)
        tpot = w / (bw * em) + m * w / 8000 / (bw * em) + par.step_overhead_s + par.seq_overhead_s * m
        ttft = p * w / (fl * ec) + par.request_overhead_s
        return tpot, ttft

    meas = {x: predict(truth, *x) for x in points}

    def res(par: calibrate.Params) -> list[tuple[float, float, float]]:
        out = []
        for x in points:
            t, f = predict(par, *x)
            out += [(t, meas[x][0], 1.0), (f, meas[x][1], 1.0)]
        return out

    got = calibrate.fit(res, ["X", "Y"], calibrate.Params(eta={"X": (0.8, 0.5), "Y": (0.8, 0.5)}), iterations=40, ridge=0.0)
    for g in ("X", "Y"):
        for a, b in zip(got.eta[g], truth.eta[g]):
            assert a == pytest.approx(b, rel=0.05), g
    assert got.step_overhead_s == pytest.approx(truth.step_overhead_s, rel=0.1)
    assert got.request_overhead_s == pytest.approx(truth.request_overhead_s, rel=0.1)


def test_held_out_error_does_not_regress() -> None:
    """Issue 17 item 4, the CI gate: the held-out rows, predicted by the simulator at each row's load
    with the catalog as shipped, have median errors no worse than bench/data/fidelity_figures.json."""
    from hetcompile.perf import calibrate

    fid = _bench()
    figures = json.loads((ROOT / "bench/data/fidelity_figures.json").read_text())
    rows, _ = fid.usable(_rows() + fid.blis_rows(fid.BLIS))
    assert figures["rows"] == len(rows), "the data changed: rerun bench/fidelity.py --update-figures"
    _, held = calibrate.split(rows)
    params = fid.catalog_params(rows)
    cols = {"held-out": fid.pairs_of(held, lambda r: fid.simulate(r, fid.replica(r, params)))}
    for key, ids in (("held_out_median", None), ("held_out_median_v1", fid.v1_ids(rows))):
        got = fid.held_out_figures(cols, ids)
        for m, committed in figures[key].items():
            assert got[m] <= committed + GATE_TOLERANCE, f"{key} {m}: {got[m]:.4f} > committed {committed:.4f}"


def test_catalog_efficiencies_cite_a_source() -> None:
    from hetcompile.perf import analytic

    rows = yaml.safe_load((ROOT / "hetcompile/perf/data/gpus.yaml").read_text())
    for r in rows:
        if "eta_memory" in r or "eta_compute" in r:
            assert r.get("eta_source"), r["name"]
            lo_m, hi_m = analytic.ETA_BOUNDS["memory"]
            lo_c, hi_c = analytic.ETA_BOUNDS["compute"]
            assert lo_m <= r.get("eta_memory", lo_m) <= hi_m and lo_c <= r.get("eta_compute", lo_c) <= hi_c, r["name"]
    cal = yaml.safe_load((ROOT / "hetcompile/perf/data/calibration.yaml").read_text())
    assert "fidelity.py --fit" in cal["source"]
    assert all(math.isfinite(cal[k]) and cal[k] > 0 for k in ("step_overhead_s", "seq_overhead_s", "request_overhead_s"))


def test_pcie_tp_is_charged() -> None:
    """Issue 10: L4 TP2 prefill speed-up measured 1.25x; the ideal link predicted ~1.8x. With the
    fitted L4 eta_compute (a slower prefill, so all-reduce is a smaller share) the same PCIe constants
    give 1.42x: still charged (well under the ideal), but 14% over that one measurement, which is not
    a row of bench/data/fidelity.yaml (it has no throughput/TPOT/TTFT at a load) and so is not fitted."""
    from hetcompile.perf import analytic, capacity, catalog

    _, _, a = catalog.lookup_model("llama-3-8b")
    g = catalog.lookup_gpu("L4")
    rates = []
    for tp in (1, 2):
        e = analytic.perf_entry("m", a, 2, g, tp, 0.9, 4096)
        rm = analytic.replica_model(a, 2, [(g, tp, 32, analytic.stage_kv_tokens(e, 32, True, True))], 5e-6, 64e9, 256)
        rates.append(capacity.prefill_rate(rm))
    assert 1.1 < rates[1] / rates[0] < 1.5


def test_median_interval_brackets_the_median_and_narrows_with_rows() -> None:
    """The bootstrap interval bench/fidelity.py prints beside each held-out median: it contains the
    median, is the same on a rerun (seeded), and is narrower over 400 rows than over 20 of the same
    error distribution."""
    import numpy as np

    from hetcompile.perf import calibrate

    rng = np.random.default_rng(1)
    big = [(1 + e, 1.0) for e in rng.uniform(-0.4, 0.4, 400)]
    small = big[:20]
    for items in (big, small):
        lo, hi = calibrate.median_interval(items)
        assert lo <= calibrate.summary(items)[0] <= hi
        assert calibrate.median_interval(items) == (lo, hi)
    (a, b), (c, d) = calibrate.median_interval(big), calibrate.median_interval(small)
    assert b - a < (d - c) / 2


def test_blis_harness_cycle_of_prompts_is_a_prefix_cache_hit_from_its_second_use() -> None:
    """The BLIS harness (inference-perf e8e0aa9) sends groups x per_group distinct prompts in a cycle:
    a prompt's first use finds its group's system prompt only if an earlier prompt of the group came
    first; every later use finds the whole prompt but the last KV block's remainder (vLLM computes at
    least one token); a cycle that does not fit the KV cache beside the running sequences never hits."""
    fid = _bench()
    hits = fid.cycled_prompt_hits(250, system=100, prompt=566, groups=10, per_group=10)
    first, rest = hits[:100], hits[100:]
    assert sorted(set(first)) == [0, 96] and first.count(0) == 10  # each group's first prompt misses
    assert set(rest) == {560} and 566 - 560 <= fid.KV_BLOCK
    row = next(r for r in fid.blis_rows(fid.BLIS) if r["id"].startswith("blis-x67"))
    rm = fid.replica(row, fid.catalog_params([row]))
    assert not fid.cycle_stays_cached(row, rm, e2e_s=17.0)  # 100 prompts of 1034 tokens beside 17 x 1758
    assert fid.cycle_stays_cached(row, rm.model_copy(update={"stages": tuple(
        s.model_copy(update={"kv_tokens": 1e6}) for s in rm.stages)}), e2e_s=17.0)


def test_blis_itl_counts_the_tokens_vllm_generated() -> None:
    """The csv's ITL divides by the harness's re-count of the streamed text (195 of 247 for Llama-2);
    the rows compare the time per token vLLM generated: (e2e - TTFT) / (output - 1)."""
    fid = _bench()
    row = next(r for r in fid.blis_rows(fid.BLIS) if r["id"].startswith("blis-x20260217"))
    assert row["metrics"]["tpot_ms"] == pytest.approx((2080.7 - 28.0) / 246, rel=1e-3)
