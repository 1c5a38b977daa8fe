"""The live status line of `hetcompile build` on a terminal (hetcompile/live.py), on a fake clock."""

from __future__ import annotations

import io

from typer.testing import CliRunner

from conftest import ROOT
from hetcompile.cli import app
from hetcompile.live import PASS_QUIET_S, LiveLine


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_short_pass_shows_nothing_and_a_long_one_shows_pass_elapsed_and_solver_state():
    out, clock = io.StringIO(), Clock()
    live = LiveLine(out, clock=clock, thread=False, width=200)
    live.pass_started("compose")
    clock.t += PASS_QUIET_S / 2
    live.tick()
    assert out.getvalue() == ""  # under 2 s: quiet
    live.pass_started("place")
    clock.t += 7.2
    live.solver("place-shared-milp: 5 s, 120 nodes, incumbent 1.5, bound 1.8, gap 20%")
    live.tick()
    shown = out.getvalue()
    assert shown.endswith("  place: 7 s | place-shared-milp: 5 s, 120 nodes, incumbent 1.5, bound 1.8, gap 20%")
    assert "\n" not in shown  # one line, redrawn in place
    live.log("place: ok in 7.2s")  # a permanent line replaces the live one, which comes back on the next tick
    assert out.getvalue().endswith("\r\x1b[K  place: ok in 7.2s\n")
    live.close()
    assert out.getvalue().endswith("\n")  # nothing left on the terminal after close


def test_a_new_pass_clears_the_previous_pass_state():
    out, clock = io.StringIO(), Clock()
    live = LiveLine(out, clock=clock, thread=False, width=200)
    live.pass_started("place")
    live.solver("milp: incumbent 1")
    clock.t += 3
    live.tick()
    live.pass_started("route")
    clock.t += 3
    live.tick()
    assert out.getvalue().endswith("\r\x1b[K  route: 3 s")
    live.close()
    assert out.getvalue().endswith("\r\x1b[K")


def test_the_line_is_cut_to_the_terminal_width():
    out, clock = io.StringIO(), Clock()
    live = LiveLine(out, clock=clock, thread=False, width=20)
    live.pass_started("place")
    live.solver("a very long solver status line that would wrap")
    clock.t += 3
    live.tick()
    assert out.getvalue() == "\r\x1b[K" + "  place: 3 s | a very long"[:20]
    live.close()


def test_build_off_a_terminal_prints_no_live_line(tmp_path):
    res = CliRunner().invoke(app, ["build", str(ROOT / "examples" / "tiny-cpu" / "spec.yaml"), "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "\x1b[K" not in res.output and "\r" not in res.output
