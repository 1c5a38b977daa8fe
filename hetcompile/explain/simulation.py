"""The simulation section of `hetcompile explain OUT`: OUT/simulation.json (from `hetcompile
simulate`) as a document section, appended to the text and markdown explanations when present."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from hetcompile.explain.doc import Doc, Section, Table, num, pct
from hetcompile.simulate.doc import SimulationDoc


def read_simulation(plan_path: Path) -> SimulationDoc | None:
    """OUT/simulation.json next to the plan, or None when there is none (or it cannot be read)."""
    p = Path(plan_path)
    path = (p if p.is_dir() else p.parent) / "simulation.json"
    try:
        return SimulationDoc.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError):
        return None


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.4g}"


def simulation_section(sim: SimulationDoc) -> Section:
    rows = []
    for w in sim.workloads:
        rows.append((
            w.name, num(w.planned_requests_per_s), num(w.offered_requests_per_s), num(w.throughput_requests_per_s),
            _ms(w.ttft_s.p50), _ms(w.ttft_s.p99), _ms(w.tpot_s.p50), _ms(w.tpot_s.p99), pct(w.slo_attainment),
        ))
    headers = ("workload", "plan/s", "offer/s", "served/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "SLO met")
    table = Table(headers, tuple(tuple(str(c) for c in r) for r in rows))
    if sim.arrivals.startswith("poisson stages "):  # --stages: the load changes over the run
        offered = (f"poisson arrivals in stages (load x the planned rates : duration) "
                   f"{sim.arrivals.removeprefix('poisson stages ')}, {num(sim.duration_s)} s in all")
    else:
        offered = f"{sim.arrivals} arrivals at {num(sim.load)}x the planned rates for {num(sim.duration_s)} s"
    intro = (f"{offered} (first {num(sim.warmup_s)} s not measured), seed {sim.seed}, router policy {sim.policy}; "
             "rates in requests/s, TTFT and TPOT in ms")
    reps = ", ".join(f"{r.id} {pct(r.utilization)}" + (f" ({r.preemptions} preemptions)" if r.preemptions else "")
                     for r in sim.replicas)
    blocks: tuple = (intro, table, f"replicas, load served over full-load capacity (plan.md's busy): {reps}")
    if sim.unfinished:
        blocks += (f"- {sim.unfinished} requests were still queued when the drain limit was reached: the plan is overloaded",)
    return Section("Simulation (simulation.json)", blocks)


def with_simulation(result: str | Doc, plan_path: Path, fmt: str) -> str | Doc:
    """The rendered explanation with the simulation section appended when OUT/simulation.json
    exists: a Doc (text) gets the section, markdown gets it as markdown; json and dot stay as they are."""
    sim = read_simulation(plan_path)
    if sim is None:
        return result
    if isinstance(result, Doc):
        return replace(result, sections=result.sections + (simulation_section(sim),))
    if fmt == "md":
        from hetcompile.explain.render import markdown

        body = markdown(Doc("", (), (simulation_section(sim),)))
        return result + body.split("\n\n", 2)[2]  # drop the empty title and intro
    return result
