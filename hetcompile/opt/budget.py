"""Work budgets for placement's searches: deterministic stops, with the wall clock only as a cap.

A search that stops on a wall-clock deadline returns a plan that depends on the machine's speed.
Placement's own loops (local search, iterated local search) count *work* instead: one unit per
neighbour evaluated. The budget also carries the caller's wall-clock cap; when the cap, not the
work, ends a search, `stopped_by` says "time" and the pass reports that its plan may differ on
another machine (the same contract as `SolveResult.limit` for the MILPs, whose work budget is
HiGHS's `mip_max_nodes`, the spec's `solver.node_limit`).
"""

from __future__ import annotations

import math
import time


class Budget:
    """`work` units to spend before `deadline` (time.perf_counter() seconds; inf: no cap)."""

    def __init__(self, work: int, deadline: float = math.inf):
        self.work = int(work)
        self.deadline = deadline
        self.spent = 0
        self.stopped_by: str | None = None  # "work" or "time" once a take() was refused

    def take(self, n: int = 1) -> bool:
        """Spend n units; False (and nothing spent) once the work or the wall-clock cap is used up."""
        if self.spent + n > self.work:
            self.stopped_by = self.stopped_by or "work"
            return False
        if time.perf_counter() > self.deadline:
            self.stopped_by = "time"
            return False
        self.spent += n
        return True

    @property
    def exhausted(self) -> bool:
        """No unit can be taken any more (work used up, or the cap passed)."""
        if self.stopped_by is None and time.perf_counter() > self.deadline:
            self.stopped_by = "time"
        return self.stopped_by is not None or self.spent >= self.work

    def seconds_left(self, floor: float = 0.2) -> float:
        """Wall-clock cap for one inner solve (at least `floor`; a large number when uncapped)."""
        return max(floor, min(1e6, self.deadline - time.perf_counter()))

    def note(self, timed_out: bool) -> None:
        """An inner solve stopped on its wall-clock cap: what follows depends on the machine."""
        if timed_out:
            self.stopped_by = "time"

    @property
    def left(self) -> int:
        return max(0, self.work - self.spent)

    def share(self, fraction: float) -> Budget:
        """A child budget of `fraction` of the work left, same cap; `absorb` it when done."""
        return Budget(int(self.left * fraction), self.deadline)

    def absorb(self, child: Budget) -> None:
        self.spent += child.spent
        if child.stopped_by == "time":
            self.stopped_by = "time"

    @property
    def timed_out(self) -> bool:
        return self.stopped_by == "time"
