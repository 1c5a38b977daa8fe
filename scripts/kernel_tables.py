"""Tabulate measured-kernel step times into perf/data/kernels.json (the step model's `kernels` source).

NVIDIA's aiconfigurator-core (pinned below; `pip install 'hetcompile[kernels]'` or
`pip install --no-deps aiconfigurator-core==0.12.0`, the path used here needs only numpy) ships
per-operation latency tables measured under vLLM (GEMM, context and generation attention,
all-reduce) and an estimator of one forward pass from them. For every catalog model (a Llama-shaped
config.json written from perf/data/models.yaml, so nothing is downloaded), every catalog GPU with
tables (KERNEL_SYSTEMS) and TP in {1, 2, 4, 8}, this script

    1. evaluates T(step) on a grid of engine steps: decode batches of m = 1..512 sequences at
       contexts 128..32k, lone prompts of 16..8192 tokens, several prompts at once, and prompt
       chunks mixed with decodes (the step shapes vLLM's chunked prefill runs);
    2. fits the per-layer coefficients of perf/stepmodel.py's layer(n, S, A) and a per-step head
       term h:  T = L layer(n, S, A) + h,  by least squares on log(T_fit / T_table) (every step
       counts in relative error; all coefficients >= 0, s in [0, 1]).

The fit is the smoothing the tables need (neighbouring GEMM sizes wobble by up to 13%) and keeps one
step-time formula for every consumer: placement's search, the capacity formula, the tail model and
the simulator read the same coefficients whichever source filled them. Each entry records the fit's
median / p90 / max relative error against the tables over its grid, the table's system and vLLM
version, and the architecture it was fitted for (a spec model with the same shapes gets it too).

Deterministic: a fixed grid, a fixed start, coefficients rounded to 6 significant digits.

    python scripts/kernel_tables.py [-o hetcompile/perf/data/kernels.json] [--only MODEL] [--gpu GPU]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

AICONFIGURATOR_VERSION = "0.12.0"
# catalog GPU -> (aiconfigurator system, vLLM version of its tables). A100 (40 GB) is left out: the
# a100_sxm tables were measured on the 80 GB card (2039 GB/s, not 1555), which would make every
# memory-bound step of a 40 GB card about 30% too fast.
KERNEL_SYSTEMS = {
    "H100": ("h100_sxm", "0.24.0"),
    "H200": ("h200_sxm", "0.24.0"),
    "A100-80GB": ("a100_sxm", "0.14.0"),
    "L40S": ("l40s", "0.24.0"),
}
TPS = (1, 2, 4, 8)

DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXTS = (128, 512, 2048, 8192, 32768)
PROMPTS = (16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 8192)
MIXED = [(p, b, c) for p in (128, 512, 1024, 2048) for b in (8, 32, 128) for c in (512, 2048, 8192)]
MULTI = [(k, p) for k in (2, 4, 8) for p in (64, 256, 512)]  # k prompts of p tokens in one step


def grid(max_context: int) -> list[tuple[int, int, int, int]]:
    """(prefill requests, prefill tokens, decode sequences, decode KV tokens) of each step."""
    steps = [(0, 0, b, b * c) for b in DECODE_BATCHES for c in CONTEXTS if c <= max_context]
    steps += [(1, p, 0, 0) for p in PROMPTS if p <= max_context]
    steps += [(k, k * p, 0, 0) for k, p in MULTI]
    steps += [(1, p, b, b * c) for p, b, c in MIXED if c <= max_context]
    return steps


def features(step: tuple[int, int, int, int]) -> tuple[float, float, float]:
    """(n tokens, S context tokens read by decodes, A attention pairs) as perf/stepmodel.py counts them."""
    k, p, m, s = step
    return float(p + m), float(s), float(s + (p * p / (2.0 * k) if k else 0.0))


def config_json(m: dict) -> dict:
    """A Llama-shaped HF config for a catalog model (the estimator reads shapes only)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": m["hidden"], "intermediate_size": m["intermediate"], "num_attention_heads": m["heads"],
        "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"], "num_hidden_layers": m["layers"],
        "vocab_size": m["vocab"], "max_position_embeddings": m["max_context"], "tie_word_embeddings": m["tie_embeddings"],
        "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
    }


def layer_time(theta: np.ndarray, n: np.ndarray, S: np.ndarray, A: np.ndarray) -> np.ndarray:
    """perf/stepmodel.layer_seconds, vectorized, from log coefficients (s through a logistic)."""
    f, a, w, k, c, c0 = np.exp(theta[:6])
    s = 1.0 / (1.0 + np.exp(-theta[6]))
    compute, memory = f * n + a * A, w + k * S
    return np.maximum(compute, memory) + s * np.minimum(compute, memory) + c * n + c0


def fit_entry(times: np.ndarray, steps: list, layers: int, start: dict) -> tuple[dict, float, dict]:
    from scipy.optimize import least_squares  # a dependency of aiconfigurator-core, not of hetcompile

    n, S, A = (np.array(v) for v in zip(*(features(s) for s in steps)))
    # x = (log f, log a, log w, log k, log c, log c0, logit s, log h)
    x0 = np.array([*np.log([start["f"], start["a"], start["w"], start["k"], 1e-9, 5e-6]), 0.0, math.log(start["h"])])

    def model(x: np.ndarray) -> np.ndarray:
        return layers * layer_time(x[:7], n, S, A) + np.exp(x[7])

    lo, hi = x0 - 14.0, x0 + 6.0  # a box around the roofline start keeps the fit finite
    lo[6], hi[6] = -12.0, 12.0
    r = least_squares(lambda x: np.log(model(x) / times), x0, bounds=(lo, hi), method="trf", max_nfev=4000)
    pred = model(r.x)
    err = np.abs(pred / times - 1.0)
    f, a, w, k, c, c0 = (float(v) for v in np.exp(r.x[:6]))
    s = float(1.0 / (1.0 + math.exp(-r.x[6])))
    cost = {"flop_s_per_token": f, "attn_s_per_pair": a, "weights_s": w, "kv_s_per_token": k,
            "serial_fraction": s, "comm_s_per_token": c, "comm_s": c0}
    stats = {"points": len(steps), "median": float(np.median(err)), "p90": float(np.percentile(err, 90)),
             "max": float(err.max())}
    return cost, float(math.exp(r.x[7])), stats


def sig(x: float) -> float:
    return float(f"{x:.6g}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default=str(Path(__file__).resolve().parents[1] / "hetcompile/perf/data/kernels.json"))
    ap.add_argument("--only", action="append", default=[], help="catalog model name (repeatable)")
    ap.add_argument("--gpu", action="append", default=[], help="catalog GPU name (repeatable)")
    args = ap.parse_args(argv)

    saved_env = os.environ.get("AICONFIGURATOR_SYSTEMS_PATH")
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel

    data = Path(__file__).resolve().parents[1] / "hetcompile/perf/data"
    models = yaml.safe_load((data / "models.yaml").read_text())
    gpus = {g["name"]: g for g in yaml.safe_load((data / "gpus.yaml").read_text())}
    entries: list[dict] = []
    missing: list[dict] = []  # shapes the tables do not cover: those use the roofline
    with tempfile.TemporaryDirectory() as tmp:
        for m in sorted(models, key=lambda m: m["name"]):
            if args.only and m["name"] not in args.only:
                continue
            cfg = Path(tmp) / m["name"]
            cfg.mkdir()
            (cfg / "config.json").write_text(json.dumps(config_json(m)))
            steps = grid(m["max_context"])
            for gname, (system, version) in sorted(KERNEL_SYSTEMS.items()):
                if args.gpu and gname not in args.gpu:
                    continue
                g = gpus[gname]
                for tp in TPS:
                    if m["heads"] % tp or (m["kv_heads"] % tp and tp % m["kv_heads"]):
                        continue
                    est = RustForwardPassPerfModel.from_native({
                        "schema_version": 1, "model_name": str(cfg), "system_name": system, "backend": "vllm",
                        "backend_version": version, "tp_size": tp, "pp_size": 1, "extra": {}})
                    try:
                        times = np.array([est.estimate_forward_pass_time_ms({"scheduled_requests": {
                            "num_prefill_requests": k, "sum_prefill_tokens": p, "num_decode_requests": d,
                            "sum_decode_kv_tokens": s}}) for k, p, d, s in steps]) / 1e3
                    except Exception as e:  # noqa: BLE001 - the tables lack a kernel for this shape
                        missing.append({"model": m["name"], "gpu": gname, "tp": tp, "why": str(e).split(": tried")[0][:160]})
                        print(f"{m['name']:16s} {gname:10s} tp{tp}  no tables: {missing[-1]['why']}", file=sys.stderr)
                        continue
                    # start from the roofline at round efficiencies (perf/analytic.py's formulas)
                    P = m["hidden"] * m["heads"] * m["head_dim"] * 2 + 2 * m["hidden"] * m["kv_heads"] * m["head_dim"] \
                        + 3 * m["hidden"] * m["intermediate"]
                    bw, fl = tp * g["bandwidth_gbps"] * 1e9 * 0.8, tp * g["fp16_tflops"] * 1e12 * 0.7
                    start = {"f": 2 * P / fl, "a": 4 * m["heads"] * m["head_dim"] / fl, "w": 2 * P / bw,
                             "k": 4 * m["kv_heads"] * m["head_dim"] / bw, "h": 2 * m["vocab"] * m["hidden"] / bw}
                    cost, head, stats = fit_entry(times, steps, m["layers"], start)
                    entries.append({
                        "model": m["name"], "gpu": gname, "tp": tp,
                        "arch": {k: m[k] for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab")},
                        "cost": {k: sig(v) for k, v in sorted(cost.items())}, "head_s": sig(head),
                        "fit": {k: (v if k == "points" else round(v, 4)) for k, v in stats.items()},
                    })
                    print(f"{m['name']:16s} {gname:10s} tp{tp}  fit median {stats['median']:.1%} p90 {stats['p90']:.1%} "
                          f"max {stats['max']:.1%}", file=sys.stderr)
    if saved_env is None:
        os.environ.pop("AICONFIGURATOR_SYSTEMS_PATH", None)
    doc = {
        "comment": ["Measured-kernel step times, fitted per (model, GPU, TP) to perf/stepmodel.py's layer(n, S, A).",
                    "Written by scripts/kernel_tables.py from NVIDIA aiconfigurator-core's vLLM tables; do not edit by hand.",
                    "cost: per decoder layer (seconds); head_s: once per step; fit: relative error against the tables.",
                    "JSON, not YAML: a build reads it at start, and JSON loads in milliseconds where YAML took 0.2 s."],
        "generator": "scripts/kernel_tables.py",
        "aiconfigurator_core": AICONFIGURATOR_VERSION,
        "systems": {g: {"system": s, "vllm": v} for g, (s, v) in sorted(KERNEL_SYSTEMS.items())},
        "entries": entries,
        "missing": missing,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(entries)} entries to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
