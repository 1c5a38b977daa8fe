"""What `place` returns: concrete stage units, chains, flows, capacities and the solve log.

A *stage unit* is what holds one contiguous layer range: a whole node at its native TP, or one
TP slice of a multi-GPU node split for a mixed chain (`<node>#<j>` on GPUs gpus).
`placement.verify.verify_result` rebuilds the Helix graph of the final placement and checks with networkx that its max flow is
the flow reported (and, for chains, that every chain covers [0, L) with one TP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from hetcompile.placement.problem import PlacementProblem

Mode = Literal["chains", "shared"]
Objective = Literal["depth-aware", "helix"]


@dataclass(frozen=True)
class StageUnit:
    unit: str  # node id, or `<node>#<j>` for the j-th TP slice of a split node
    node: str
    gi: int  # group index in the problem
    tp: int
    gpus: tuple[int, ...]  # GPU indices on the node
    start: int
    end: int  # exclusive

    @property
    def layers(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ChainInfo:
    """One deployable replica: ordered stages with one TP; capacity by the depth-aware model."""

    id: str
    stages: tuple[StageUnit, ...]
    tp: int
    mixed: bool  # mixes GPU types (needs a SkyPilot job group on Kubernetes)
    split_nodes: tuple[str, ...]  # nodes cut into TP slices for this chain
    depth: int
    concurrency: float  # C: in-flight requests (min over stages of KV / context, max-num-seqs)
    concurrency_limit: str  # "kv:<unit>" or "max-num-seqs"
    micro_batch: float  # b = C / d
    capacity: float  # depth-aware tokens/s (prompt + decode)
    binding: str  # "stage:<unit>" (slowest stage) or "latency" (round trip incl. hops)
    helix_flow: float  # Helix semantics: min over stages of T(k) and over hops of link capacity

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.stages)

    @property
    def layer_partition(self) -> tuple[int, ...]:
        return tuple(s.layers for s in self.stages)


@dataclass(frozen=True)
class SolveRecord:
    """One solver call or heuristic: the same fields as the shared SolveResult."""

    name: str
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    time_s: float


@dataclass(frozen=True)
class PlacementResult:
    problem_name: str
    mode: Mode
    objective: Objective
    units: tuple[StageUnit, ...]
    chains: tuple[ChainInfo, ...]  # chains mode: the replicas; shared mode: empty
    edge_flows: tuple[tuple[str, str, float], ...]  # Helix max flow on this placement, by unit
    helix_flow: float  # max flow, Helix semantics (prompt + decode tokens/s)
    depth_aware_capacity: float  # tokens/s by the depth-aware model
    bound: float | None  # upper bound on the objective optimized (None: no proven bound)
    gap: float | None  # (bound - value) / value of the optimized objective
    incumbent_source: str  # which heuristic or MILP produced the final placement
    solves: tuple[SolveRecord, ...]
    time_s: float
    partial_inference: bool = False
    notes: tuple[str, ...] = ()
    machine_dependent: bool = False  # a wall-clock cap, not a work budget, ended some step
    problem: PlacementProblem | None = field(default=None, repr=False, compare=False)

    @property
    def value(self) -> float:
        return self.depth_aware_capacity if self.objective == "depth-aware" and self.mode == "chains" else self.helix_flow

    def node_ranges(self) -> dict[str, tuple[tuple[int, int, int], ...]]:
        """Every concrete node -> its (start, end, tp) units, () when unused."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        if self.problem is not None:
            for g in self.problem.groups:
                for i in g.ids:
                    out[i] = []
        for u in sorted(self.units, key=lambda u: (u.node, u.gpus)):
            out.setdefault(u.node, []).append((u.start, u.end, u.tp))
        return {k: tuple(v) for k, v in sorted(out.items())}


