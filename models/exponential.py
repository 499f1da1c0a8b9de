"""Exponential leaf: a float ``>= 0`` per row."""

from __future__ import annotations

import numpy as np

from .base import Leaf
from .columns import float_column
from .cost import NodeCost, stat_bytes
from .errors import DataError
from .floors import MIN_WEIGHT, RATE_FLOOR
from .schema import POSITIVE, Param
from .units import MATMUL_FLOPS


def _outside_to_minus_inf(ld: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``ld`` with -inf in the columns where ``x < 0`` (the density is 0 there)."""
    if x.size and x.min() < 0:
        ld = np.where(x < 0, -np.inf, ld)
    return ld


class Exponential(Leaf):
    family = "Exponential"
    schema = (Param("rate", 0, POSITIVE),)

    def __init__(self, rate: float | None = None):
        self._init_fields(rate=rate)

    def data_type(self):
        return "float"

    def _prepare(self, data, where):
        x = float_column(data, where, self.family)
        if x.size and x.min() < 0:
            raise DataError(f"{where}: Exponential data must be >= 0, got {float(x.min())}")
        return x

    # Negative values reach these kernels only as rows of a mixture or an HMM whose other
    # components accept them (see ``models.columns.prepare_by_any``): their density is 0.
    def _log_density(self, x):
        return _outside_to_minus_inf(np.log(self.rate) - self.rate * x, x)

    def _accumulate(self, x, w):
        if x.size and x.min() < 0:
            w = np.where(x < 0, 0.0, w)
        return (float(w.sum()), float(w @ x))

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        rate = np.array([p.rate for p in leaves])[:, None]
        return _outside_to_minus_inf(np.log(rate) - rate * x[None, :], x)

    @classmethod
    def batch_accumulate(cls, leaves, x, W, work):
        if x.size and x.min() < 0:
            W = np.where(x < 0, 0.0, W)
        sw, sx = W.sum(axis=1), W @ x
        return [(float(a), float(b)) for a, b in zip(sw, sx)]

    def _estimate(self, own, children):
        sw, sx = own
        if sw < MIN_WEIGHT:
            return self
        return Exponential(1.0 / max(sx / sw, RATE_FLOOR))

    def _sample(self, n, rng):
        return rng.exponential(1.0 / float(self.rate), size=n)

    def cost(self):
        # log density: 2 passes and the support check; statistics: the check, a sum, one dot
        flops = 5 + 2 * MATMUL_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8, stat_bytes=stat_bytes(scalars=2),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0)
