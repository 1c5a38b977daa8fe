"""The typed error family of hetcompile, and source spans for user errors.

Every error a user can cause derives from `HetcompileError`; the CLI prints `str(err)` without a
traceback (unless `--debug`). Spec errors carry a `Span` so the message shows `file:line:col`, the
offending line and a caret, SkyPilot/xDSL style.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A place in a source file: 1-based line and column, plus the line's text for the caret."""

    file: str
    line: int
    col: int
    text: str = ""

    def render(self) -> str:
        head = f"{self.file}:{self.line}:{self.col}"
        if not self.text:
            return head
        caret = " " * (self.col - 1) + "^"
        return f"{head}\n    {self.text}\n    {caret}"


# Exit statuses of the CLI (docs/cli.md, "Exit status"): a script can tell a spec to fix from a spec that
# asks for the impossible, and both from a bug. deploy/migrate add their own: 2 preflight refused,
# 3 capacity gap refused.
EXIT_ERROR = 1  # anything else the user can fix: a file, an option, a profile, a failed deploy
EXIT_SPEC = 4  # the spec is malformed (the message points at its line)
EXIT_INFEASIBLE = 5  # the spec is well formed, no plan satisfies it (the message names what binds)
EXIT_INTERNAL = 6  # the solver failed, a pass broke an invariant, or an unexpected exception: a bug to report


class HetcompileError(Exception):
    """Base of every error hetcompile reports to a user."""

    kind = "error"
    exit_code = EXIT_ERROR

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        self.message = message
        self.span = span
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        parts = []
        if self.span is not None:
            parts.append(f"{self.span.file}:{self.span.line}:{self.span.col}: {self.kind}: {self.message}")
            if self.span.text:
                parts.append(f"    {self.span.text}\n    {' ' * (self.span.col - 1)}^")
        else:
            parts.append(f"{self.kind}: {self.message}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)


class SpecError(HetcompileError):
    """The spec is malformed: unknown key, bad unit, unknown GPU or model, wrong type."""

    kind = "spec error"
    exit_code = EXIT_SPEC


class InfeasibleError(HetcompileError):
    """The spec is well formed but no plan satisfies it; the message names the binding constraint."""

    kind = "infeasible"
    exit_code = EXIT_INFEASIBLE


class SolverError(HetcompileError):
    """The solver failed or gave no usable answer (not infeasibility)."""

    kind = "solver error"
    exit_code = EXIT_INTERNAL


class PassError(HetcompileError):
    """A pass broke an IR invariant: a bug in hetcompile, reported with the pass name."""

    kind = "pass error"
    exit_code = EXIT_INTERNAL


class BackendError(HetcompileError):
    """A backend could not lower the plan to artifacts."""

    kind = "backend error"


def did_you_mean(word: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """The closest candidate to `word` (case-insensitive), or None when nothing is close."""
    lowered = {c.lower(): c for c in candidates}
    hit = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[hit[0]] if hit else None
