"""A leaf's support, and the one rule for the rows outside it.

A mixture's components and an HMM's emissions read one column, prepared by the first child
whose support holds every row (``models.columns.prepare_by_any``), so a child with a
narrower support receives rows outside it: a ``Categorical`` of 2 values beside a
``Poisson`` gets counts of 7, an ``Exponential`` beside a ``Gaussian`` gets negative
values. Such a row has density 0 under that leaf and must not enter its statistics.

A family states its support once (``Leaf.support``: an :class:`Interval`, or any
:class:`Support`; None for every value of its data type) and the engine applies this rule
for every family, so no kernel sees a row outside its support:

- **upward**: the rows outside are replaced by a value inside (:meth:`Support.stand_in`)
  before the leaf's kernels run, and their log densities are then set to -inf;
- **downward**: the same stand-in rows reach the statistics with weight exactly 0.

The stand-ins keep every array's length and row order, so a kernel's sums are the same sums
(in the same order) as those of a kernel that zeroes the weights of the rows outside
itself, and a count by value adds 0 where one that drops the rows adds nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .data import Data

__all__ = ["Support", "Interval", "Rows", "outside", "leaf_rows", "siblings_rows", "leaf_log_density",
           "leaf_accumulate"]


class Support:
    """The values a leaf's density is positive on. A subclass is a frozen dataclass (equal
    supports are found once per block for a batch of sibling leaves) with two methods."""

    def outside(self, data: Data) -> np.ndarray | None:
        """A boolean mask of the rows outside, or None when every row is inside (the common
        case, to be found without building a mask: a min and a max)."""
        raise NotImplementedError

    def stand_in(self, data: Data, out: np.ndarray) -> Data:
        """``data`` with the rows ``out`` replaced by a value inside (a new array)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Interval(Support):
    """Scalar rows ``low <= x <= high`` (strict at an open end); ints for integer data (the
    stand-in then keeps the dtype)."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False

    def outside(self, x: np.ndarray) -> np.ndarray | None:
        if x.size == 0:
            return None
        bounded_low, bounded_high = self.low != -math.inf, self.high != math.inf
        low_out = bounded_low and self._below_low(x.min())
        high_out = bounded_high and self._above_high(x.max())
        if not (low_out or high_out):
            return None
        if low_out and high_out:
            return self._below_low(x) | self._above_high(x)
        return self._below_low(x) if low_out else self._above_high(x)

    def _below_low(self, x):
        return x <= self.low if self.open_low else x < self.low

    def _above_high(self, x):
        return x >= self.high if self.open_high else x > self.high

    @property
    def fill(self):
        """A value inside: a closed finite end, else the midpoint or one step in from an end."""
        low, high = self.low != -math.inf, self.high != math.inf
        if low and not self.open_low:
            return self.low
        if high and not self.open_high:
            return self.high
        if low and high:
            return (self.low + self.high) / 2
        if low:
            return self.low + 1
        return self.high - 1 if high else 0

    def stand_in(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        return np.where(out, self.fill, x)


def outside(leaf, data: Data) -> np.ndarray | None:
    """The mask of ``data``'s rows outside ``leaf``'s support, or None (all inside)."""
    support = leaf.support
    return None if support is None else support.outside(data)


@dataclass
class Rows:
    """The rows one leaf, or a batch of sibling leaves of one class, reads under the rule in
    one block: ``out`` the rows outside the (one) support, or None; ``data`` the column its
    kernels read, with stand-ins where ``out``. For a batch whose supports differ with rows
    outside one of them, ``per_leaf`` holds each leaf's own, for the leaves to run one by one."""

    data: Data
    out: np.ndarray | None = None
    per_leaf: list | None = None


def leaf_rows(leaf, data: Data) -> Rows:
    """What ``leaf``'s kernels read of ``data``."""
    return _rows(leaf.support, outside(leaf, data), data)


def _rows(support: Support | None, out: np.ndarray | None, data: Data) -> Rows:
    return Rows(data) if out is None else Rows(support.stand_in(data, out), out)


def siblings_rows(leaves, data: Data) -> Rows:
    """What a sibling batch's kernels read of ``data`` (each distinct support checked once)."""
    first = leaves[0].support
    if all(leaf.support is first for leaf in leaves[1:]):  # one support object (the common case)
        return _rows(first, None if first is None else first.outside(data), data)
    masks = {}
    for leaf in leaves:
        s = leaf.support
        if s is not None and s not in masks:
            masks[s] = s.outside(data)
    if all(m is None for m in masks.values()):
        return Rows(data)
    return Rows(data, per_leaf=[_rows(leaf.support, masks.get(leaf.support), data) for leaf in leaves])


def leaf_log_density(leaf, rows: Rows) -> np.ndarray:
    """``leaf._log_density`` under the rule: -inf at the rows outside its support."""
    ld = leaf._log_density(rows.data)
    return ld if rows.out is None else np.where(rows.out, -np.inf, ld)


def leaf_accumulate(leaf, rows: Rows, w: np.ndarray):
    """``leaf._accumulate`` under the rule: the rows outside its support weigh 0. Row
    weights arrive float64 (a float32 block's mixture gives float32 ones), so every leaf's
    statistics are float64 sums."""
    w = np.asarray(w, dtype=np.float64)
    return leaf._accumulate(rows.data, w if rows.out is None else np.where(rows.out, 0.0, w))
