"""Vectorized special functions numpy lacks (no SciPy at run time)."""

from __future__ import annotations

import numpy as np

_TABLE_SIZE = 1024
_LOG_FACT = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, _TABLE_SIZE, dtype=np.float64)))])


def log_factorial(x: np.ndarray) -> np.ndarray:
    """``log(x!)`` for integer ``x >= 0``: a table below 1024, Stirling's series above."""
    x = np.asarray(x, dtype=np.int64)
    small = x < _TABLE_SIZE
    if np.all(small):
        return _LOG_FACT[x]
    out = np.empty(x.shape, dtype=np.float64)
    out[small] = _LOG_FACT[x[small]]
    n = x[~small].astype(np.float64) + 1.0  # lgamma(n)
    inv = 1.0 / n
    out[~small] = (n - 0.5) * np.log(n) - n + 0.5 * np.log(2 * np.pi) + inv / 12.0 - inv**3 / 360.0 + inv**5 / 1260.0
    return out
