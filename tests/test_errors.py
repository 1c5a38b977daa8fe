"""Bad input gives one clear paragraph with file:line:col and no traceback (golden messages)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetcompile.driver import compile_spec
from hetcompile.errors import EXIT_ERROR, EXIT_INFEASIBLE, EXIT_INTERNAL, EXIT_SPEC, HetcompileError

from conftest import ROOT

CASES = sorted(p.stem for p in (ROOT / "tests/golden/errors").glob("*.yaml"))


@pytest.mark.parametrize("case", CASES)
def test_error_message_golden(case: str, update_golden: bool) -> None:
    spec = Path("tests/golden/errors") / f"{case}.yaml"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with pytest.raises(HetcompileError) as info:
            compile_spec(spec)
    finally:
        os.chdir(cwd)
    message = str(info.value) + "\n"
    golden = ROOT / "tests/golden/errors" / f"{case}.txt"
    if update_golden:
        golden.write_text(message)
    assert message == golden.read_text()


def test_cli_prints_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hetcompile.cli", "build", "tests/golden/errors/unknown_key.yaml", "-o", "/tmp/hc-never"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == EXIT_SPEC
    assert "Traceback" not in proc.stderr
    assert "tests/golden/errors/unknown_key.yaml:9:5" in proc.stderr
    assert "did you mean 'offers'" in proc.stderr


def test_cli_debug_shows_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hetcompile.cli", "--debug", "build", "tests/golden/errors/unknown_key.yaml", "-o", "/tmp/hc-never"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr


def test_unwritable_output_is_one_line_not_a_traceback(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    args = ["build", "examples/tiny-cpu/spec.yaml", "-q", "-o", str(blocker / "out")]
    proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Not a directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    debug = subprocess.run([sys.executable, "-m", "hetcompile.cli", "--debug", *args], cwd=ROOT, capture_output=True, text=True)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.parametrize("case,code", [("unknown_key", EXIT_SPEC), ("budget_too_small", EXIT_INFEASIBLE)])
def test_exit_status_tells_a_spec_to_fix_from_a_spec_that_cannot_be_met(case: str, code: int) -> None:
    """The exit statuses (docs/cli.md): 4 the spec is malformed, 5 no plan satisfies it, 1 anything else a
    user fixes (here: an output path under a file), 6 a bug."""
    proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", f"tests/golden/errors/{case}.yaml", "-q",
                           "-o", "/tmp/hc-never"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == code, proc.stderr
    assert (EXIT_ERROR, EXIT_SPEC, EXIT_INFEASIBLE, EXIT_INTERNAL) == (1, 4, 5, 6)


@pytest.mark.parametrize("given,guess", [("k8s", "kubernetes"), ("gpc", "gcp"), ("Kubernetes", "kubernetes")])
def test_a_choice_outside_its_list_says_what_was_meant(tmp_path: Path, given: str, guess: str) -> None:
    from hetcompile.ir.lower import load_problem

    spec = tmp_path / "spec.yaml"
    spec.write_text((ROOT / "examples/quickstart/spec.yaml").read_text().replace("cloud: gcp", f"cloud: {given}"))
    with pytest.raises(HetcompileError, match=f"'{given}' is not one of aws, gcp.*did you mean '{guess}'") as info:
        load_problem(spec)
    assert info.value.span is not None and info.value.span.line == 20
