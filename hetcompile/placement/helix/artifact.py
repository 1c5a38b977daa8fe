"""Build placement problems from the Helix artifact's data (`hetcompile/data/helix_reference.json`).

The JSON is Apache-2.0 data extracted from github.com/Thesys-lab/Helix-ASPLOS25 (see its
`artifact` field); it holds clusters, Helix's own T(k) tables (the MILP's node capacities),
per-layer latency tables, KV capacities and the shipped MILP solutions.

Helix semantics are kept on purpose, quirks included:
- bandwidth: cluster files write `x * mbps` (1e6) and the planner divides that value by byte
  sizes, so it is used as x * 1e6 **bytes**/s (a units quirk of the Helix artifact);
- T tables depend on the cluster's whole type mix, so each setup names its table;
- flows count prompt + decode tokens/s; source/sink links carry 2-byte tokens, compute links
  activations (hidden * 2 bytes).
Regions exist only in 3cluster24 (`r0`..`r2`); its coordinator links are drawn per node, so
the coordinator gets a region of its own (`coord`) with averaged region links as defaults.
Node ids are `n<artifact id>`. For the depth-aware model the workload is Helix's (750 in, 240
out) and `max_concurrency` is vLLM's default `--max-num-seqs` 256.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from hetcompile.placement.problem import SINK, SOURCE, Link, ModelSpec, NodeGroup, PlacementProblem, StageProfile
from hetcompile.placement.result import StageUnit


@dataclass(frozen=True)
class HelixSetup:
    name: str
    setup: str  # key in `setups`
    cluster: str  # key in `clusters` (the full graph, not Helix's pruned copy)
    table: str  # key in `node_throughput_tables`
    model: str
    helix_value: float  # Helix's Gurobi objective, prompt + decode tokens/s


SETUPS: dict[str, HelixSetup] = {
    s.name: s
    for s in (
        HelixSetup("single24", "single_llama70b", "cluster24_single", "llama70b__A100x4_L4x8_T4x12", "llama70b", 1289.5557702751735),
        HelixSetup("geo24", "distributed_llama70b", "3cluster24", "llama70b__A100x4_L4x8_T4x12", "llama70b", 1212.1768454598214),
        HelixSetup("highhet42", "highhet_llama70b", "cluster42", "llama70b__cluster42", "llama70b", 4137.547585397642),
        HelixSetup("cluster10", "ablation_quality_cluster10", "cluster10", "llama30b__L4x4_T4x6", "llama30b", 286.5874097546421),
    )
}
ALIASES = {s.setup: s.name for s in SETUPS.values()}
KV_BYTES = {"llama70b": 2 * 8 * 128 * 2, "llama30b": 2 * 52 * 128 * 2}  # 2 (K,V) * kv heads * head dim * fp16
MAX_NUM_SEQS = 256


@lru_cache(maxsize=1)
def reference() -> dict[str, Any]:
    with resources.files("hetcompile.data").joinpath("helix_reference.json").open("r", encoding="utf-8") as f:
        return json.load(f)


def setup_info(name: str) -> HelixSetup:
    key = ALIASES.get(name, name)
    if key not in SETUPS:
        raise KeyError(f"unknown Helix setup {name!r}; known: {', '.join(sorted(SETUPS))}")
    return SETUPS[key]


def _profile(ref: dict, model: str, table: str, mtype: str, tp: int) -> StageProfile | None:
    tables = ref["node_throughput_tables"][table]["tables"]
    prof = ref["gpu_model_profiles"][model].get(mtype)
    if mtype not in tables or prof is None:
        return None
    T = tuple(float(x) for x in tables[mtype])
    kv = prof["kv_cache_capacity_token_layer_entries_by_layers"]
    return StageProfile(
        tp=tp, max_layers=len(T), throughput=T,
        kv_token_layers=tuple(float(kv[str(k)]) for k in range(1, len(T) + 1)),
        decode_time=tuple((float(b), float(ms) * 1e-3) for b, ms in prof["decode_bs2time_ms_per_layer"]),
        prefill_time=tuple((float(b), float(ms) * 1e-3) for b, ms in prof["prompt_bs2time_ms_per_layer"]),
        source=f"helix:{table}/{mtype}",
    )


def _profiles(ref: dict, model: str, table: str, mtype: str) -> tuple[StageProfile, ...]:
    mt = ref["machine_types"][mtype]
    G, base = int(mt["gpus_per_node"]), mt["base_gpu"]
    out = []
    for t in range(G, 0, -1):
        if G % t:
            continue
        name = mtype if t == G else (base if t == 1 else f"{base}x{t}")
        prof = _profile(ref, model, table, name, t)
        if prof is not None:
            out.append(prof)
    return tuple(out)


def load_setup(name: str, *, max_concurrency: int | None = MAX_NUM_SEQS) -> PlacementProblem:
    """The PlacementProblem of a Helix setup: `single24`, `geo24`, `highhet42`, `cluster10`."""
    info = setup_info(name)
    ref = reference()
    m = ref["models"][info.model]
    cl = ref["clusters"][info.cluster]
    c = ref["throughput_model"]["constants"]
    model = ModelSpec(
        name=info.model, num_layers=int(m["num_layers"]), token_bytes=float(m["token_size_bytes"]),
        activation_bytes=float(m["activation_size_bytes_per_token"]), input_tokens=float(c["AVG_INPUT_LEN"]),
        output_tokens=float(c["AVG_OUTPUT_LEN"]), kv_bytes_per_token_layer=float(KV_BYTES[info.model]),
        max_concurrency=max_concurrency,
    )
    by_key: dict[tuple[str, str], list[str]] = {}
    for n in cl["nodes"]:
        region = f"r{n['region']}" if "region" in n else "r0"
        by_key.setdefault((n["type"], region), []).append(f"n{n['id']}")
    groups = []
    for (mtype, region), ids in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        mt = ref["machine_types"][mtype]
        groups.append(
            NodeGroup(
                id_prefix=f"{mtype.lower()}-{region}-", gpu=mt["base_gpu"], region=region, count=len(ids),
                gpus_per_node=int(mt["gpus_per_node"]), profiles=_profiles(ref, info.model, info.table, mtype),
                node_ids=tuple(sorted(ids, key=lambda s: int(s[1:]))),
            )
        )
    if "links_rule" in cl:
        rule = cl["links_rule"]
        link = Link("r0", "r0", float(rule["bandwidth_value_in_code"]), float(rule["latency_s"]))
        return PlacementProblem(info.name, model, tuple(groups), (link,), "r0")
    node_links, region_of = [], {f"n{n['id']}": f"r{n['region']}" for n in cl["nodes"]}
    sums: dict[frozenset, list[tuple[float, float]]] = {}
    for a, b, mbps, ms in cl["links"]:
        ua = SOURCE if a == "source" else f"n{a}"
        ub = SINK if b == "sink" else f"n{b}"
        lk = Link(ua, ub, float(mbps) * 1e6, float(ms) * 1e-3)  # the units quirk: mbps value as bytes/s
        node_links.append(lk)
        ra = "coord" if ua == SOURCE else region_of[ua]
        rb = "coord" if ub == SINK else region_of[ub]
        sums.setdefault(frozenset((ra, rb)), []).append((lk.bandwidth, lk.latency))
    region_links = []
    for k, v in sorted(sums.items(), key=lambda kv: sorted(kv[0])):
        ra, rb = sorted(k) if len(k) == 2 else (next(iter(k)),) * 2
        region_links.append(Link(ra, rb, sum(b for b, _ in v) / len(v), sum(t for _, t in v) / len(v)))
    return PlacementProblem(info.name, model, tuple(groups), tuple(region_links), "coord", node_links=tuple(node_links))


def helix_layout(name: str, which: str = "helix", *, problem: PlacementProblem | None = None) -> tuple[StageUnit, ...]:
    """A placement shipped in the artifact: `helix` (its MILP solution), `swarm`, `petals`."""
    info = setup_info(name)
    s = reference()["setups"][info.setup]
    if which == "helix":
        layers = s["helix_ilp"]["placement"]["layers_by_node"]
    else:
        layers = s["baselines"][which]["placement"]["layers_by_node"]
    p = problem or load_setup(name)
    idx = p.node_index()
    units = []
    for nid, (a, b) in sorted(layers.items(), key=lambda kv: int(kv[0])):
        node = f"n{nid}"
        gi = idx[node][0]
        g = p.groups[gi]
        units.append(StageUnit(node, node, gi, g.gpus_per_node, tuple(range(g.gpus_per_node)), int(a), int(b)))
    return tuple(units)
