"""Floats to CP-SAT integers, in one place, with the scale recorded.

Seconds become integer *ticks*: ``ticks_per_s`` is chosen so that a reference time (the
best plan known before the solve) is ``TARGET_TICKS``. Objective coefficients round
**down**, so the integer objective of any assignment is at most ``ticks_per_s`` times its
true time and the solver's bound, divided back, stays a valid lower bound. Bytes become
integer *byte units* (a power of two, down to 1/64 byte, as fine as memories below
``MAX_INT`` units allow); memory coefficients round **up** and limits **down**, so an
assignment the program accepts truly fits, and one that fits by more than a byte unit per
term is accepted.
Time variables are capped at an upper bound of every assignment's value (``upper_s``: all
of the model's work on one worker), so the cap never cuts off a plan; when that bound would
exceed ``MAX_TIME_TICKS`` ticks, ``ticks_per_s`` shrinks until it does not, which keeps
every integer below about 1e11 (OR-Tools has been seen to misreport optima near 1e14).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TARGET_TICKS = 1e9
MAX_TIME_TICKS = 4e10
MAX_INT = 1e11
FINEST_BYTE_UNIT = 1 / 64


@dataclass(frozen=True)
class Scale:
    ticks_per_s: float
    bytes_per_unit: float

    @classmethod
    def for_instance(cls, reference_s: float, max_memory: float, upper_s: float | None = None) -> "Scale":
        """``reference_s`` becomes ``TARGET_TICKS`` ticks unless ``upper_s`` (an upper bound
        of every time variable) would then exceed ``MAX_TIME_TICKS``."""
        ticks = TARGET_TICKS / reference_s if reference_s > 0 else TARGET_TICKS
        if upper_s is not None and upper_s * ticks > MAX_TIME_TICKS:
            ticks = MAX_TIME_TICKS / upper_s
        unit = FINEST_BYTE_UNIT
        while max_memory / unit > MAX_INT:
            unit *= 2
        return cls(ticks_per_s=ticks, bytes_per_unit=unit)

    def time_down(self, seconds: float) -> int:
        """Ticks of a time coefficient, rounded down."""
        return math.floor(seconds * self.ticks_per_s)

    def time_cap(self, upper_s: float) -> int:
        """Ticks of an upper bound of every time variable (rounded up, plus one)."""
        return math.ceil(upper_s * self.ticks_per_s) + 1

    def fitting(self, upper_s: float) -> "Scale":
        """This scale, coarsened when ``upper_s`` would exceed ``MAX_TIME_TICKS`` ticks."""
        if upper_s * self.ticks_per_s <= MAX_TIME_TICKS:
            return self
        return Scale(ticks_per_s=MAX_TIME_TICKS / upper_s, bytes_per_unit=self.bytes_per_unit)

    def seconds(self, ticks: float) -> float:
        return ticks / self.ticks_per_s

    def bytes_up(self, b: float) -> int:
        """Units of a memory coefficient, rounded up."""
        return math.ceil(b / self.bytes_per_unit)

    def bytes_limit(self, b: int) -> int:
        """Units of a memory limit, rounded down."""
        return math.floor(b / self.bytes_per_unit)

    def record(self) -> dict:
        return {"ticks_per_s": self.ticks_per_s, "bytes_per_unit": self.bytes_per_unit}
