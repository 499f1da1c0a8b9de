"""Composite: a record whose fields are independent children."""

from __future__ import annotations

import numpy as np

from .base import Internal
from .cost import NodeCost
from .data import n_rows
from .errors import DataError
from .schema import Children


class Composite(Internal):
    """A record: data is a tuple with one column per child; the density is their product."""

    family = "Composite"
    schema = (Children("children"),)
    has_own_stats = False

    def __init__(self, children):
        self._init_fields(children=children)

    def describe(self):
        return f"Composite of {len(self.children)}"

    def data_type(self):
        return "(" + ", ".join(c.data_type() for c in self.children) + ")"

    def _prepare(self, data, where):
        if not isinstance(data, (tuple, list)):
            raise DataError(f"{where}: Composite expects a tuple of {len(self.children)} columns, got {type(data).__name__}")
        if len(data) != len(self.children):
            raise DataError(f"{where}: Composite expects {len(self.children)} fields, got {len(data)}")
        cols = tuple(c._prepare(d, f"{where}[{i}]") for i, (c, d) in enumerate(zip(self.children, data)))
        rows = [n_rows(c) for c in cols]
        if len(set(rows)) > 1:
            raise DataError(f"{where}: Composite fields must have equal row counts, got {rows}")
        return cols

    def _child_data(self, data, i):
        return data[i]

    def _combine(self, data, child_lds, shifted):
        total = np.array(child_lds[0], dtype=np.float64, copy=True)
        for ld in child_lds[1:]:
            total += ld
        return total, None

    def _distribute(self, data, w, child_lds, ld, aux):
        return [w] * len(self.children), ()

    def _estimate(self, own, children):
        return Composite(children)

    def _sample(self, n, rng):
        return tuple(c._sample(n, rng) for c in self.children)

    def cost(self):
        c = len(self.children)
        # one copy and c - 1 additions of the children's log densities
        return NodeCost(flops_per_row=float(c), param_bytes=0, stat_bytes=0, data_bytes_per_row=0.0,
                        coupling_bytes_per_row=8.0 * c, work_bytes_per_row=8.0)
