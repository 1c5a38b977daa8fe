"""What the roofline fallback is worth: its step times against the measured kernel tables' on the GPUs that have both.

`python bench/roofline_vs_kernels.py`

A plan on an L4, T4 or A10G gets its step times from the roofline (perf/analytic.roofline_cost: datasheet
FLOP/s and bandwidth at the efficiencies bench/fidelity.py fitted, inside their physical bounds, or the
defaults: the fitted GPUs' medians, perf/data/calibration.yaml). On H100, H200, L40S and A100-80GB both sources exist, so the roofline a GPU
without tables would get (the defaults, not a fit to that GPU) can be held against the tables' fit
(perf/kernels.py) on the same steps: decode batches of 1-256 sequences at 512-8k context, prompt chunks of
128-2048 tokens alone and beside 32 decodes, for every catalog model and TP the tables cover. Printed per
GPU and kind of step: the median and the 10th-90th percentile of roofline / kernels (1.00 = the same;
above 1, the roofline is slower). Deterministic; no solver, no simulation.
"""

from __future__ import annotations

import statistics
import sys

import numpy as np

from hetcompile.perf import analytic, catalog, kernels

STEPS = {
    "decode": [(b, b * c, b * c) for b in (1, 8, 32, 128, 256) for c in (512, 2048, 8192)],
    "prefill": [(p, 0.0, p * p / 2.0) for p in (128, 512, 1024, 2048)],
    "mixed": [(p + 32, 32 * 2048, 32 * 2048 + p * p / 2.0) for p in (256, 1024, 2048)],
}


def ratios(gpu: str) -> dict[str, list[float]]:
    """roofline / kernels step time per kind of step over every (model, TP) the tables cover."""
    g = catalog.lookup_gpu(gpu)
    # a GPU without rows or tables of its own: the defaults, uncapped (its own tables would cap them)
    default = g.model_copy(update={"eta_memory": analytic.ETA_MEMORY, "eta_compute": analytic.ETA_COMPUTE})
    out: dict[str, list[float]] = {k: [] for k in STEPS}
    for name in catalog.model_names():
        arch = catalog.lookup_model(name)[2]
        for tp in (1, 2, 4, 8):
            hit = kernels.lookup(arch, 2, gpu, tp)
            if hit is None:
                continue
            roof = analytic.roofline_cost(arch, 2, default, tp)
            head = 2 * arch.vocab * arch.hidden / (tp * g.mem_bw * analytic.ETA_MEMORY)
            for kind, steps in STEPS.items():
                for n, S, A in steps:
                    k = arch.layers * hit[0].time(n, S, A) + hit[1]
                    r = arch.layers * roof.time(n, S, A) + head
                    out[kind].append(r / k)
    return out


def main() -> int:
    print(f"roofline (default efficiencies: eta_memory {analytic.ETA_MEMORY}, eta_compute "
          f"{analytic.ETA_COMPUTE}, s {analytic.SERIAL_FRACTION}) / measured kernel tables, per step; median [p10, p90]")
    print(f"{'GPU':10} {'tables':22} " + " ".join(f"{k:>22}" for k in STEPS))
    for gpu, src in sorted(kernels.gpus().items()):
        r = ratios(gpu)
        cells = [f"{statistics.median(v):.2f} [{np.percentile(v, 10):.2f}, {np.percentile(v, 90):.2f}]" for v in r.values()]
        print(f"{gpu:10} {src:22} " + " ".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
