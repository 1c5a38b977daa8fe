"""A live status line for long passes: what `hetcompile build` shows on a terminal while it works.

Once a pass has run PASS_QUIET_S (2 s) the line appears on stderr and is redrawn every
REDRAW_S: the pass, its elapsed time and the latest solver report (incumbent, bound, gap, from
opt/solve.py's progress callback). Ordinary log lines print above it. Only on a terminal (a
pipe or a file gets the log lines alone) and never with `--quiet`. Display only: nothing here
changes a result.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import TextIO

PASS_QUIET_S = 2.0  # a pass shorter than this never shows the line
REDRAW_S = 0.5
_CLEAR = "\r\x1b[K"


class LiveLine:
    """`pass_started(name)` when a pass begins ("" when the pipeline ends), `solver(line)` for
    the solver's progress, `log(line)` for a permanent line; `tick()` redraws (the thread calls it
    every REDRAW_S; tests call it with their own clock)."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic, thread: bool = True,
                 width: int | None = None):
        self.stream, self.clock = stream, clock
        # a line longer than the terminal wraps, and \r would then redraw only its last row
        self.width = width or shutil.get_terminal_size((100, 24)).columns - 1
        self.lock = threading.Lock()
        self.name, self.since, self.detail, self.shown = "", 0.0, "", False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True) if thread else None
        if self.thread:
            self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(REDRAW_S):
            self.tick()

    def _clear(self) -> None:
        if self.shown:
            self.stream.write(_CLEAR)
            self.shown = False

    def pass_started(self, name: str) -> None:
        with self.lock:
            self._clear()
            self.name, self.since, self.detail = name, self.clock(), ""
            self.stream.flush()

    def solver(self, line: str) -> None:
        with self.lock:
            self.detail = line

    def log(self, line: str) -> None:
        with self.lock:
            self._clear()
            self.stream.write(f"  {line}\n")
            self.stream.flush()

    def tick(self) -> None:
        with self.lock:
            if not self.name:
                return
            elapsed = self.clock() - self.since
            if elapsed < PASS_QUIET_S:
                return
            text = (f"  {self.name}: {elapsed:.0f} s" + (f" | {self.detail}" if self.detail else ""))[:self.width]
            self.stream.write(_CLEAR + text)
            self.shown = True
            self.stream.flush()

    def close(self) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join()
        with self.lock:
            self.name = ""
            self._clear()
            self.stream.flush()
