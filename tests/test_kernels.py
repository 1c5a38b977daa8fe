"""The step model's two sources (perf/kernels.py, perf/analytic.py): measured kernel tables where a GPU
has them, a physically bounded roofline elsewhere, and no GPU predicted slower than a weaker one."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml

from conftest import ROOT
from hetcompile.perf import analytic, catalog, kernels

MODELS = ("llama-3.1-8b", "qwen2.5-32b", "llama-3.1-70b")
# (tokens n, decode context tokens S, attention pairs A) of steps vLLM runs: decodes of 1, 32 and 256
# sequences at 1k context, a 2048-token prompt chunk, a chunk with 32 decodes beside it
STEPS = ((1, 1024, 1024), (32, 32 * 1024, 32 * 1024), (256, 256 * 1024, 256 * 1024),
         (2048, 0, 2048 * 1024), (2080, 32 * 1024, 32 * 1024 + 2048 * 1024))


def _arch(model: str):
    return catalog.lookup_model(model)[2]


def _step(model: str, gpu: str, tp: int, step: tuple[float, float, float]) -> float:
    a, g = _arch(model), catalog.lookup_gpu(gpu)
    return a.layers * analytic.layer_cost(a, 2, g, tp).time(*step) + analytic.head_time(a, 2, g, tp)


def test_kernel_gpus_use_the_tables_and_others_the_roofline() -> None:
    a = _arch("llama-3.1-8b")
    for gpu in catalog.gpu_names():
        cost = analytic.layer_cost(a, 2, catalog.lookup_gpu(gpu), 1)
        assert cost.source == ("kernels" if gpu in kernels.gpus() else "roofline"), gpu
    assert set(kernels.gpus()) == {"H100", "H200", "L40S", "A100-80GB"}
    # 8-bit weights are not what the tables measured: the roofline
    assert analytic.layer_cost(a, 1, catalog.lookup_gpu("H100"), 1).source == "roofline"


def test_kernel_fits_stay_close_to_their_tables() -> None:
    """scripts/kernel_tables.py's fit of the step form to each (model, GPU, TP) grid is recorded; the
    form must follow the tables (median within 10%, every entry's p90 within 20%)."""
    doc = json.loads((ROOT / "hetcompile/perf/data/kernels.json").read_text())
    assert len(doc["entries"]) >= 200
    for e in doc["entries"]:
        assert e["fit"]["median"] <= 0.10 and e["fit"]["p90"] <= 0.20, (e["model"], e["gpu"], e["tp"], e["fit"])


def test_roofline_efficiencies_inside_physical_bounds() -> None:
    """Every GPU's roofline efficiencies (fitted or default) lie within what measured kernels reach."""
    lo_c, hi_c = analytic.ETA_BOUNDS["compute"]
    lo_m, hi_m = analytic.ETA_BOUNDS["memory"]
    for gpu in catalog.gpu_names():
        eta_c, eta_m = analytic.efficiencies(catalog.lookup_gpu(gpu))
        assert lo_c <= eta_c <= hi_c, (gpu, eta_c)
        assert lo_m <= eta_m <= hi_m, (gpu, eta_m)
    d = kernels.roofline_defaults()
    assert lo_c <= d["eta_compute"] <= hi_c and lo_m <= d["eta_memory"] <= hi_m and 0 <= d["serial_fraction"] <= 1


def _weaker(a, b, decode: bool) -> bool:
    """GPU a is strictly weaker than b for a step: no more FLOP/s, bandwidth or memory, and less of
    what the step is bound by (bandwidth for a decode step, FLOP/s for a prompt chunk). L40 and L40S
    (the same 864 GB/s) decode alike; H100 and H200 (the same 989 TFLOP/s) prefill alike."""
    no_more = a.flops <= b.flops and a.mem_bw <= b.mem_bw and a.memory <= b.memory
    return no_more and (a.mem_bw < b.mem_bw if decode else a.flops < b.flops)


@pytest.mark.parametrize("model", MODELS)
def test_no_gpu_is_slower_than_a_weaker_one(model: str) -> None:
    """On the same step, a strictly stronger GPU is never predicted slower, whichever source predicts
    each (H200 >= H100 >= A100-80GB >= A100 on decode, L40S >= L4, ...): the kernel tables and the
    roofline must rank hardware the way the hardware ranks."""
    gpus = [catalog.lookup_gpu(g) for g in catalog.gpu_names()]
    pairs = [(a, b) for a, b in itertools.permutations(gpus, 2) if _weaker(a, b, True) or _weaker(a, b, False)]
    assert any(a.name == "A100" and b.name == "A100-80GB" for a, b in pairs)
    assert any(a.name == "H100" and b.name == "H200" for a, b in pairs)
    bad = []
    for a, b in pairs:
        for step in STEPS:
            if not _weaker(a, b, decode=step[0] <= 256):
                continue
            ta, tb = _step(model, a.name, 1, step), _step(model, b.name, 1, step)
            if tb > ta * 1.001:
                bad.append(f"{b.name} {tb * 1e3:.2f} ms > {a.name} {ta * 1e3:.2f} ms at n={step[0]}")
    assert not bad, bad


PROBE = """
import json, sys
from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel
cases = json.loads(sys.argv[1])
out = []
for c in cases:
    m = RustForwardPassPerfModel.from_native({"schema_version": 1, "model_name": c["config"], "system_name": c["system"],
        "backend": "vllm", "backend_version": c["vllm"], "tp_size": c["tp"], "pp_size": 1, "extra": {}})
    out.append([m.estimate_forward_pass_time_ms({"scheduled_requests": {"num_prefill_requests": k, "sum_prefill_tokens": p,
        "num_decode_requests": d, "sum_decode_kv_tokens": s}}) / 1e3 for k, p, d, s in c["steps"]])
print(json.dumps(out))
"""


def test_shipped_fit_reproduces_the_pinned_kernel_tables(tmp_path) -> None:
    """The coefficients in kernels.json predict what aiconfigurator-core 0.12.0 (scripts/test.sh installs
    it) estimates from its tables, within each entry's recorded worst-case fit error, on steps of the
    fit's own grid: the data file is what the script writes from the pinned tables, not a hand edit."""
    import importlib.util
    import json
    import subprocess
    import sys

    spec = importlib.util.spec_from_file_location("kernel_tables", ROOT / "scripts/kernel_tables.py")
    kt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kt)
    if importlib.util.find_spec("aiconfigurator_core") is None:
        pytest.fail("aiconfigurator-core is not installed: pip install --no-deps aiconfigurator-core==0.12.0 (scripts/test.sh does)")
    doc = json.loads((ROOT / "hetcompile/perf/data/kernels.json").read_text())
    assert doc["aiconfigurator_core"] == kt.AICONFIGURATOR_VERSION
    models = {m["name"]: m for m in yaml.safe_load((ROOT / "hetcompile/perf/data/models.yaml").read_text())}
    picks = [("llama-3.1-8b", "H100", 1), ("llama-3.1-70b", "H200", 4), ("qwen2.5-7b", "L40S", 1), ("llama-3.1-8b", "A100-80GB", 2)]
    cases, entries = [], []
    for model, gpu, tp in picks:
        e = next(e for e in doc["entries"] if (e["model"], e["gpu"], e["tp"]) == (model, gpu, tp))
        cfg = tmp_path / model
        cfg.mkdir(exist_ok=True)
        (cfg / "config.json").write_text(json.dumps(kt.config_json(models[model])))
        steps = kt.grid(models[model]["max_context"])[::7]
        system, vllm = kt.KERNEL_SYSTEMS[gpu]
        cases.append({"config": str(cfg), "system": system, "vllm": vllm, "tp": tp, "steps": steps})
        entries.append(e)
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    tables = json.loads(run.stdout.strip().splitlines()[-1])
    for case, e, times in zip(cases, entries, tables):
        a = _arch(e["model"])
        g = catalog.lookup_gpu(e["gpu"])
        cost, head = analytic.layer_cost(a, 2, g, e["tp"]), analytic.head_time(a, 2, g, e["tp"])
        assert cost.source == "kernels"
        for step, t in zip(case["steps"], times):
            pred = a.layers * cost.time(*kt.features(step)) + head
            assert abs(pred / t - 1) <= e["fit"]["max"] + 1e-3, (e["model"], e["gpu"], e["tp"], step, pred, t)
