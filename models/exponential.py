"""Exponential leaf: a float ``>= 0`` per row."""

from __future__ import annotations

import numpy as np

from .base import Leaf
from .columns import float_column
from .cost import NodeCost, stat_bytes
from .errors import DataError
from .floors import MIN_WEIGHT, RATE_FLOOR
from .schema import POSITIVE, Param
from .support import Interval
from .units import MATMUL_FLOPS

#: ``x >= 0``
NON_NEGATIVE = Interval(0.0)


class Exponential(Leaf):
    family = "Exponential"
    schema = (Param("rate", 0, POSITIVE),)
    support = NON_NEGATIVE

    def __init__(self, rate: float | None = None):
        self._init_fields(rate=rate)

    def data_type(self):
        return "float"

    def _prepare(self, data, where):
        x = float_column(data, where, self.family)
        if x.size and x.min() < 0:
            raise DataError(f"{where}: Exponential data must be >= 0, got {float(x.min())}")
        return x

    def _log_density(self, x):
        return np.log(self.rate) - self.rate * x

    def _accumulate(self, x, w):
        return (float(w.sum()), float(w @ x))

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        rate = np.array([p.rate for p in leaves])[:, None]
        return np.log(rate) - rate * x[None, :]

    @classmethod
    def batch_accumulate(cls, leaves, x, W, work):
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
        # log density: 2 passes and the support check (models.support); statistics: a sum, one dot
        flops = 5 + 2 * MATMUL_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8, stat_bytes=stat_bytes(scalars=2),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=8.0)

    @classmethod
    def strategy(cls, st, like=None):
        """``Exponential(rate in [0.2, 5])``."""
        return st.builds(Exponential, st.floats(0.2, 5.0, allow_nan=False, allow_infinity=False))

    def oracle_log_density(self, x):
        rate = float(self.rate)
        return np.array([np.log(rate) - rate * v if v >= 0 else -np.inf for v in np.asarray(x, dtype=float)])

    def oracle_estimate(self, x, w):
        return {"rate": np.sum(w) / np.sum(w * x)}
