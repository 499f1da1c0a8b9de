"""One progress line per EM iteration: redrawn in place on a terminal, plain lines otherwise."""

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

    def update(self, iteration: int, loglik: float) -> None:
        now = time.perf_counter()
        per_iter = (now - self.t0) / max(iteration, 1)
        delta = "" if self.last_ll is None else f"  change {loglik - self.last_ll:+.4g}"
        self.last_ll = loglik
        if self.quiet:
            return
        if self.tty:
            filled = int(self.width * min(iteration / self.max_iter, 1.0))
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(f"\r[{bar}] iter {iteration}/{self.max_iter}  loglik {loglik:.6g}{delta}  {per_iter:.3f} s/iter ")
        else:
            self.stream.write(f"iter {iteration}/{self.max_iter}  loglik {loglik:.6g}{delta}  {per_iter:.3f} s/iter\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()
