"""Human output of the examples reads as numbers for people (issue 20, item 5).

No scientific notation anywhere a person reads (plan.md, explain md and text, diffs, error
messages, the build line), correct plurals, diff columns with people's names, and terminal tables
that fit the width without splitting a word. The goldens are the examples' human output
(test_examples / test_explain keep them current), so scanning them covers every example.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from hetcompile.explain import explain_plan
from hetcompile.migrate.planner import plan_diff
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.io import check_plan_doc
from hetcompile.explain.doc import Table, diff_doc, explanation_doc
from hetcompile.explain.render import text

EXPONENT = re.compile(r"(?<![\w.])\d+(\.\d+)?[eE][+-]?\d+\b")
HUMAN_GOLDENS = sorted(
    [*ROOT.glob("tests/golden/*/plan.md"), *ROOT.glob("tests/golden/explain/*.md"), *ROOT.glob("tests/golden/errors/*.txt")]
)
PLANS = sorted(p.parent.name for p in ROOT.glob("tests/golden/*/plan.json"))


def _plan(name: str) -> PlanDoc:
    return check_plan_doc(_plan_json(name))


def _plan_json(name: str) -> dict:
    return json.loads((ROOT / "tests/golden" / name / "plan.json").read_text())


@pytest.mark.parametrize("path", HUMAN_GOLDENS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_scientific_notation_or_odd_plurals_in_human_goldens(path) -> None:
    body = path.read_text()
    # the mermaid block and code spans may carry ids; numbers a person reads are outside them
    prose = re.sub(r"```.*?```", "", body, flags=re.S)
    hits = [m.group(0) for m in EXPONENT.finditer(prose)]
    assert not hits, f"{path.name}: scientific notation {hits[:5]}"
    assert not re.search(r"\b1 (replicas|nodes|GPUs)\b", prose), path.name
    assert "node(s)" not in prose and "replica(s)" not in prose, path.name


def test_exponent_pattern_can_fail() -> None:
    assert EXPONENT.search("| tokens_per_dollar | 7.16759e+06 |")
    assert EXPONENT.search("2.339e+04 tokens/s")
    assert not EXPONENT.search("23.4k tokens/s, r1e2 ids, sha 3e4a")


def _words_whole(doc_tables: list[Table], out: str) -> None:
    tokens = set(out.split())
    for t in doc_tables:
        for cell in [*t.headers, *(c for r in t.rows for c in r)]:
            for w in cell.split():
                assert any(w in tok for tok in tokens), f"word {w!r} was split in the terminal output"


@pytest.mark.parametrize("name", PLANS)
@pytest.mark.parametrize("width", [80, 132])
def test_explain_text_fits_width_without_splitting_words(name: str, width: int) -> None:
    doc = explanation_doc(explain_plan(_plan(name)))
    out = text(doc, width=width)
    assert not EXPONENT.search(out), EXPONENT.search(out).group(0)
    assert max(len(line) for line in out.splitlines()) <= width
    tables = [b for s in doc.sections for b in s.blocks if isinstance(b, Table)]
    _words_whole(tables, out)


def test_diff_text_has_people_names_and_no_exponent() -> None:
    old = _plan_json("quickstart")
    new = json.loads(json.dumps(old))
    new["totals"]["tokens_per_dollar"] = old["totals"]["tokens_per_dollar"] * 0.9
    new["totals"]["price_per_hour"] = old["totals"]["price_per_hour"] + 1.5
    doc = diff_doc(plan_diff(check_plan_doc(old), check_plan_doc(new)))
    out = text(doc, width=80)
    assert "tokens per dollar" in out and "tokens_per_dollar" not in out
    assert "price_per_hour" not in out and "+$1.50/h" in out
    assert not EXPONENT.search(out)
    assert max(len(line) for line in out.splitlines()) <= 80


def test_build_line_reads_for_people(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hetcompile.cli", "build", "examples/quickstart/spec.yaml", "-o", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[0]
    assert not EXPONENT.search(proc.stdout), line
    assert re.search(r"\d+(\.\d+)?k tokens/s", line), line
    assert "replicas on" in line or "replica on" in line


def test_plan_md_states_max_model_len_and_each_replicas_machines() -> None:
    """plan.md's replica table: --max-model-len, and how many machines of how many GPUs (a slice of a
    bigger offer's machine says so)."""
    from conftest import ROOT

    md = (ROOT / "tests/golden/llama70b-pp/plan.md").read_text()
    assert "| nodes |" in md and "| max model len |" in md
    assert "| r3 | llama-3-70b | A10G x8 | 2 x 4-GPU | us-east-1 | 4 | 2 | 40,40 |" in md and "| 4096 |" in md
