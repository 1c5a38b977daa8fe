"""Fidelity of the capacity model against published vLLM measurements.

`python bench/fidelity.py [--data bench/data/fidelity.yaml] [--rows]`

Every row of the data file (one measured point: model, GPU, TP, prompt/output lengths, concurrency,
and the measured output throughput / TPOT / TTFT, with its citation) is predicted with the same
code compose uses (perf/analytic.py -> perf/stepmodel.py -> perf/capacity.py) and the GPU catalog
as shipped. The script prints, per metric, the median absolute relative error |pred - meas| / meas
over the rows that measured it, and the same median *leave-one-GPU-out*: each GPU's rows predicted
with that GPU's calibrated efficiencies removed from the catalog (the catalog defaults stand in),
which is what a GPU with no published measurement gets. The baseline in the same run is the
uncalibrated roofline (`--uncalibrated` semantics: no per-GPU efficiencies, no per-request
overhead, ideal PCIe all-reduce), so the two columns are a ratio measured in one run.

No row is matched by name anywhere in hetcompile; the catalog's per-GPU efficiencies cite the
measurement they were read from (gpus.yaml `eta_source`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

from hetcompile.perf import analytic, capacity, catalog

DATA = Path(__file__).parent / "data" / "fidelity.yaml"
UTIL = 0.9
MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
METRICS = ("throughput", "tpot_ms", "ttft_ms")


def _gpu(name: str, calibrated: bool):
    g = catalog.lookup_gpu(name)
    if g is None:
        sys.exit(f"fidelity: unknown GPU {name!r}")
    if not calibrated:
        g = g.model_copy(update={"eta_memory": None, "eta_compute": None})
    return g


def predict(row: dict, *, calibrated: bool = True, uncalibrated: bool = False) -> dict[str, float]:
    """Model predictions for one row: output tok/s, TPOT ms and TTFT ms at the row's concurrency."""
    found = catalog.lookup_model(row["model"])
    if found is None:
        sys.exit(f"fidelity: unknown model {row['model']!r}")
    _, _, arch = found
    gpu = _gpu(row["gpu"], calibrated and not uncalibrated)
    tp, pp = int(row.get("tp", 1)), int(row.get("pp", 1))
    max_len = min(arch.max_context, 8192)
    entry = analytic.perf_entry(row["model"], arch, 2, gpu, tp, UTIL, max_len)
    part = analytic.balanced_partition(entry, arch.layers, pp, max_len)
    if part is None:
        sys.exit(f"fidelity: {row['id']}: the model does not fit {pp} x {tp} {row['gpu']}")
    stages = [(gpu, tp, k, analytic.stage_kv_tokens(entry, k, i == 0, i == pp - 1)) for i, k in enumerate(part)]
    rm = analytic.replica_model(arch, 2, stages, 5e-6, 64e9, MAX_NUM_SEQS, ideal=uncalibrated)
    I, O = float(row["input"]), float(row["output"])
    est = capacity.chain_capacity(rm, I, O, max_concurrency=row.get("concurrency"))
    return {"throughput": est.decode_tokens_per_s, "tpot_ms": est.tpot_s * 1e3, "ttft_ms": est.ttft_s * 1e3}


def errors(rows: list[dict], **kw) -> dict[str, list[tuple[str, float, float]]]:
    out: dict[str, list[tuple[str, float, float]]] = {m: [] for m in METRICS}
    for r in rows:
        p = predict(r, **kw)
        for m, v in (r.get("metrics") or {}).items():
            out[m].append((r["id"], p[m], float(v)))
    return out


def median_err(items: list[tuple[str, float, float]]) -> float | None:
    return statistics.median(abs(p - v) / v for _, p, v in items) if items else None


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--rows", action="store_true", help="print every row's prediction")
    args = ap.parse_args(argv)
    rows = yaml.safe_load(args.data.read_text())
    base = errors(rows, uncalibrated=True)
    cal = errors(rows)
    logo = {m: [] for m in METRICS}
    for r in rows:
        for m, v in (r.get("metrics") or {}).items():
            logo[m].append((r["id"], predict(r, calibrated=False)[m], float(v)))
    if args.rows:
        print(f"{'row':18} {'metric':10} {'measured':>9} {'uncal.':>9} {'calib.':>9} {'LOGO':>9}")
        for m in METRICS:
            for (rid, pb, v), (_, pc, _), (_, pl, _) in zip(base[m], cal[m], logo[m]):
                print(f"{rid:18} {m:10} {v:9.1f} {pb:9.1f} {pc:9.1f} {pl:9.1f}")
        print()
    print(f"{len(rows)} published rows ({args.data})")
    print(f"{'metric':12} {'n':>3} {'uncalibrated':>13} {'calibrated':>11} {'leave-1-GPU-out':>16}")
    for m in METRICS:
        print(f"{m:12} {len(cal[m]):3d} {_fmt(median_err(base[m])):>13} {_fmt(median_err(cal[m])):>11} "
              f"{_fmt(median_err(logo[m])):>16}")
    big = {r["id"] for r in rows if analytic.total_params(catalog.lookup_model(r["model"])[2]) >= 7e9}
    print(f"on the {len(big)} rows of 7B-and-larger models (what hetcompile plans for):")
    for m in METRICS:
        sub = [[x for x in col[m] if x[0] in big] for col in (base, cal, logo)]
        print(f"{m:12} {len(sub[1]):3d} {_fmt(median_err(sub[0])):>13} {_fmt(median_err(sub[1])):>11} "
              f"{_fmt(median_err(sub[2])):>16}")
    gpus = sorted({r["gpu"] for r in rows})
    print("per GPU (calibrated / leave-one-GPU-out, all metrics pooled):")
    for g in gpus:
        ids = {r["id"] for r in rows if r["gpu"] == g}
        c = [x for m in METRICS for x in cal[m] if x[0] in ids]
        lo = [x for m in METRICS for x in logo[m] if x[0] in ids]
        print(f"  {g:10} {_fmt(median_err(c))} / {_fmt(median_err(lo))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
