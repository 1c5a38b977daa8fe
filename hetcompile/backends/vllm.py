"""vLLM backend: one launch script per node of every replica (`vllm/<replica>/node<k>.sh`).

Engine arguments are identical on every node of a replica (vLLM's mp multi-node backend builds
each node's config from its own CLI); only `--node-rank` and `--headless` (rank > 0, no API
server) differ, and only the head gets `--host/--port`. The dtype is always explicit, and so is the
step token budget (`--max-num-batched-tokens`): the plan's capacity assumes it. Multi-node
replicas export the same VLLM_PP_LAYER_PARTITION on every node (docs/lowering_facts.md §1-2).
Every emitted flag exists in vLLM 0.33 (checked against the pinned table in tests) and in the
0.32 CPU build the end-to-end tests run.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetcompile import __version__
from hetcompile.backends.shell import quote
from hetcompile.backends.templating import render
from hetcompile.ir.engine import engine_args
from hetcompile.ir.problem import Problem, Replica

MASTER_PORT = 29501
QUOTED = ("--served-model-name", "--kv-transfer-config")  # values from the spec, and JSON: one shell word each
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default; one vLLM per node here, so no two instances share it



@dataclass(frozen=True)
class NodeScript:
    replica: str
    rank: int
    path: str  # relative to OUT
    text: str


def engine_flags(ir: Problem, r: Replica, rank: int) -> list[str]:
    """The `vllm serve` flags of one node, one flag (with its value) per line: the replica's engine
    arguments (ir/engine.py, the list plan.json records) and then what is per node."""
    d = len(r.stages)
    flags = [f"{k} {quote(v) if k in QUOTED else v}" for k, v in engine_args(ir, r)]
    if d > 1:
        flags += [
            "--distributed-executor-backend mp",
            f"--nnodes {d}",
            f"--node-rank {rank}",
            '--master-addr "$MASTER_ADDR"',
            f"--master-port {MASTER_PORT}",
        ]
    if rank == 0:
        flags += ['--host "$HOST"', '--port "$PORT"', '"${AUTH[@]}"']
    else:
        flags.append("--headless")
    return flags


def node_scripts(ir: Problem, r: Replica) -> list[NodeScript]:
    m = ir.model(r.model)
    out = []
    d = len(r.stages)
    for rank, s in enumerate(r.stages):
        text = render("node.sh.j2", 
            version=__version__, plan=ir.name, rid=r.id, model=m.name, rank=rank, nnodes=d, gpu=s.gpu, tp=s.tp,
            region=s.region, start=s.layer_start, end=s.layer_end, layers=m.arch.layers, weights=m.weights,
            head=rank == 0, multi=d > 1, port=ir.engine.port, partition=",".join(str(x.layers) for x in r.stages),
            flag_lines=engine_flags(ir, r, rank), role=r.role, nixl_port=NIXL_SIDE_CHANNEL_PORT,
        )
        out.append(NodeScript(replica=r.id, rank=rank, path=f"vllm/{r.id}/node{rank}.sh", text=text))
    return out
