"""A live progress line on stderr for passes that run longer than about 2 s (display only).

The pass manager tells `ProgressLine` which pass runs (`start(name)`, `stop()`); solver progress
(HiGHS's incumbent, bound and gap, passes/solve.py) arrives through `update(detail)`. A daemon
thread calls `tick()` twice a second; once a pass has run SHOW_AFTER_S, the line
`  place: 12 s, compose/max-theta: 3 s, 1520 nodes, gap 2.1%` is rewritten in place (carriage
return, erase line) and erased when the pass ends. Only when the stream is a terminal: pipes, CI
logs and `--quiet` get nothing. Nothing here feeds back into a result.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, TextIO

SHOW_AFTER_S = 2.0
TICK_S = 0.5


class ProgressLine:
    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic, thread: bool = True) -> None:
        self.stream = stream
        self.clock = clock
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        self._lock = threading.Lock()
        self._pass: str | None = None
        self._since = 0.0
        self._detail = ""
        self._shown = False
        self._done = threading.Event()
        self._thread = None
        if self.enabled and thread:
            self._thread = threading.Thread(target=self._run, name="hetcompile-progress", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(TICK_S):
            self.tick()

    def start(self, name: str) -> None:
        with self._lock:
            self._pass, self._since, self._detail = name, self.clock(), ""

    def update(self, detail: str) -> None:
        with self._lock:
            self._detail = detail

    def stop(self) -> None:
        with self._lock:
            self._pass = None
            self._erase()

    def close(self) -> None:
        self.stop()
        self._done.set()

    def line(self) -> str | None:
        """The text to show now, or None (no pass, or it has run less than SHOW_AFTER_S)."""
        if self._pass is None:
            return None
        elapsed = self.clock() - self._since
        if elapsed < SHOW_AFTER_S:
            return None
        return f"  {self._pass}: {elapsed:.0f} s" + (f", {self._detail}" if self._detail else "")

    def tick(self) -> None:
        with self._lock:
            text = self.line()
            if not self.enabled or text is None:
                return
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
            self._shown = True

    def _erase(self) -> None:
        if self._shown and self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._shown = False
