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
from hetcompile.ir.problem import Problem, Replica
from hetcompile.perf import analytic

MASTER_PORT = 29501



@dataclass(frozen=True)
class NodeScript:
    replica: str
    rank: int
    path: str  # relative to OUT
    text: str


def step_budget(ir: Problem, r: Replica) -> int:
    """The tokens per engine step the replica's capacity was computed with (its step model's
    chunk_tokens), pinned on the command line so that vLLM's own per-GPU default cannot differ."""
    sm = r.estimate.step_model
    return sm.chunk_tokens if sm is not None else analytic.step_token_budget(ir.engine.max_num_seqs)


def engine_flags(ir: Problem, r: Replica, rank: int) -> list[str]:
    """The `vllm serve` flags of one node, one flag (with its value) per line."""
    m = ir.model(r.model)
    d = len(r.stages)
    flags = [
        f"--served-model-name {quote(m.served_name)}",
        f"--tensor-parallel-size {r.stages[0].tp}",
        f"--pipeline-parallel-size {d}",
        f"--dtype {r.dtype}",
        f"--max-model-len {m.max_model_len}",
        f"--gpu-memory-utilization {ir.engine.gpu_memory_utilization}",
        f"--max-num-seqs {ir.engine.max_num_seqs}",
        f"--max-num-batched-tokens {step_budget(ir, r)}",
    ]
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
            flag_lines=engine_flags(ir, r, rank),
        )
        out.append(NodeScript(replica=r.id, rank=rank, path=f"vllm/{r.id}/node{rank}.sh", text=text))
    return out
