"""Poisson leaf: a count ``>= 0`` per row."""

from __future__ import annotations

import math

import numpy as np

from .base import Leaf
from .columns import int_column
from .cost import NodeCost, stat_bytes
from .errors import DataError
from .floors import MIN_WEIGHT, RATE_FLOOR
from .schema import POSITIVE, Param
from .special import log_factorial
from .support import Interval
from .units import MATMUL_FLOPS, SLOW_FLOPS

#: counts ``x >= 0``
COUNTS = Interval(0)


class Poisson(Leaf):
    family = "Poisson"
    schema = (Param("rate", 0, POSITIVE),)
    support = COUNTS

    def __init__(self, rate: float | None = None):
        self._init_fields(rate=rate)

    def data_type(self):
        return "int"

    def _prepare(self, data, where):
        x = int_column(data, where, self.family)
        if x.size and x.min() < 0:
            raise DataError(f"{where}: Poisson counts must be >= 0, got {int(x.min())}")
        return x

    def _log_density(self, x):
        return x * np.log(self.rate) - self.rate - log_factorial(x)

    def _accumulate(self, x, w):
        return (float(w.sum()), float(w @ x))

    @classmethod
    def batch_log_density(cls, leaves, x, work, offsets):
        rate = np.array([p.rate for p in leaves])[:, None]
        return x[None, :] * np.log(rate) - rate - log_factorial(x)[None, :]

    @classmethod
    def batch_accumulate(cls, leaves, x, W, work):
        sw, sx = W.sum(axis=1), W @ x.astype(np.float64)
        return [(float(a), float(b)) for a, b in zip(sw, sx)]

    def _estimate(self, own, children):
        sw, sx = own
        if sw < MIN_WEIGHT:
            return self
        return Poisson(max(sx / sw, RATE_FLOOR))

    def _sample(self, n, rng):
        return rng.poisson(float(self.rate), size=n).astype(np.int64)

    def cost(self):
        # log density: 5 passes and a log-factorial table lookup; statistics: a sum, the
        # counts cast to float and one dot
        flops = 7 + SLOW_FLOPS + 2 * MATMUL_FLOPS
        return NodeCost(flops_per_row=flops, param_bytes=8, stat_bytes=stat_bytes(scalars=2),
                        data_bytes_per_row=8.0, coupling_bytes_per_row=0.0, work_bytes_per_row=8.0,
                        scratch_bytes_per_row=16.0)

    @classmethod
    def strategy(cls, st, like=None):
        """``Poisson(rate in [0.2, 10])``."""
        return st.builds(Poisson, st.floats(0.2, 10.0, allow_nan=False, allow_infinity=False))

    def oracle_log_density(self, x):
        rate = float(self.rate)
        return np.array([k * math.log(rate) - rate - math.lgamma(k + 1) if k >= 0 else -np.inf
                         for k in np.asarray(x).tolist()])

    def oracle_estimate(self, x, w):
        return {"rate": np.sum(w * x) / np.sum(w)}
