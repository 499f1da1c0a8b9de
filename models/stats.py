"""Additive sufficient statistics.

A :class:`Stats` maps a node path (dotted child indices, ``""`` for the root) to that node's
own statistics: a tuple of floats and numpy arrays. Statistics of disjoint row sets add
(``a + b``) key by key, and statistics from different model shards add by union, so one
sum serves both the reduce across data replicas and the merge across model shards.
:class:`StatsAccumulator` is that sum, folded in place; ``Stats.__add__``, the E-step over
row blocks and the executors' reduce all use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np

OwnStats = tuple


class Stats(Mapping[str, OwnStats]):
    """Per-node statistics keyed by path; immutable, additive, small to pickle."""

    __slots__ = ("_d",)

    def __init__(self, entries: Mapping[str, OwnStats] | None = None):
        self._d: dict[str, OwnStats] = dict(entries or {})

    def __getitem__(self, path: str) -> OwnStats:
        return self._d[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"Stats({sorted(self._d)})"

    def __add__(self, other: "Stats") -> "Stats":
        if not isinstance(other, Stats):
            return NotImplemented
        acc = StatsAccumulator()
        acc.add(self)
        acc.add(other)
        return acc.result()

    def __radd__(self, other):
        if other == 0:  # lets sum() start from 0
            return self
        return NotImplemented

    def __getstate__(self):
        return self._d

    def __setstate__(self, state):
        self._d = state

    @property
    def nbytes(self) -> int:
        """Bytes held by the numbers (arrays' nbytes, 8 per scalar)."""
        return sum(
            (v.nbytes if isinstance(v, np.ndarray) else 8) for own in self._d.values() for v in own
        )

    def allclose(self, other: "Stats", rtol: float = 1e-9, atol: float = 1e-12) -> bool:
        """Whether both hold the same paths with numerically equal statistics."""
        if set(self._d) != set(other._d):
            return False
        for key, mine in self._d.items():
            theirs = other._d[key]
            if len(mine) != len(theirs):
                return False
            for a, b in zip(mine, theirs):
                if not np.allclose(a, b, rtol=rtol, atol=atol):
                    return False
        return True

    def first_nonfinite(self) -> str | None:
        """The path of the first node whose statistics hold a NaN or inf, else None."""
        for key in sorted(self._d):
            for v in self._d[key]:
                if isinstance(v, np.ndarray):
                    if not np.isfinite(v).all():
                        return key
                elif not math.isfinite(float(v)):
                    return key
        return None


class StatsAccumulator:
    """A running sum of per-node statistics, ``total += part`` key by key.

    ``add`` takes any mapping of path to own statistics (a ``Stats`` or one block's dict).
    The sums and their order are those of ``a + b + c ...``: a path's first part is kept as
    given, its second makes new arrays (``a + b``), and later parts are added into those in
    place (float arrays of one shape; anything else by ``+``), so no part passed in is ever
    written to and no array is allocated per addition. Paths present in only some parts are
    kept as they come (statistics of different model shards add by union).
    """

    __slots__ = ("_total", "_mine")

    def __init__(self):
        self._total: dict[str, object] = {}
        self._mine: set[str] = set()  # paths whose arrays this accumulator allocated

    def add(self, part: Mapping[str, OwnStats]) -> None:
        total, mine_paths = self._total, self._mine
        for key, own in part.items():
            mine = total.get(key)
            if mine is None:
                total[key] = own
            elif key not in mine_paths:
                total[key] = [m + v for m, v in zip(mine, own)]
                mine_paths.add(key)
            else:
                for i, v in enumerate(own):
                    m = mine[i]
                    if type(m) is np.ndarray and m.dtype.kind == "f" and m.shape == getattr(v, "shape", None):
                        m += v
                    else:
                        mine[i] = m + v

    def __bool__(self) -> bool:
        return bool(self._total)

    def result(self) -> Stats:
        """The sum so far; later ``add`` calls do not write into it."""
        self._mine.clear()
        return Stats({k: tuple(v) for k, v in self._total.items()})
