"""End-to-end golden tests: every example spec -> expected directory of artifacts.

`pytest --update-golden` rewrites tests/golden/<example>/ (do it on purpose, and say why in the
commit message). Also checks what makes a plan real: SkyPilot's own loader accepts every task,
every `vllm serve` flag exists in vLLM 0.33, partitions sum to the model's layers, and the same
spec gives the same bytes in another process with another hash seed.

Each example is built once per test session (conftest.example_artifacts), and every check here and
in other files reads that build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from hetcompile.backends.vllm_flags import check_serve_argv, serve_argv_from_script

EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/spec.yaml"))
# rebuilt in a fresh process: one SLO example that replans, one mixed-GPU queueing-bound example, the
# engine-test example (a rebuild of all twelve doubled this file's time and checked nothing more:
# every example's bytes are pinned by its golden files, built in another process on another day)
AGAIN = ("chat-rag", "hetis-cluster", "tiny-cpu")


@pytest.fixture
def built(example_artifacts):
    return example_artifacts


@pytest.mark.parametrize("name", EXAMPLES)
def test_golden(name: str, update_golden: bool, built) -> None:
    files = built(name)
    gdir = ROOT / "tests" / "golden" / name
    if update_golden:
        if gdir.exists():
            for old in sorted(gdir.rglob("*"), reverse=True):
                old.unlink() if old.is_file() else old.rmdir()
        for rel, text in files.items():
            (gdir / rel).parent.mkdir(parents=True, exist_ok=True)
            (gdir / rel).write_text(text)
    expected = {str(p.relative_to(gdir)): p.read_text() for p in sorted(gdir.rglob("*")) if p.is_file()}
    assert sorted(files) == sorted(expected), "artifact set differs from golden"
    for rel in files:
        assert files[rel] == expected[rel], f"{name}/{rel} differs from golden (pytest --update-golden to accept)"


@pytest.mark.parametrize("name", AGAIN)
def test_same_spec_same_bytes_in_another_process(name: str, tmp_path: Path, built) -> None:
    """`hetcompile build` in a new interpreter with another hash seed (set and dict orders differ)
    writes the bytes this session built: nothing depends on the process, the order of a set or a cache."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", str(ROOT / "examples" / name / "spec.yaml"), "-q",
                    "-o", str(tmp_path)], check=True, env=env, capture_output=True, text=True)
    again = {str(p.relative_to(tmp_path)): p.read_text() for p in sorted(tmp_path.rglob("*"))
             if p.is_file() and p.name != "timings.json"}
    assert again == built(name)


@pytest.mark.parametrize("name", EXAMPLES)
def test_vllm_flags_exist_in_0_33(name: str, built) -> None:
    scripts = {rel: text for rel, text in built(name).items() if rel.startswith("vllm/")}
    assert scripts
    for rel, text in scripts.items():
        commands = serve_argv_from_script(text)
        assert len(commands) == 1, rel
        assert check_serve_argv(commands[0]) == [], rel


@pytest.mark.parametrize("name", EXAMPLES)
def test_partitions_cover_model(name: str, built) -> None:
    plan = json.loads(built(name)["plan.json"])
    layers = {m["name"]: m["layers"] for m in plan["models"]}
    for r in plan["replicas"]:
        assert sum(r["partition"]) == layers[r["model"]]
        assert len({s["tp"] for s in r["stages"]}) == 1
        for rel, text in built(name).items():
            if rel.startswith(f"vllm/{r['id']}/") and r["pp"] > 1:
                assert f'VLLM_PP_LAYER_PARTITION="{",".join(map(str, r["partition"]))}"' in text


@pytest.mark.parametrize("name", EXAMPLES)
def test_sky_tasks_load_with_skypilot(name: str, tmp_path: Path, built) -> None:
    from hetcompile.testing.sky_check import load_task

    from hetcompile.testing.sky_check import load_job_group

    plan = json.loads(built(name)["plan.json"])
    mixed = {r["id"] for r in plan["replicas"] if r["mixed"]}
    tasks = {rel: text for rel, text in built(name).items() if rel.startswith("sky/")}
    for rel, text in tasks.items():
        path = tmp_path / rel.replace("/", "_")
        path.write_text(text)
        rid = rel.removeprefix("sky/").removesuffix(".yaml")
        if rid in mixed:  # a Job Group: one single-node task per stage, networked on Kubernetes
            dag = load_job_group(path)
            replica = next(r for r in plan["replicas"] if r["id"] == rid)
            assert dag.is_job_group() and dag.inter_connection_enabled() and dag.primary_tasks == ["s0"], rel
            assert [t.name for t in dag.tasks] == [f"s{k}" for k in range(replica["pp"])], rel
            for k, (t, stage) in enumerate(zip(dag.tasks, replica["stages"])):
                assert t.num_nodes == 1 and t.run, rel
                (res,) = t.resources
                assert res.accelerators == {stage["gpu"]: stage["tp"]}, rel
                assert str(res.cloud) == "Kubernetes", rel
                assert res.ports == (["8000"] if k == 0 else None), rel
        else:
            task = load_task(path)
            assert task.name and task.run, rel


@pytest.mark.parametrize("name", EXAMPLES)
def test_sky_run_embeds_node_scripts(name: str, built) -> None:
    files = built(name)
    for rel, text in files.items():
        if rel.startswith("vllm/"):
            rid = rel.split("/")[1]
            body = "\n".join("  " + line if line else "" for line in text.rstrip("\n").split("\n"))
            assert body in files[f"sky/{rid}.yaml"], f"{rel} is not embedded verbatim in sky/{rid}.yaml"


@pytest.mark.parametrize("name", EXAMPLES)
def test_pictures_are_linked_valid_svg_without_dates(name: str, built) -> None:
    import xml.etree.ElementTree as ET

    files = built(name)
    md = files["plan.md"]
    assert "```mermaid\nflowchart LR" in md and "router" in md
    charts = sorted(rel for rel in files if rel.startswith("charts/"))
    assert "charts/utilization.svg" in charts
    for rel in charts:
        assert f"]({rel})" in md, rel  # plan.md links every chart it ships
        root = ET.fromstring(files[rel])
        assert root.tag.endswith("svg")
        assert "<dc:date>" not in files[rel]
    plan = json.loads(files["plan.json"])
    texts = {t.text for t in ET.fromstring(files["charts/utilization.svg"]).iter() if t.tag.endswith("text")}
    assert {r["id"] for r in plan["replicas"]} <= texts  # a bar per replica, labelled
    assert ("charts/frontier.svg" in charts) == bool(plan.get("alternatives"))
