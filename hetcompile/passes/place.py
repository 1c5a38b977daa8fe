"""place: give every replica concrete nodes and contiguous layer ranges.

Input: compose's y_c (replicas per shape) and each shape's balanced partition. Output: the node
set (`nodes`) and `replicas`, each an ordered chain of stages {node, tp, [start, end)}. Node ids
are `<region>-<gpu>-<k>` numbered per offer in replica order, so the same spec names the same
nodes. Single-type chains need no search: the shape's partition (balanced by free memory per
layer, seed 003 App. D) is already the placement; max-flow placement over mixed nodes (Helix)
is the `hetcompile.placement` package's job.
"""

from __future__ import annotations

import re

from hetcompile.ir.errors import PassError
from hetcompile.ir.problem import Node, Problem, Replica, Stage
from hetcompile.passes.base import Pass, PassContext


def node_prefix(region: str, gpu: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", f"{region}-{gpu}".lower()).strip("-")


def materialize(ir: Problem) -> tuple[tuple[Node, ...], tuple[Replica, ...]]:
    comp = ir.composition
    counts = dict(comp.counts)
    next_node: dict[str, int] = {}
    owned_left = {o.id: o.owned_nodes for o in ir.offers}
    nodes: list[Node] = []
    replicas: list[Replica] = []
    for sid in sorted(counts, key=lambda s: (ir.shape(s).model, ir.shape(s).region, ir.shape(s).gpu, s)):
        shape = ir.shape(sid)
        offer = ir.offer(shape.offer)
        for _ in range(counts[sid]):
            stages = []
            start = 0
            for k in shape.partition:
                prefix = node_prefix(offer.region, offer.gpu)
                idx = next_node.get(prefix, 0)
                next_node[prefix] = idx + 1
                # a node of `tp` GPUs; owned nodes are used first (they cost nothing)
                owned = owned_left[offer.id] > 0
                if owned:
                    owned_left[offer.id] -= 1
                node = Node(
                    id=f"{prefix}-{idx}", offer=offer.id, region=offer.region, cloud=offer.cloud, gpu=offer.gpu,
                    gpus=shape.tp, price_per_s=0.0 if owned else shape.tp * offer.price_per_gpu_s, owned=owned,
                )
                nodes.append(node)
                stages.append(Stage(node=node.id, gpu=offer.gpu, region=offer.region, tp=shape.tp, layer_start=start, layer_end=start + k))
                start += k
            replicas.append(
                Replica(id=f"r{len(replicas)}", model=shape.model, shape=sid, stages=tuple(stages), dtype="bfloat16", estimate=shape.estimate)
            )
    return tuple(nodes), tuple(replicas)


class Place(Pass):
    name = "place"
    requires = ("composition",)
    provides = "replicas"

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        nodes, replicas = materialize(ir)
        return ir.model_copy(update={"nodes": nodes, "replicas": replicas})

    def verify(self, ir: Problem) -> None:
        used: set[str] = set()
        for r in ir.replicas:
            L = ir.model(r.model).arch.layers
            pos = 0
            for s in r.stages:
                if s.layer_start != pos or s.layer_end <= s.layer_start:
                    raise PassError(f"place: replica {r.id} stages are not contiguous at layer {pos}")
                if s.node in used:
                    raise PassError(f"place: node {s.node} is used twice")
                used.add(s.node)
                pos = s.layer_end
            if pos != L:
                raise PassError(f"place: replica {r.id} covers {pos} of {L} layers")
