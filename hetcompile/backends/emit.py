"""Write every artifact of a finished plan into an output directory (the backend driver)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from hetcompile.backends import deploy, skypilot, vllm
from hetcompile.plan.canon import dumps_json
from hetcompile.backends.plan_json import plan_dict, timings_dict
from hetcompile.backends.plan_md import plan_md
from hetcompile.errors import BackendError
from hetcompile.ir.problem import Problem
from hetcompile.plan.doc import PlanDoc
from hetcompile.plan.io import check_plan_doc


Pictures = Callable[[PlanDoc], dict[str, str]]  # the plan as plan.json has it -> {"plan.md": block, "charts/x.svg": svg}


def artifacts(ir: Problem, pictures: Pictures | None = None) -> dict[str, str]:
    """Relative path -> file text, for every artifact; pure, so tests can compare without disk.
    `pictures` (explain/pictures.py, passed in by the CLI: backends sit below explain) adds the
    Mermaid diagram to plan.md and the SVG charts it links."""
    assert ir.replicas is not None and ir.routing is not None  # a built plan has them
    plan = plan_dict(ir)
    text = dumps_json(plan)
    # plan.md and the pictures read the plan as written (rounded), as `hetcompile explain` of plan.json would
    doc = check_plan_doc(json.loads(text))
    extra = dict(pictures(doc)) if pictures is not None else {}
    files: dict[str, str] = {"plan.json": text, "plan.md": plan_md(doc, extra.pop("plan.md", ""))}
    files.update(extra)
    for r in ir.replicas:
        scripts = vllm.node_scripts(ir, r)
        for s in scripts:
            files[s.path] = s.text
        files[f"sky/{r.id}.yaml"] = skypilot.replica_task(ir, r, scripts)
    files["sky/router.yaml"] = skypilot.router_task(ir)
    files["router/routing.json"] = dumps_json(ir.routing.model_dump(mode="json"))
    files["deploy.sh"] = deploy.deploy_sh(ir)
    files["teardown.sh"] = deploy.teardown_sh(ir)
    return dict(sorted(files.items()))


def _inside(out: Path, rel: str) -> Path:
    """`out/rel`, refusing any artifact path that would land outside `out` (ids are checked where
    they enter, see names.py; this is the last line of defence, not the first)."""
    path = out / rel
    root = out.resolve()
    if Path(rel).is_absolute() or ".." in Path(rel).parts or not path.resolve().is_relative_to(root):
        raise BackendError(f"refusing to write {rel!r} outside the output directory {str(out)!r}")
    return path


def stale(out: Path, files: dict[str, str], spec_hash: str | None = None) -> list[Path]:
    """What an earlier build left in `out` that describes another plan: sky/<id>.yaml and vllm/<id>/
    of replicas no longer in it (a deploy must not find, nor a person trust, them), charts/*.svg this
    plan does not draw, and a simulation.json (`hetcompile simulate`) of another spec (explain would
    show its numbers under this plan). Everything else there (deploy/ with its record, secrets) is
    left alone."""
    old = [f for f in sorted((out / "sky").glob("*.yaml")) if f"sky/{f.name}" not in files]
    dirs = {rel.split("/")[1] for rel in files if rel.startswith("vllm/")}
    old += [d for d in sorted((out / "vllm").glob("*")) if d.is_dir() and d.name not in dirs]
    old += [f for f in sorted((out / "charts").glob("*.svg")) if f"charts/{f.name}" not in files]
    sim = out / "simulation.json"
    if spec_hash is not None and sim.is_file():
        try:
            simulated = json.loads(sim.read_text()).get("spec_hash")
        except (OSError, ValueError, AttributeError):
            simulated = None
        if simulated != spec_hash:
            old.append(sim)
    return old


def write(ir: Problem, out: Path, pictures: Pictures | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    files = artifacts(ir, pictures)
    for path in stale(out, files, ir.spec_hash):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for rel, text in files.items():
        path = _inside(out, rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if rel.endswith(".sh"):
            os.chmod(path, 0o755)
        written.append(path)
    (out / "timings.json").write_text(dumps_json(timings_dict(ir)))
    return written
