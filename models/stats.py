"""Additive sufficient statistics.

A :class:`Stats` maps a node path (dotted child indices, ``""`` for the root) to that node's
own statistics: a tuple of floats and numpy arrays. Statistics of disjoint row sets add
(``a + b``) key by key, and statistics from different model shards add by union, so one
``+`` serves both the reduce across data replicas and the merge across model shards.
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
        out = dict(self._d)
        for key, value in other._d.items():
            mine = out.get(key)
            out[key] = value if mine is None else tuple(a + b for a, b in zip(mine, value))
        return Stats(out)

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
                    if not np.all(np.isfinite(v)):
                        return key
                elif not math.isfinite(float(v)):
                    return key
        return None
