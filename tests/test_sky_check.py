"""Offline SkyPilot validation: the YAML shapes verified in docs/lowering_facts.md §6/§8 load, typos fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetcompile.backends.vllm_flags import check_serve_argv, serve_argv_from_script
from hetcompile.testing import sky_check

PP_TASK = """\
name: hc-llama-pp2
resources:
  accelerators: {A100:1, A100-80GB:1}
  disk_size: 256
  ports: 8000
  image_id: docker:vllm/vllm-openai:v0.33.0
num_nodes: 2
envs:
  MODEL_ID: meta-llama/Llama-3.1-8B-Instruct
  VLLM_PP_LAYER_PARTITION: "20,12"
secrets:
  HF_TOKEN: null
run: |
  HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
  export VLLM_HOST_IP=$(echo "$SKYPILOT_NODE_IPS" | sed -n "$((SKYPILOT_NODE_RANK + 1))p")
  COMMON="--tensor-parallel-size $SKYPILOT_NUM_GPUS_PER_NODE --pipeline-parallel-size $SKYPILOT_NUM_NODES \\
    --nnodes $SKYPILOT_NUM_NODES --node-rank $SKYPILOT_NODE_RANK --master-addr $HEAD_IP --dtype bfloat16"
  if [ "$SKYPILOT_NODE_RANK" = "0" ]; then
    vllm serve $MODEL_ID $COMMON --host 0.0.0.0 --port 8000
  else
    vllm serve $MODEL_ID $COMMON --headless
  fi
"""

JOB_GROUP = """\
---
name: hc-llama
execution: parallel
inter_connection: true
---
name: stage0
resources: {infra: k8s, accelerators: A100:1, ports: 8000}
envs: {VLLM_PP_LAYER_PARTITION: "20,12"}
run: |
  vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 1 -pp 2 --nnodes 2 --node-rank 0 \\
    --master-addr stage0-0.${SKYPILOT_JOBGROUP_NAME} --dtype bfloat16 --port 8000
---
name: stage1
resources: {infra: k8s, accelerators: L4:1}
envs: {VLLM_PP_LAYER_PARTITION: "20,12"}
run: |
  vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 1 -pp 2 --nnodes 2 --node-rank 1 \\
    --master-addr stage0-0.${SKYPILOT_JOBGROUP_NAME} --dtype bfloat16 --headless
"""

SERVICE = """\
service:
  readiness_probe: {path: /health, initial_delay_seconds: 1200, timeout_seconds: 15}
  replica_policy:
    min_replicas: 1
    max_replicas: 3
    target_qps_per_replica: {A100: 5, L4: 1.5}
  load_balancing_policy: instance_aware_least_load
  ports: 8000
resources:
  accelerators: {A100:1, L4:1}
  ports: 8000
envs: {MODEL_ID: Qwen/Qwen2.5-7B-Instruct}
run: vllm serve $MODEL_ID --port 8000 --served-model-name qwen
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_multinode_pp_task_loads(tmp_path: Path) -> None:
    task = sky_check.load_task(_write(tmp_path, "pp.yaml", PP_TASK))
    assert task.name == "hc-llama-pp2"
    assert task.num_nodes == 2
    assert task.envs["VLLM_PP_LAYER_PARTITION"] == "20,12"
    assert sorted(acc for r in task.resources for acc in r.accelerators) == ["A100", "A100-80GB"]
    assert sky_check.check_task(tmp_path / "pp.yaml") == []
    # Its run block holds two `vllm serve` commands that the flag table accepts.
    found = serve_argv_from_script(task.run)
    assert len(found) == 2
    assert all(check_serve_argv(argv) == [] for argv in found)


def test_job_group_loads(tmp_path: Path) -> None:
    dag = sky_check.load_job_group(_write(tmp_path, "jg.yaml", JOB_GROUP))
    assert [t.name for t in dag.tasks] == ["stage0", "stage1"]
    for task in dag.tasks:
        [argv] = serve_argv_from_script(task.run)
        assert check_serve_argv(argv) == []


def test_service_task_passes_serve_rules(tmp_path: Path) -> None:
    task = sky_check.load_service_task(_write(tmp_path, "svc.yaml", SERVICE))
    assert task.service is not None


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (PP_TASK.replace("resources:", "resourcez:", 1), "Instead of 'resourcez', did you mean 'resources'?"),
        (PP_TASK.replace("  disk_size: 256", "  gpu_type: A100"), "Found unsupported field 'gpu_type'"),
        (PP_TASK.replace("  ports: 8000", "  use_spot: \"yes\""), "'yes' is not of type 'boolean'"),
        (PP_TASK.replace("  MODEL_ID:", "  1BAD:"), "invalid keys"),
    ],
)
def test_broken_task_is_rejected(tmp_path: Path, broken: str, message: str) -> None:
    path = _write(tmp_path, "bad.yaml", broken)
    sky = sky_check.sky_module()
    with pytest.raises(sky.exceptions.InvalidSkyPilotConfigError, match="Invalid"):
        sky_check.load_task(path)
    [problem] = sky_check.check_task(path)
    assert message in problem


def test_broken_service_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, "svc.yaml", SERVICE.replace("instance_aware_least_load", "least_load"))
    with pytest.raises(ValueError, match="instance_aware_least_load"):
        sky_check.load_service_task(path)


def test_broken_job_group_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, "jg.yaml", JOB_GROUP.replace("resources: {infra: k8s, accelerators: L4:1}",
                                                         "resourcez: {infra: k8s, accelerators: L4:1}"))
    with pytest.raises(Exception, match="did you mean 'resources'"):
        sky_check.load_job_group(path)


def test_real_home_is_left_alone(tmp_path: Path) -> None:
    home = os.environ.get("HOME")
    sky_check.load_task(_write(tmp_path, "pp.yaml", PP_TASK))
    assert os.environ.get("HOME") == home
    assert "SKYPILOT_GLOBAL_CONFIG" not in os.environ or os.environ["SKYPILOT_GLOBAL_CONFIG"] != str(
        sky_check._scratch_home() / ".sky" / "config.yaml"
    )
    assert (sky_check._scratch_home() / ".sky" / "user_hash").exists()
