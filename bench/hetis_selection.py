"""Search time of Hetis's primary-worker selection at cluster scale (seed 001 §4.1, §6).

    python bench/hetis_selection.py [--per-type 32] [--model llama-2-70b] [--delta 0.05] [--repeat 3]

Hetis reports 15 s for its Parallelizer on a simulated cluster of five GPU types with 32 GPUs each
(160 GPUs); hetcompile's target is <= 5 s on 2 cores. The cluster here: H100, A100-80GB, L40S,
A10 and T4 (all sm_70+, so vLLM 0.33 runs them), `--per-type` of each, TP 1 units. What is timed
is placement/hetis.py end to end: the per-unit dense costs and KV limits from the analytic step
model (perf/analytic.py, as the place pass computes them), the grouping over every instance
count k (types divided evenly, configurations failing the KV filter dropped), the stage mapping
and the delta criterion in every distinct instance, and the TP x PP search inside every kept
unified stage of the chosen configuration. It also prints, for comparison, what the criterion
leaves out of one instance of all 160 GPUs.
Prints the median wall-clock time over `--repeat` runs and the chosen configuration.
"""

from __future__ import annotations

import argparse
import statistics
import time

from hetcompile.perf import analytic, catalog
from hetcompile.placement import hetis

GPUS = ("H100", "A100-80GB", "L40S", "A10", "T4")


def search(model: str, per_type: int, delta: float) -> tuple[hetis.ClusterSelection | None, list, list, int]:
    name, _, arch = catalog.lookup_model(model)
    b, util, max_len = 2, 0.92, 4096
    gpus = [catalog.lookup_gpu(g) for g in GPUS]
    types = []
    for g in gpus:
        e = analytic.perf_entry(name, arch, b, g, 1, util, max_len)
        cost = analytic.layer_cost(arch, b, g, 1).time(analytic.PREFILL_CHUNK, 0.0, 0.0)
        types.append(hetis.UnitType(g.name, per_type, cost, e.max_layers, g.flops))
    cs = hetis.select_cluster(types, arch.layers, delta)
    stages: list[list] = []  # per instance: (type, GPUs, layers, (TP, PP, stage s)) of each kept unified stage
    if cs is not None:
        by_name = {g.name: g for g in gpus}
        for sel in cs.instances:
            ls = hetis.stage_layers(sel.types, sel.kept, arch.layers)
            stages.append([])
            for t, n, layers in zip(sel.types, sel.kept, ls):
                if n and layers:
                    g = by_name[t.name]
                    stages[-1].append((t.name, n, layers, hetis.tp_pp(
                        n, layers, lambda tp, g=g: analytic.layer_cost(arch, b, g, tp).time(analytic.PREFILL_CHUNK, 0.0, 0.0))))
    return cs, stages, types, arch.layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-type", type=int, default=32)
    ap.add_argument("--model", default="llama-2-70b")
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        cs, stages, types, layers = search(a.model, a.per_type, a.delta)
        times.append(time.perf_counter() - t0)
    n = a.per_type * len(GPUS)
    print(f"Hetis primary-worker selection, {len(GPUS)} GPU types x {a.per_type} = {n} GPUs, {a.model}, delta {a.delta:g}")
    print(f"search time: median {statistics.median(times):.3f} s over {a.repeat} runs (min {min(times):.3f}, max {max(times):.3f}); "
          f"Hetis reports 15 s, target <= 5 s")
    if cs is None:
        print("no configuration passes the KV filter")
        return
    print(f"configurations tried: {cs.configs_tried} instance counts; chosen: {len(cs.instances)} instance(s), "
          f"sum 1/C = {cs.score:.4g} steps/s")
    kept = {t.name: 0 for t in cs.instances[0].types}
    out = dict(kept)
    for sel in cs.instances:
        for t, k in zip(sel.types, sel.kept):
            kept[t.name] += k
            out[t.name] += t.count - k
    print("primary workers: " + ", ".join(f"{k}x {g}" for g, k in kept.items() if k))
    print("left out (attention workers in Hetis): " + (", ".join(f"{k}x {g}" for g, k in out.items() if k) or "none"))
    print("instance 0 stages (type, GPUs, layers, TP x PP, stage time): " + "; ".join(
        f"{g} {n} GPUs {k} layers tp{tp} x pp{pp} {t * 1e3:.1f} ms" for g, n, k, (tp, pp, t) in stages[0]))
    one = hetis.select(types, layers, a.delta)  # k = 1: the whole cluster as one instance (the sweep)
    print(f"for comparison, one instance of all {n} GPUs: left out " +
          (", ".join(f"{k}x {g}" for g, k in one.removed().items()) or "none") +
          f"; dense cost {one.full_cost * 1e3:.1f} -> {one.cost * 1e3:.1f} ms per step")


if __name__ == "__main__":
    main()
