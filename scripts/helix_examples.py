#!/usr/bin/env python3
"""Write examples/helix-<setup>/ (spec.yaml + layer_profiles.yaml) from the Helix artifact data.

    python scripts/helix_examples.py            # all four setups
    python scripts/helix_examples.py single24   # one

The specs describe the Helix clusters as owned Kubernetes fleets (cost 0) serving Helix's
workload (750 prompt + 240 output tokens), with `placement.pipelines: mixed` and Helix's own
T(k), KV and per-layer latency tables (hetcompile/data/helix_reference.json, Apache-2.0 data
from the Helix artifact) as measured layer profiles. Differences from the exact artifact graph
that `bench/helix_placement.py` solves, on purpose:
- geo24 draws every link per node pair; a spec has one link per region pair, so each region pair
  gets the mean bandwidth and latency of its node pairs, and the coordinator (a node of its own in
  Helix) sits in region r0;
- bandwidths keep Helix's units quirk: a cluster file's `x * mbps` is used as x * 1e6 bytes/s.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import yaml

from hetcompile.placement.helix_import import SETUPS, reference

ROOT = Path(__file__).resolve().parent.parent
MODEL = {"llama70b": "llama-2-70b", "llama30b": "llama-30b"}
WHAT = {
    "single24": "Helix single cluster, 24 nodes (4 A100, 8 L4, 12 T4), LLaMA-2 70B",
    "geo24": "Helix geo-distributed, 3 regions, 24 nodes, LLaMA-2 70B",
    "highhet42": "Helix high heterogeneity, 42 nodes of 7 machine types, LLaMA-2 70B",
    "cluster10": "Helix cluster10 (4 L4, 6 T4), LLaMA 30B",
}


def _bw(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.6g}MB/s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.6g}ms"


def layer_profiles(name: str) -> list[dict]:
    info = SETUPS[name]
    ref = reference()
    tables = ref["node_throughput_tables"][info.table]["tables"]
    out = []
    for mtype, T in sorted(tables.items()):
        prof = ref["gpu_model_profiles"][info.model].get(mtype)
        mt = ref["machine_types"][mtype]
        if prof is None:
            continue
        kv = prof["kv_cache_capacity_token_layer_entries_by_layers"]
        out.append({
            "model": MODEL[info.model], "gpu": mt["base_gpu"], "tp": int(mt["gpus_per_node"]),
            "throughput": [round(float(x), 6) for x in T],
            "kv_token_layers": [float(kv[str(k)]) for k in range(1, len(T) + 1)],
            "decode_time": [[float(b), f"{float(ms):g}ms"] for b, ms in prof["decode_bs2time_ms_per_layer"]],
            "prefill_time": [[float(b), f"{float(ms):g}ms"] for b, ms in prof["prompt_bs2time_ms_per_layer"]],
            "source": f"Helix artifact {info.table}/{mtype} (T), gpu_model_profiles/{info.model}/{mtype}",
        })
    return out


def regions_and_links(name: str) -> tuple[list[dict], dict]:
    info = SETUPS[name]
    ref = reference()
    cl = ref["clusters"][info.cluster]
    counts: dict[tuple[str, str, int], int] = defaultdict(int)
    for n in cl["nodes"]:
        mt = ref["machine_types"][n["type"]]
        counts[(f"r{n.get('region', 0)}", mt["base_gpu"], int(mt["gpus_per_node"]))] += 1
    regions = []
    for r in sorted({k[0] for k in counts}):
        offers = [
            {"gpu": gpu, "gpus_per_node": g, "max_nodes": c, "owned": c}
            for (rr, gpu, g), c in sorted(counts.items()) if rr == r
        ]
        regions.append({"name": r, "cloud": "kubernetes", "offers": offers})
    if "links_rule" in cl:
        rule = cl["links_rule"]
        net = {"intra_region": {"bandwidth": _bw(rule["bandwidth_value_in_code"]), "latency": _ms(rule["latency_s"])}}
        return regions, net
    region_of = {n["id"]: f"r{n['region']}" for n in cl["nodes"]}
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for a, b, mbps, ms in cl["links"]:
        if a == "source" or b == "sink":
            continue
        key = tuple(sorted((region_of[a], region_of[b])))
        pairs[key].append((float(mbps) * 1e6, float(ms) * 1e-3))
    intra = [v for (a, b), vs in pairs.items() if a == b for v in vs]
    inter = [v for (a, b), vs in pairs.items() if a != b for v in vs]
    mean = lambda vs, i: sum(v[i] for v in vs) / len(vs)  # noqa: E731
    net = {
        "intra_region": {"bandwidth": _bw(mean(intra, 0)), "latency": _ms(mean(intra, 1))},
        "inter_region": {"bandwidth": _bw(mean(inter, 0)), "latency": _ms(mean(inter, 1))},
        "links": [
            {"between": [a, b], "bandwidth": _bw(mean(vs, 0)), "latency": _ms(mean(vs, 1))}
            for (a, b), vs in sorted(pairs.items())
        ],
    }
    return regions, net


def spec(name: str) -> dict:
    info = SETUPS[name]
    c = reference()["throughput_model"]["constants"]
    regions, net = regions_and_links(name)
    return {
        "name": f"helix-{name}",
        "models": [{"name": MODEL[info.model], "dtype": "fp16", "max_model_len": int(c["MAX_INPUT_LEN"])}],
        "workloads": [{"name": "helix", "model": MODEL[info.model], "input_tokens": int(c["AVG_INPUT_LEN"]),
                       "output_tokens": int(c["AVG_OUTPUT_LEN"]), "share": "100%"}],
        "regions": regions,
        "network": net,
        "objective": "max-throughput",
        "solver": {"time_limit": "60s", "mip_gap": "0.1%", "threads": 1, "seed": 0},
        # highhet42's shared-pipeline comparison runs into the time limit (about 60 s on 2 cores), so a
        # build would depend on the machine's speed; bench/helix_placement.py reports that comparison
        "placement": {"pipelines": "mixed", "objective": "depth-aware", "compare_shared": name != "highhet42",
                      "layer_profiles": ["layer_profiles.yaml"]},
    }


HEADER = """# {what}.
# Generated by scripts/helix_examples.py from hetcompile/data/helix_reference.json (Helix artifact
# data, Apache-2.0): owned Kubernetes nodes, Helix's workload, Helix's T(k) tables as measured
# layer profiles. Bandwidths keep Helix's units quirk (`x * mbps` used as x * 1e6 bytes/s).
"""


def write(name: str) -> None:
    d = ROOT / "examples" / f"helix-{name}"
    d.mkdir(parents=True, exist_ok=True)
    dump = lambda x: yaml.safe_dump(x, sort_keys=False, default_flow_style=None, width=200)  # noqa: E731
    (d / "spec.yaml").write_text(HEADER.format(what=WHAT[name]) + dump(spec(name)))
    (d / "layer_profiles.yaml").write_text(HEADER.format(what=f"Layer profiles of {WHAT[name]}") + dump(layer_profiles(name)))
    print(f"wrote {d}/spec.yaml, layer_profiles.yaml")


if __name__ == "__main__":
    for n in sys.argv[1:] or sorted(SETUPS):
        write(n)
