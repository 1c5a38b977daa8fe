"""The live progress line of long passes (issue 20, item 6): shown on a terminal after ~2 s of a
pass, with the solver's latest progress, erased when the pass ends; never on a pipe or with -q.
A fake clock drives it: no test here waits on the wall clock."""

from __future__ import annotations

import io
import subprocess
import sys

from conftest import ROOT
from hetcompile.driver import compile_spec
from hetcompile.passes.progress import SHOW_AFTER_S, ProgressLine


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_line_appears_after_the_threshold_with_solver_detail_and_is_erased() -> None:
    out, clock = Tty(), Clock()
    p = ProgressLine(out, clock=clock, thread=False)
    p.start("place")
    p.tick()
    assert out.getvalue() == ""  # a short pass shows nothing
    clock.t += SHOW_AFTER_S + 10
    p.update("compose/max-theta: 3 s, 1520 nodes, gap 2.1%")
    p.tick()
    assert out.getvalue() == "\r\x1b[K  place: 12 s, compose/max-theta: 3 s, 1520 nodes, gap 2.1%"
    p.stop()
    assert out.getvalue().endswith("\r\x1b[K")  # erased before the pass log line prints
    p.tick()
    assert out.getvalue().count("place") == 1  # nothing after the pass ended


def test_not_a_terminal_gets_nothing() -> None:
    out, clock = io.StringIO(), Clock()
    p = ProgressLine(out, clock=clock, thread=False)
    assert not p.enabled
    p.start("place")
    clock.t += 60
    p.tick()
    p.stop()
    assert out.getvalue() == ""


def test_pipeline_announces_every_pass() -> None:
    seen: list[str | None] = []

    class Recorder(ProgressLine):
        def start(self, name: str) -> None:
            seen.append(name)

        def stop(self) -> None:
            seen.append(None)

    rec = Recorder(Tty(), thread=False)
    compile_spec(ROOT / "examples/tiny-cpu/spec.yaml", progress=rec)
    names = [s for s in seen if s is not None]
    assert names[:2] == ["profile", "compose"] and "route" in names
    assert seen.count(None) == len(names)  # every start is matched by a stop


def test_build_on_a_pipe_writes_no_progress_escape() -> None:
    proc = subprocess.run([sys.executable, "-m", "hetcompile.cli", "build", "examples/tiny-cpu/spec.yaml", "-o",
                           "/tmp/hc-progress-pipe"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and "\x1b[K" not in proc.stderr
