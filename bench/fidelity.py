"""Fidelity of the step model against published vLLM measurements: calibrated, validated on unseen rows.

`python bench/fidelity.py [--data FILE] [--rows] [--fit] [--update-figures]`

Every row of bench/data/fidelity.yaml (one measured point: model, GPU, TP, prompt/output lengths,
how the load was applied, the measured output throughput / TPOT / TTFT, its citation) is predicted
by the SIMULATOR (hetcompile/simulate) at the measurement's own load: closed-loop rows with c
clients, open-loop rows with Poisson arrivals at the row's rate, burst/batch rows with all requests
at t = 0 (hetcompile/simulate/loadgen.py), on the replica's step model built exactly as compose
builds it (perf/analytic.py -> perf/stepmodel.py) from the catalog as shipped.

Columns, all from one run:
  train      the rows the calibration was fitted on (perf/calibrate.split: 70% per GPU by id hash)
  held-out   the other rows: the figure that matters, tracked in bench/data/fidelity_figures.json
  LOGO       leave-one-GPU-out: every row predicted with its GPU's efficiencies replaced by the median
             of the OTHER GPUs' fitted values (what a GPU without published measurements gets)
  uncal.     the uncalibrated roofline (0.7 of datasheet bandwidth, 0.5 of FLOP/s, 2 ms per step,
             no host or request overhead, ideal PCIe)
Each cell: median / p90 of |pred - meas| / meas over the rows that measured the metric.

`--fit` refits the per-GPU eta_memory / eta_compute (perf/data/gpus.yaml) and the host overheads
(perf/data/calibration.yaml) on the training rows by least squares (perf/calibrate.fit) with the
simulator (at each row's load, closed-loop rows on fewer requests) as the predictor inside the
optimizer, then writes them; deterministic (same rows, same values). `--update-figures` writes the
held-out medians the CI gate (tests/test_fidelity.py) compares against.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import urllib.parse
from pathlib import Path

import yaml

from hetcompile.perf import analytic, calibrate, catalog
from hetcompile.perf.stepmodel import ReplicaModel
from hetcompile.simulate import loadgen

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "fidelity.yaml"
FIGURES = Path(__file__).parent / "data" / "fidelity_figures.json"
BLIS = Path(__file__).parent / "data" / "blis_trainval.yaml"
GPUS_YAML = ROOT / "hetcompile" / "perf" / "data" / "gpus.yaml"
CALIBRATION_YAML = ROOT / "hetcompile" / "perf" / "data" / "calibration.yaml"
UTIL = 0.9  # vLLM's default --gpu-memory-utilization
MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
METRICS = ("throughput", "tpot_ms", "ttft_ms")
SPREAD = 0.5  # length spread of non-random datasets (loadgen.lengths)
MAX_REQUESTS = 2000  # requests simulated per row at most (the row's num_prompts, else 4 x its load): above every
                     # row's, since a burst's queue, and so its TTFT, is the burst's whole size


# --- what a row measured -------------------------------------------------------------------------

def measured(row: dict) -> dict[str, float]:
    """The row's throughput (output tok/s), TPOT (ms) and TTFT (ms), as far as published.
    Output tok/s from an input+output figure is scaled by O / (I + O); a row with only ITL gives it
    as TPOT (vLLM's ITL median is the TPOT of a smooth stream)."""
    m, I, O = row["metrics"], float(row["input"]), float(row["output"])
    m = {k: v for k, v in m.items() if k not in excluded(row)}
    out: dict[str, float] = {}
    if "throughput" in m:
        out["throughput"] = float(m["throughput"])
    elif "total_tok_s" in m:
        out["throughput"] = float(m["total_tok_s"]) * O / (I + O)
    if "tpot_ms" in m or "itl_ms" in m:
        out["tpot_ms"] = float(m.get("tpot_ms", m.get("itl_ms")))
    if "ttft_ms" in m:
        out["ttft_ms"] = float(m["ttft_ms"])
    return out


def excluded(row: dict) -> set[str]:
    """Metrics of the row left out of every column, each with the source's reason written in the
    data file (`excluded_metrics: {metric: reason}`); `tpot_ms` also drops `itl_ms`."""
    ex = set(row.get("excluded_metrics") or {})
    return ex | ({"itl_ms"} if "tpot_ms" in ex else set())


def frontend(row: dict) -> str:
    """How requests reached the engine, which decides the per-request overhead r (perf/stepmodel.py):
    'none' for LLM.generate / benchmark_latency (the whole batch is submitted before the first step);
    'in_process' for AccelMark's online scenarios, which call vLLM's AsyncLLMEngine in the benchmark's
    own process (their settings say so; their unloaded TTFTs of 13-23 ms for a 0.5B model's 1 ms
    prefill show the path still costs something); 'http' for everything else, the OpenAI server
    hetcompile deploys."""
    if row["mode"] in ("offline_batch", "static_batch"):
        return "none"
    if re.search(r"in-process AsyncLLMEngine", str(row.get("settings") or "")):
        return "in_process"
    return "http"


def engine_core(row: dict) -> str:
    """'v1' for vLLM >= 0.8 (the V1 engine, default since 0.8; what hetcompile deploys), else 'v0'
    (older versions, forks of them, and rows whose version is not stated: all published in 2024)."""
    hit = re.match(r"vLLM v?(\d+)\.(\d+)", str(row.get("engine") or ""))
    return "v1" if hit and (int(hit.group(1)), int(hit.group(2))) >= (0, 8) else "v0"


ASYNC_SCHEDULING_SINCE = (0, 12)  # vLLM turned async scheduling on by default (vllm-project/vllm#27614)
                                  # in the 0.12-0.14 releases; no row of the data lies in between


def async_scheduling(row: dict) -> bool:
    """Whether the row's engine overlapped host work with the GPU (perf/stepmodel.step_seconds):
    vLLM >= 0.12 by default; V0 and V1 before it ran the scheduler's work before each step."""
    hit = re.match(r"vLLM v?(\d+)\.(\d+)", str(row.get("engine") or ""))
    return bool(hit) and (int(hit.group(1)), int(hit.group(2))) >= ASYNC_SCHEDULING_SINCE


def engine_defaults(row: dict, gpu, max_len: int) -> tuple[int, int]:
    """(max_num_seqs, prompt tokens per engine step) the row's engine ran with when not set.
    V1 (vllm/engine/arg_utils.py get_batch_defaults): GPUs of >= 70 GiB other than A100 get 1024
    sequences and 8192 batched tokens behind the OpenAI server (16384 in LLM.generate); others 256 and
    2048 (8192). V0 (chunked prefill off below 32K context): a step prefills up to
    max(max_model_len, 2048) tokens, 256 sequences."""
    offline = row["mode"] in ("offline_batch", "static_batch")
    if engine_core(row) == "v0":
        return MAX_NUM_SEQS, max(2048, max_len)
    big = gpu.memory >= 70 * 2**30 and not gpu.name.startswith("A100")
    if big:
        return 1024, 16384 if offline else 8192
    return MAX_NUM_SEQS, 8192 if offline else 2048


def _setting(row: dict, pattern: str, default):
    hit = re.search(pattern, str(row.get("settings") or "") + " " + str(row.get("note") or ""))
    return type(default)(hit.group(1)) if hit else default


KV_BLOCK = 16  # vLLM's default KV block size on GPUs: the prefix cache hits whole blocks


def cycled_prompt_hits(n: int, system: int, prompt: int, groups: int, per_group: int, seed: int = 0) -> list[int]:
    """Prompt tokens vLLM's prefix cache serves to each of n requests when, as the BLIS harness does
    (bench/data/blis_trainval.yaml `harness`), groups x per_group distinct prompts (a group's system
    prompt of `system` tokens + a question, `prompt` tokens in all) are shuffled once and sent in a
    cycle. A prompt's first use finds its group's system prompt if an earlier prompt of the group
    brought it; every later use finds the whole prompt but the last token, in whole KV blocks (vLLM
    computes at least one token; the cache holds the 100 prompts easily, so nothing is evicted)."""
    import random

    order = [g for g in range(groups) for _ in range(per_group)]
    random.Random(seed).shuffle(order)
    seen: set[int] = set()
    first: list[int] = []
    for g in order:
        first.append(system // KV_BLOCK * KV_BLOCK if g in seen else 0)
        seen.add(g)
    again = (prompt - 1) // KV_BLOCK * KV_BLOCK
    return [first[i] if i < len(order) else again for i in range(n)]


def engine_itl_ms(measured: dict, output: float) -> float:
    """Mean time per output token as vLLM generated them: (mean e2e - mean TTFT) / (output - 1).
    The csv's itl_mean_ms divides by the harness's RE-COUNT of the streamed text's tokens instead,
    which for Llama-2's tokenizer comes out 22% short of what vLLM generated (x20260217's own files:
    output_len median 247 = max_tokens, mean 195.8, p10 36, while its request latencies are tight,
    p1 1.86 s / p99 2.58 s: every request generated all 247 tokens, ignore_eos being set); for the
    other models the two agree within 1.5%. The simulator generates `output` tokens, so this is the
    like-for-like figure."""
    return (float(measured["e2e_mean_ms"]) - float(measured["ttft_mean_ms"])) / (output - 1.0)


def cycle_stays_cached(row: dict, rm: ReplicaModel, e2e_s: float) -> bool:
    """Whether the harness's cycle of distinct prompts stays in vLLM's prefix cache: its KV beside
    the running sequences' (Little's law at the busiest stage: rate x e2e sequences holding their
    prompt and half their output) fits the replica's KV cache. A cycle larger than the free cache
    under LRU never hits (each prompt is evicted just before its turn comes round again)."""
    groups, per_group = row["prompt_cycle"]
    prompt, output = float(row["input"]), float(row["output"])
    running = max(rate for rate, _ in row["stages"]) * e2e_s * (prompt + output / 2)
    return groups * per_group * prompt + running <= min(s.kv_tokens for s in rm.stages)


def blis_rows(path: Path) -> list[dict]:
    """The BLIS training experiments (bench/data/blis_trainval.yaml, bench/blis.py) as rows of this
    benchmark: mode `staged` (constant-rate stages, the harness's cycle of distinct prompts that
    vLLM's prefix cache serves from their second use on), their means of ITL and TTFT; experiments
    on models outside the catalog are left out."""
    rows = []
    doc = yaml.safe_load(path.read_text())
    harness = doc.get("harness") or {}
    for e in doc["experiments"]:
        found = catalog.lookup_model(e["model_hf"])
        if found is None or catalog.lookup_gpu(e["gpu"]) is None:
            continue
        system = int(e["prompt"].get("system_prompt_tokens") or 0)
        m = e.get("measured") or {}
        rows.append({
            "id": "blis-" + e["id"], "model": found[0], "gpu": e["gpu"], "tp": int(e["tp"]), "pp": 1,
            "input": system + float(e["prompt"]["question_tokens"]["mean"]), "output": float(e["output_tokens"]["mean"]),
            "cached": system, "prompt_cycle": (int(harness.get("prompt_groups") or 0), int(harness.get("prompts_per_group") or 0)),
            "mode": "staged", "stages": [(float(x["rate"]), float(x["duration_s"])) for x in e["stages"]],
            "concurrency": None, "rate": None, "dataset": "random", "stat": "mean",
            "max_num_seqs": e.get("max_num_seqs"), "max_num_batched_tokens": e.get("max_num_batched_tokens"),
            "engine": "vLLM 0.15.1", "settings": f"max_model_len={e.get('max_model_len')}",
            "metrics": {"tpot_ms": engine_itl_ms(m, float(e["output_tokens"]["mean"])), "ttft_ms": m["ttft_mean_ms"]},
            "source": e["source"], "note": e.get("note", ""),
        })
    return rows


# --- the replica a row ran on ----------------------------------------------------------------------

class DoesNotFit(Exception):
    """The analytic memory model says the row's model does not fit its GPUs (the measurement shows it
    did: a memory assumption the row's note gives, e.g. an assumed card size, is off); such rows are
    listed and left out of every column."""


def usable(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(rows the model can place, reasons for the others)."""
    ok, out = [], []
    for r in rows:
        try:
            replica(r, uncalibrated=True)
            ok.append(r)
        except DoesNotFit as exc:
            out.append(str(exc))
    return ok, out


def replica(row: dict, params: calibrate.Params | None = None, uncalibrated: bool = False) -> ReplicaModel:
    """The row's replica as compose builds it; `params` replaces the catalog's efficiencies and
    overheads (fitting, LOGO); `uncalibrated` is the ideal roofline."""
    found = catalog.lookup_model(row["model"])
    gpu = catalog.lookup_gpu(row["gpu"])
    if found is None or gpu is None:
        sys.exit(f"fidelity: {row['id']}: unknown model or GPU")
    arch = found[2]
    if params is not None and row["gpu"] in params.eta:
        em, ec = params.eta[row["gpu"]]
        gpu = gpu.model_copy(update={"eta_memory": em, "eta_compute": ec})
    if uncalibrated:
        gpu = gpu.model_copy(update={"eta_memory": None, "eta_compute": None})
    if row.get("tp_link") == "pcie":  # the row's TP crossed a host link (the data file's header)
        gpu = gpu.model_copy(update={"interconnect": min(gpu.interconnect, 32e9)})
    tp, pp = int(row.get("tp") or 1), int(row.get("pp") or 1)
    util = _setting(row, r"gpu[-_ ]memory[-_ ]utilization[ =:]*(0\.\d+)", UTIL)
    max_len = min(arch.max_context, _setting(row, r"max[-_ ]model[-_ ]len[ =:]*(\d+)", 8192))
    seqs, chunk = engine_defaults(row, gpu, max_len)
    if row["mode"] == "offline_batch":  # LLM.generate / benchmark_throughput runs with the harness's cap
        seqs = _setting(row, r"max[-_ ]num[-_ ]seqs[ =:]*(\d+)", seqs)
    seqs, chunk = int(row.get("max_num_seqs") or seqs), int(row.get("max_num_batched_tokens") or chunk)
    entry = analytic.perf_entry(row["model"], arch, 2, gpu, tp, util, max_len)
    part = analytic.balanced_partition(entry, arch.layers, pp, max_len)
    if part is None:
        raise DoesNotFit(f"{row['id']}: {row['model']} does not fit {pp} x {tp} {row['gpu']} at {util} memory utilization")
    stages = [(gpu, tp, k, analytic.stage_kv_tokens(entry, k, i == 0, i == pp - 1)) for i, k in enumerate(part)]
    rm = analytic.replica_model(arch, 2, stages, 5e-6, 64e9, seqs, ideal=uncalibrated)
    if row.get("tp_link") == "pcie" and tp > 1:
        rm = pcie_kernels(rm, arch, catalog.lookup_gpu(row["gpu"]), gpu, tp)
    update = {"chunk_tokens": chunk, "host_overlap": async_scheduling(row)}
    if params is not None and not uncalibrated:
        v0 = engine_core(row) == "v0"
        r = (params.v0_request_overhead_s if v0 else
             params.inproc_request_overhead_s if frontend(row) == "in_process" else params.request_overhead_s)
        update |= {"step_gpu_s": params.step_gpu_s,
                   "step_overhead_s": params.v0_step_overhead_s if v0 else params.step_overhead_s,
                   "seq_overhead_s": params.v0_seq_overhead_s if v0 else params.seq_overhead_s,
                   "request_overhead_s": r}
    if frontend(row) == "none":
        update["request_overhead_s"] = 0.0  # the batch is submitted before the first step
    return rm.model_copy(update=update)


def pcie_kernels(rm: ReplicaModel, arch, nvlink_gpu, pcie_gpu, tp: int) -> ReplicaModel:
    """A row whose TP crossed a host link although its GPUs have NVLink: the kernel tables measured
    NVLink all-reduces, so their stages get the roofline's extra cost of the PCIe all-reduce over the
    NVLink one (perf/analytic.allreduce_link) on top of the tables' own comm terms."""
    fast, slow = analytic.roofline_cost(arch, 2, nvlink_gpu, tp), analytic.roofline_cost(arch, 2, pcie_gpu, tp)
    stages = []
    for s in rm.stages:
        if s.cost.source == "kernels":
            s = s.model_copy(update={"cost": s.cost.model_copy(update={
                "comm_s_per_token": s.cost.comm_s_per_token + slow.comm_s_per_token - fast.comm_s_per_token,
                "comm_s": s.cost.comm_s + slow.comm_s - fast.comm_s})})
        stages.append(s)
    return rm.model_copy(update={"stages": tuple(stages)})


# --- predictions ---------------------------------------------------------------------------------

def _load(row: dict, fast: bool = False) -> tuple[int, int]:
    """(requests simulated, requests in flight or at once) of a row; `fast` (inside the fit): a
    closed-loop row replays 3c requests (at least 12), enough for its medians."""
    c = int(row.get("concurrency") or 0)
    n = int(row.get("num_prompts") or 0)
    if row["mode"] == "closed_loop":
        n = n or max(4 * c, 40)
        if fast:
            n = min(n, max(3 * c, 12))
    elif row["mode"] == "open_loop":
        n = n or 300
    elif row["mode"] == "staged":
        return len(loadgen.staged_times(row["stages"], poisson=False)), c  # every stage, also in the fit
    else:
        n = n or c or 1000
    return min(n, MAX_REQUESTS), c


def replay(row: dict, rm: ReplicaModel, fast: bool = False) -> loadgen.LoadResult:
    """The row's load replayed in the simulator (module docstring): everything the run measured."""
    n, c = _load(row, fast)
    spread = row.get("spread", 0.0 if str(row.get("dataset", "")).startswith("random") else SPREAD)
    pairs = loadgen.lengths(n, float(row["input"]), float(row["output"]), spread, seed=0)
    v0 = engine_core(row) == "v0"
    if row["mode"] == "staged":  # constant-rate stages (BLIS rows), the shared system prompt a prefix-cache hit
        times = loadgen.staged_times(row["stages"], poisson=False)[:n]
        system, (groups, per_group) = int(row.get("cached") or 0), row.get("prompt_cycle") or (0, 0)
        prompt = round(float(row["input"]))
        hits = cycled_prompt_hits(n, system, prompt, groups, per_group) if groups and per_group else system
        res = loadgen.open_loop(rm, row["stages"][0][0], pairs, times=times, cached=hits)
        if isinstance(hits, list) and not cycle_stays_cached(row, rm, res.e2e_mean_s):
            # the cycle of prompts and the running sequences overflow the KV cache: vLLM's LRU evicts the
            # prompt the cycle needs next, so only the system prompts (touched every few requests) hit
            res = loadgen.open_loop(rm, row["stages"][0][0], pairs, times=times, cached=system)
    elif row["mode"] == "closed_loop":
        res = loadgen.closed_loop(rm, c, pairs, prefill_first=v0)
    elif row["mode"] == "open_loop":
        res = loadgen.open_loop(rm, float(row["rate"]), pairs, seed=0, prefill_first=v0)
    else:
        res = loadgen.burst(rm, pairs, prefill_first=v0)
    return res


def simulate(row: dict, rm: ReplicaModel, fast: bool = False) -> dict[str, float]:
    """The simulator's throughput / TPOT / TTFT for the row at the row's load, in the row's statistic."""
    res = replay(row, rm, fast)
    if row.get("stat") == "mean":  # the source reports means over requests (BLIS: mean ITL, mean TTFT)
        return {"throughput": res.throughput, "tpot_ms": res.itl_mean_s * 1e3, "ttft_ms": res.ttft_mean_s * 1e3}
    return {"throughput": res.throughput, "tpot_ms": res.tpot_s * 1e3, "ttft_ms": res.ttft_s * 1e3}


# --- error tables --------------------------------------------------------------------------------

def pairs_of(rows: list[dict], predict) -> dict[str, list[tuple[str, float, float]]]:
    """Per metric, (row id, predicted, measured) for every row that measured it."""
    out: dict[str, list[tuple[str, float, float]]] = {m: [] for m in METRICS}
    for r in rows:
        meas = measured(r)
        if not meas:
            continue
        p = predict(r)
        for m, v in meas.items():
            out[m].append((r["id"], p[m], v))
    return out


def catalog_params(rows: list[dict]) -> calibrate.Params:
    """The calibration as shipped: gpus.yaml efficiencies (defaults where none) and the overheads."""
    eta = {}
    for g in sorted({r["gpu"] for r in rows}):
        gt = catalog.lookup_gpu(g)
        em, ec = analytic.efficiencies(gt)[1], analytic.efficiencies(gt)[0]
        eta[g] = (em, ec)
    cal = yaml.safe_load(CALIBRATION_YAML.read_text())
    return calibrate.Params(eta=eta, step_overhead_s=analytic.STEP_OVERHEAD_S, seq_overhead_s=analytic.SEQ_OVERHEAD_S,
                            request_overhead_s=analytic.REQUEST_OVERHEAD_S,
                            v0_step_overhead_s=cal.get("v0_step_overhead_s", 2e-3),
                            v0_seq_overhead_s=cal.get("v0_seq_overhead_s", 100e-6),
                            v0_request_overhead_s=cal.get("v0_request_overhead_s", cal["request_overhead_s"]),
                            inproc_request_overhead_s=cal.get("inproc_request_overhead_s", cal["request_overhead_s"]),
                            step_gpu_s=analytic.STEP_GPU_S or calibrate.Params.step_gpu_s)


def unmeasured_eta(params: calibrate.Params, gpu: str) -> tuple[float, float]:
    """What a roofline GPU without published measurements gets, computed without `gpu`: the medians
    of the OTHER fitted roofline GPUs' efficiencies (perf/analytic.ETA_MEMORY / ETA_COMPUTE's rule)."""
    others = [v for g, v in params.eta.items() if g != gpu and catalog.lookup_gpu(g).eta_memory is not None]
    if not others:
        return calibrate.PRIOR_ETA
    return statistics.median(v[0] for v in others), statistics.median(v[1] for v in others)


def logo_params(params: calibrate.Params, gpu: str) -> calibrate.Params:
    """`params` with `gpu`'s efficiencies replaced by unmeasured_eta: what a GPU without published
    measurements gets. GPUs with kernel tables have no fitted efficiency: LOGO predicts them as shipped."""
    return dataclasses.replace(params, eta={**params.eta, gpu: unmeasured_eta(params, gpu)})


def source_of(row: dict) -> str:
    """The lab or harness a row comes from: the GitHub repository for GitHub URLs, else the site.
    Rows of one source share a harness, a machine and a way of reading numbers off a page, so
    leave-one-source-out holds them out together."""
    u = urllib.parse.urlparse(row["source"])
    parts = [x for x in u.path.split("/") if x]
    return u.netloc + ("/" + "/".join(parts[:2]) if u.netloc == "github.com" else "")


def loso_params(params: calibrate.Params, rows: list[dict], source: str) -> calibrate.Params:
    """`params` as if `source` had never been measured: each roofline GPU of the source gets its
    efficiencies refitted on every row of that GPU from the OTHER sources (host overheads held at
    `params`), or the roofline's defaults when no other source measured it. GPUs with kernel tables
    have no fitted term, so only the shared host overheads (o, q, r, fitted with the source in) leak."""
    mine = [r for r in rows if source_of(r) == source]
    eta = dict(params.eta)
    for g in sorted({r["gpu"] for r in mine} & set(params.eta)):
        others = [r for r in rows if r["gpu"] == g and source_of(r) != source]
        if not others:
            eta[g] = unmeasured_eta(params, g)  # what a GPU without measurements gets
            continue
        base = dataclasses.replace(params, eta={g: calibrate.PRIOR_ETA})
        got = calibrate.fit(_residuals(others), [g], base, iterations=6, hold_host=True)
        eta[g] = got.eta[g]
    return dataclasses.replace(params, eta=eta)


def loso(rows: list[dict], params: calibrate.Params) -> dict[str, list[tuple[str, float, float]]]:
    """Leave-one-source-out: every row predicted by loso_params of its own source."""
    per_source = {s: loso_params(params, rows, s) for s in sorted({source_of(r) for r in rows})}
    return pairs_of(rows, lambda r: simulate(r, replica(r, per_source[source_of(r)])))


def evaluate(rows: list[dict], logo: bool = True, uncal: bool = True) -> dict[str, dict[str, list]]:
    """Every column of the table: {column: {metric: [(id, pred, meas)]}}, simulator predictions."""
    params = catalog_params(rows)
    train, held = calibrate.split(rows)
    cal = {r["id"]: r for r in rows}
    preds = {r["id"]: simulate(r, replica(r, params)) for r in rows}
    cols = {"LOSO": loso(rows, params),
            "train": pairs_of(train, lambda r: preds[r["id"]]), "held-out": pairs_of(held, lambda r: preds[r["id"]])}
    if logo:
        cols["LOGO"] = pairs_of(rows, lambda r: simulate(r, replica(r, logo_params(params, r["gpu"]))))
    if uncal:
        cols["uncal."] = pairs_of(rows, lambda r: simulate(r, replica(r, uncalibrated=True)))
    del cal
    return cols


def _cell(items: list[tuple[str, float, float]]) -> str:
    s = calibrate.summary([(p, v) for _, p, v in items])
    return "      -      " if s is None else f"{100 * s[0]:5.1f}/{100 * s[1]:5.1f}%"


def table(cols: dict[str, dict[str, list]]) -> str:
    names = list(cols)
    lines = [f"{'metric':11}" + "".join(f"{n + ' (n)':>19}" for n in names)]
    for m in METRICS:
        lines.append(f"{m:11}" + "".join(f"{_cell(cols[n][m]):>14} ({len(cols[n][m]):3d})" for n in names))
    return "\n".join(lines)


def source_table(items: dict[str, list], rows: list[dict]) -> str:
    """Per source: rows, GPUs and the median abs rel error of each metric (one column's items)."""
    by = {r["id"]: source_of(r) for r in rows}
    lines = [f"  {'source':44} {'rows':>4}  " + "  ".join(f"{m:>14}" for m in METRICS)]
    for src in sorted(set(by.values()), key=lambda x: (-sum(1 for v in by.values() if v == x), x)):
        cells = []
        for m in METRICS:
            got = [(p, v) for i, p, v in items[m] if by[i] == src]
            cells.append(f"{100 * calibrate.summary(got)[0]:6.1f}% ({len(got):3d})" if got else f"{'-':>14}")
        lines.append(f"  {src[:44]:44} {sum(1 for v in by.values() if v == src):4d}  " + "  ".join(cells))
    return "\n".join(lines)


def held_out_items(cols: dict[str, dict[str, list]], m: str, ids: set[str] | None = None) -> list[tuple[float, float]]:
    """(predicted, measured) of metric m over the held-out rows (those in `ids` when given)."""
    return [(p, v) for i, p, v in cols["held-out"][m] if ids is None or i in ids]


def held_out_figures(cols: dict[str, dict[str, list]], ids: set[str] | None = None) -> dict[str, float]:
    """Median abs rel error per metric over the held-out rows (those in `ids` when given)."""
    return {m: round(calibrate.summary(held_out_items(cols, m, ids))[0], 4) for m in METRICS}


def v1_ids(rows: list[dict]) -> set[str]:
    """Rows measured on the V1 engine (vLLM >= 0.8): the engine hetcompile's plans run on."""
    return {r["id"] for r in rows if engine_core(r) == "v1"}


# --- fitting -------------------------------------------------------------------------------------

MIN_GPU_ROWS = 5  # training rows a GPU needs for efficiencies of its own; with fewer, one source's
                 # harness would set them (A10G, T4, A40 have 1-2): those keep the kernel-derived defaults


def roofline_gpus(rows: list[dict]) -> list[str]:
    """GPUs of `rows` that the roofline predicts (no kernel tables for the row's GPU, model shape and
    TP) on at least MIN_GPU_ROWS rows: the only GPUs with fitted efficiencies."""
    count: dict[str, int] = {}
    for r in rows:
        if any(s.cost.source == "roofline" for s in replica(r).stages):
            count[r["gpu"]] = count.get(r["gpu"], 0) + 1
    return sorted(g for g, n in count.items() if n >= MIN_GPU_ROWS)


def fit(rows: list[dict]) -> calibrate.Params:
    """Least squares on the training split with the simulator as the predictor (`fast` lengths).
    A row's prediction depends only on its GPU's efficiencies and the three overheads, so it is
    cached on those: a Jacobian column for one GPU's efficiency re-simulates that GPU's rows only."""
    train, _ = calibrate.split(rows)
    gpus = roofline_gpus(train)  # GPUs with kernel tables carry no fitted term
    # a fixed start (not the catalog's current values), so refitting the same rows gives the same values
    prior = calibrate.Params(eta={g: calibrate.PRIOR_ETA for g in gpus})

    return calibrate.fit(_residuals(train), gpus, prior, log=lambda s: print(s, file=sys.stderr, flush=True))


def _residuals(rows: list[dict]) -> calibrate.Residuals:
    """The fit's residuals over `rows`, each row's simulation cached on the parameters it reads."""
    cache: dict[tuple, dict[str, float]] = {}

    def residuals(p: calibrate.Params) -> list[tuple[float, float, float]]:
        out = []
        for r in rows:
            key = (r["id"], p.eta.get(r["gpu"]), p.step_overhead_s, p.seq_overhead_s, p.request_overhead_s,
                   p.v0_step_overhead_s, p.v0_seq_overhead_s, p.v0_request_overhead_s, p.inproc_request_overhead_s,
                   p.step_gpu_s)
            if key not in cache:
                cache[key] = simulate(r, replica(r, p), fast=True)
            pred = cache[key]
            for m, v in measured(r).items():
                out.append((pred[m], v, calibrate.TTFT_WEIGHT if m == "ttft_ms" else 1.0))
        return out

    return residuals


def write_fit(p: calibrate.Params, rows: list[dict]) -> None:
    """Rewrite gpus.yaml's eta lines for the fitted GPUs and perf/data/calibration.yaml."""
    train, _ = calibrate.split(rows)
    text = GPUS_YAML.read_text()
    blocks = re.split(r"(?m)^(?=- name: )", text)
    out = []
    for b in blocks:
        hit = re.match(r"- name: (\S+)", b)
        b = re.sub(r"(?m)^  eta_(memory|compute|source):.*\n", "", b)
        if hit and hit.group(1) in p.eta:
            g = hit.group(1)
            em, ec = p.eta[g]
            n = sum(1 for r in train if r["gpu"] == g and any(s.cost.source == "roofline" for s in replica(r).stages))
            b = b.rstrip("\n") + "\n" + (
                f"  eta_memory: {em:.3f}\n  eta_compute: {ec:.3f}\n"
                f"  eta_source: \"fitted by bench/fidelity.py --fit on the {n} training rows of {g} that the roofline predicts "
                f"(no kernel tables for the row's model and TP) in bench/data/fidelity.yaml\"\n")
            b += "\n" if not b.endswith("\n\n") else ""
        out.append(b)
    GPUS_YAML.write_text("".join(out).rstrip("\n") + "\n")
    doc = {
        "source": f"fitted by bench/fidelity.py --fit on the {len(train)} training rows of bench/data/fidelity.yaml",
        "step_overhead_s": float(f"{p.step_overhead_s:.3g}"),
        "step_gpu_s": float(f"{p.step_gpu_s:.3g}"),
        "seq_overhead_s": float(f"{p.seq_overhead_s:.3g}"),
        "request_overhead_s": float(f"{p.request_overhead_s:.3g}"),
        "v0_step_overhead_s": float(f"{p.v0_step_overhead_s:.3g}"),
        "v0_seq_overhead_s": float(f"{p.v0_seq_overhead_s:.3g}"),
        "v0_request_overhead_s": float(f"{p.v0_request_overhead_s:.3g}"),
        "inproc_request_overhead_s": float(f"{p.inproc_request_overhead_s:.3g}"),
        "eta_memory_default": round(statistics.median(v[0] for v in p.eta.values()), 3),
        "eta_compute_default": round(statistics.median(v[1] for v in p.eta.values()), 3),
    }
    CALIBRATION_YAML.write_text(
        "# Host overheads of the step model (perf/stepmodel.py: o, q per engine step, overlapping the GPU; r per\n"
        "# request) and the roofline's default efficiencies (the medians of the fitted roofline GPUs', for a GPU\n"
        "# with neither kernel tables nor rows). Written by `python bench/fidelity.py --fit`; do not edit by hand.\n"
        + yaml.safe_dump(doc, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--blis", default=str(BLIS), help="the BLIS experiments to add as rows ('' for none)")
    ap.add_argument("--rows", action="store_true", help="print every row's prediction")
    ap.add_argument("--fit", action="store_true", help="refit the catalog's efficiencies and overheads, then report")
    ap.add_argument("--no-write", action="store_true", help="with --fit: print the fitted values, leave the catalog as it is")
    ap.add_argument("--update-figures", action="store_true", help=f"write the held-out medians to {FIGURES}")
    args = ap.parse_args(argv)
    rows, left_out = usable(yaml.safe_load(args.data.read_text()) + (blis_rows(Path(args.blis)) if args.blis else []))
    if args.fit:
        p = fit(rows)
        if args.no_write:
            print("fitted (not written):", json.dumps(dataclasses.asdict(p)))
            return 0
        write_fit(p, rows)
        print("fitted:", json.dumps({"eta": {g: [round(a, 3), round(b, 3)] for g, (a, b) in p.eta.items()},
                                     "o": p.step_overhead_s, "q": p.seq_overhead_s, "r": p.request_overhead_s,
                                     "o_v0": p.v0_step_overhead_s, "q_v0": p.v0_seq_overhead_s,
                                     "r_v0": p.v0_request_overhead_s, "r_inproc": p.inproc_request_overhead_s,
                                     "g": p.step_gpu_s}))
        print("rerun without --fit to report with the new catalog")
        return 0
    cols = evaluate(rows)
    train, held = calibrate.split(rows)
    if args.rows:
        print(f"{'row':48} {'metric':9} {'measured':>9} {'pred':>9} {'LOGO':>9} {'uncal.':>9}")
        logo = {(i, m): p for m in METRICS for i, p, _ in cols["LOGO"][m]}
        unc = {(i, m): p for m in METRICS for i, p, _ in cols["uncal."][m]}
        held_ids = {r["id"] for r in held}
        for m in METRICS:
            for i, p, v in cols["train"][m] + cols["held-out"][m]:
                tag = "*" if i in held_ids else " "
                print(f"{tag}{i:47} {m:9} {v:9.1f} {p:9.1f} {logo[(i, m)]:9.1f} {unc[(i, m)]:9.1f}")
        print("(* held out)\n")
    print(f"{len(rows)} published rows ({len(train)} train, {len(held)} held out) over "
          f"{len({r['gpu'] for r in rows})} GPU types from {len({source_of(r) for r in rows})} sources; "
          "simulator at each row's load; median/p90 abs rel error")
    print(table(cols))
    print("leave-one-source-out (the headline: each source predicted by a model fitted without it), per source:")
    print(source_table(cols["LOSO"], rows))
    big = {r["id"] for r in rows if analytic.total_params(catalog.lookup_model(r["model"])[2]) >= 7e9}
    print(f"the same on the {len(big)} rows of 7B-and-larger models (what hetcompile plans for):")
    print(table({n: {m: [x for x in c[m] if x[0] in big] for m in METRICS} for n, c in cols.items()}))
    v1 = v1_ids(rows)
    print(f"the same on the {len(v1)} rows of vLLM >= 0.8 (the V1 engine plans deploy; V0 rows only inform the efficiencies):")
    print(table({n: {m: [x for x in c[m] if x[0] in v1] for m in METRICS} for n, c in cols.items()}))
    print("held-out medians with their 90% bootstrap intervals (rows resampled, seed 0):")
    for label, ids in (("all rows", None), ("V1 rows", v1), ("V0 rows", {r["id"] for r in rows} - v1)):
        cells = []
        for m in METRICS:
            items = held_out_items(cols, m, ids)
            lo, hi = calibrate.median_interval(items)
            cells.append(f"{m} {100 * calibrate.summary(items)[0]:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] (n {len(items)})")
        print(f"  {label:9} " + "; ".join(cells))
    for reason in left_out:
        print(f"left out: {reason}")
    ex: dict[str, list[str]] = {}
    for r in rows:
        for m in sorted(r.get("excluded_metrics") or {}):
            ex.setdefault(m, []).append(r["id"])
    for m, ids in sorted(ex.items()):
        print(f"excluded: {m} of {len(ids)} rows ({ids[0]} ...), each with its source's reason in the data file")
    print("per GPU, held-out rows (all metrics pooled): median (n)")
    for g in sorted({r["gpu"] for r in held}):
        ids = {r["id"] for r in held if r["gpu"] == g}
        items = [(p, v) for m in METRICS for i, p, v in cols["held-out"][m] if i in ids]
        s = calibrate.summary(items)
        print(f"  {g:10} {100 * s[0]:5.1f}% ({len(items)})")
    if args.update_figures:
        loso_cols = {"held-out": cols["LOSO"]}  # the same medians over the LOSO column (tracked, not gated: minutes)
        FIGURES.write_text(json.dumps({"held_out_median": held_out_figures(cols),
                                       "held_out_median_v1": held_out_figures(cols, v1),
                                       "loso_median": held_out_figures(loso_cols),
                                       "loso_median_v1": held_out_figures(loso_cols, v1), "rows": len(rows)},
                                      indent=2, sort_keys=True) + "\n")
        print(f"wrote {FIGURES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
