"""One progress line per EM iteration: redrawn in place on a terminal, plain lines otherwise.

The seconds per iteration are those of the EM loop alone: the mean of the iterations'
wall times as the executor measured them (``FitResult.timings[i]["total"]``). Everything
before the first iteration (starting workers, loading rows, initializing a template) is
start-up, reported once apart.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, max_iter: int, *, quiet: bool = False, stream=None):
        self.max_iter = max_iter
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last_ll = None
        self.t0 = time.perf_counter()
        self.width = 24
        self.startup_s: float | None = None
        self.loop_s = 0.0  # seconds of the iterations seen so far
        self.seen = 0

    def update(self, iteration: int, loglik: float, iteration_s: float | None = None) -> None:
        """Iteration ``iteration`` ended with ``loglik``; ``iteration_s``: its wall time as the
        executor measured it (without it, the time since the last update)."""
        now = time.perf_counter()
        since = now - self.t0 if self.startup_s is None else now - self._last
        own = since if iteration_s is None else min(iteration_s, since)
        if self.startup_s is None:
            self.startup_s = since - own
        self._last = now
        self.loop_s += own
        self.seen += 1
        per_iter = self.loop_s / self.seen
        delta = "" if self.last_ll is None else f"  change {loglik - self.last_ll:+.4g}"
        self.last_ll = loglik
        if self.quiet:
            return
        line = f"iter {iteration}/{self.max_iter}  loglik {loglik:.6g}{delta}  {per_iter:.3g} s/iter"
        if self.tty:
            filled = int(self.width * min(iteration / self.max_iter, 1.0))
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] {line}  (start-up {self.startup_s:.2f} s) ")
        else:
            if self.seen == 1:
                self.stream.write(f"start-up {self.startup_s:.2f} s (workers, rows, initialization)\n")
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        """One line between the iterations' (a re-plan), on a line of its own: said even
        when the progress is quiet, as a warning is."""
        self.stream.write(("\n" if self.tty and self.seen and not self.quiet else "") + line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet and self.seen:
            self.stream.write("\n")
            self.stream.flush()
