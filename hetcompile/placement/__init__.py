"""Helix-style max-flow model placement: the algorithmic core of the `place` pass.

    place(problem, mode="chains" | "shared", objective="depth-aware" | "helix", options=SolverOptions())

- `chains` (default, deployable): replicas are chains with one TP size (vLLM 0.33); the default
  objective is the depth-aware capacity (evaluate.py), `helix` maximizes Helix's flow of chains.
- `shared`: Helix's per-request pipelines, for comparison only (never deployable); always
  maximizes Helix's flow, with an honest bound (bound.py) and gap; the depth-aware capacity is
  evaluated on its flow paths. `partial_inference=True` follows the paper's option.
Solver time, gap, threads and seed come from the caller; a timeout returns the best incumbent
found with its gap. `verify_result(result)` re-checks the placement and its flow with networkx.
"""

from __future__ import annotations

from dataclasses import replace

from hetcompile.opt.solve import SolverOptions
from hetcompile.placement.chains import place_chains
from hetcompile.placement.problem import Link, ModelSpec, NodeGroup, PlacementProblem, StageProfile
from hetcompile.placement.result import ChainInfo, PlacementResult, SolveRecord, StageUnit
from hetcompile.placement.shared import place_shared
from hetcompile.placement.verify import summary_lines, verify_result

__all__ = [
    "ChainInfo", "Link", "ModelSpec", "NodeGroup", "PlacementProblem", "PlacementResult", "SolveRecord",
    "SolverOptions", "StageProfile", "StageUnit", "place", "summary_lines", "verify_result",
]


def place(
    problem: PlacementProblem, *, mode: str = "chains", objective: str = "depth-aware",
    options: SolverOptions | None = None, partial_inference: bool = False,
) -> PlacementResult:
    """Place the model's layers on the problem's nodes (see the module docstring)."""
    options = options or SolverOptions()
    if mode not in ("chains", "shared"):
        raise ValueError(f"mode must be 'chains' or 'shared', not {mode!r}")
    if objective not in ("depth-aware", "helix"):
        raise ValueError(f"objective must be 'depth-aware' or 'helix', not {objective!r}")
    if mode == "chains":
        if partial_inference:
            raise ValueError("partial inference needs shared pipelines (mode='shared'); a vLLM chain runs every layer once")
        return place_chains(problem, options, objective=objective)
    res = place_shared(problem, options, partial=partial_inference, objective="helix")
    if objective == "depth-aware":
        note = ("shared pipelines maximize Helix's flow (no engine runs them); the depth-aware capacity is "
                "evaluated on that placement's flow paths")
        res = replace(res, notes=res.notes + (note,))
    return res
