"""The engine arguments a replica runs with: the `vllm serve` settings the plan decided.

One list per replica, read by two consumers so that they cannot disagree:

- the vLLM backend (backends/vllm.py) writes them as flags into every node's script, and adds
  what is per node (rank, master address, host/port on the head, `--headless` elsewhere);
- the plan document (ir/document.py) records them per replica (`PlanReplica.engine_args`), so
  `explain OLD NEW`, `migrate` and `deploy` see a change of engine settings (a larger
  max_model_len, another step budget) as a change of the replica, not as "untouched".

Values are plain (unquoted); the backend shell-quotes the ones that come from the spec.
"""

from __future__ import annotations

import json

from hetcompile.ir.problem import Problem, Replica
from hetcompile.perf import analytic
from hetcompile.plan.routing import KV_CONNECTOR, KV_ROLE


def step_budget(ir: Problem, r: Replica) -> int:
    """The tokens per engine step the replica's capacity was computed with (its step model's
    chunk_tokens), pinned on the command line so that vLLM's own per-GPU default cannot differ."""
    sm = r.estimate.step_model
    return sm.chunk_tokens if sm is not None else analytic.step_token_budget(ir.engine.max_num_seqs)


def kv_transfer_config(role: str) -> str:
    """--kv-transfer-config of a prefill or decode replica: vLLM's NixlConnector with the phase's
    kv_role (docs/disaggregation.md). Nothing else is set: a KV load that fails is left to vLLM's default
    handling (its KV-load-failure recovery example reschedules the request and recomputes the prompt), and
    the router retries a decode that fails with a fresh prefill (router/disagg.py)."""
    return json.dumps({"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLE[role]}, sort_keys=True, separators=(",", ":"))


# vLLM's KV block size on GPUs; both sides of a NixlConnector transfer must agree on it (its
# handshake compares them), so a phase replica pins it rather than trusting each side's default
PD_BLOCK_SIZE = 16


def engine_args(ir: Problem, r: Replica) -> tuple[tuple[str, str], ...]:
    """(flag, value) of every engine setting, identical on each node of the replica, in flag order.
    A decode replica runs with its own --max-num-seqs (the C* its TPOT target allows, perf/disagg.py)."""
    m = ir.model(r.model)
    phase: tuple[tuple[str, str], ...] = ()
    if r.role is not None:
        phase = (("--kv-transfer-config", kv_transfer_config(r.role)), ("--block-size", str(PD_BLOCK_SIZE)))
    return (
        ("--served-model-name", m.served_name),
        ("--tensor-parallel-size", str(r.stages[0].tp)),
        ("--pipeline-parallel-size", str(len(r.stages))),
        ("--dtype", r.dtype),
        ("--max-model-len", str(m.max_model_len)),
        ("--gpu-memory-utilization", str(ir.engine.gpu_memory_utilization)),
        ("--max-num-seqs", str(r.max_num_seqs or ir.engine.max_num_seqs)),
        ("--max-num-batched-tokens", str(step_budget(ir, r))),
        *phase,
    )
