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
    kv_role (docs/disaggregation.md), as compact JSON with sorted keys.

    `kv_load_failure_policy: fail` (KVTransferConfig, vLLM 0.32: "recompute" or "fail", default "fail") is
    pinned, not left to the default: a decode replica whose KV pull fails must end the request, which the
    router then retries with a fresh prefill (router/proxy.py, forward_group). "recompute" would run the
    prompt's prefill on the decode replica, inside the decode steps its --max-num-seqs (C*) was sized for
    without any prompt work (perf/disagg.py)."""
    config = {"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLE[role], "kv_load_failure_policy": "fail"}
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


# vLLM's KV block size on GPUs, pinned on both sides of a NixlConnector transfer rather than trusting
# each side's default: the handshake checks it (vLLM 0.32 can map a remote block size that differs by a
# whole ratio, a path a pinned pair never takes). Of what the handshake's compatibility hash compares,
# the model, --dtype (bfloat16 on every replica) and the KV-cache dtype (never set: "auto" on both) are
# equal by construction; the attention backend is each GPU's default, equal on compute capability 8.x
# and 9.x but not between a B200 and those (docs/disaggregation.md, "What is not there yet").
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
