"""The fit warning of a variance held at ``floors.VAR_FLOOR``, and the cause its rows show
(the Gaussian families' ``_fit_warnings``; ``models.diagnose`` gathers every node's).

A variance reaches the floor for one of two reasons, and given the rows the line names the
one they show. The rows the node sits on are those within ``NEAR`` of its standard
deviations of its mean (squared Mahalanobis distance at most ``NEAR**2 * dim``): when they
hold fewer than ``MANY_DISTINCT`` distinct values in some dimension (a floored one, for a
``DiagGaussian``), the component sits on too few distinct values (duplicates, a constant or
discrete feature); otherwise it spans many distinct values whose spread is tiny next to
``VAR_FLOOR``: the features are on very different scales (standardize them, or set
``reg_covar``; for a covariance, also features that are linear combinations of others).
Without the rows the line names both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .data import Data
from .floors import VAR_FLOOR

#: A variance at most ``VAR_FLOOR * (1 + FLOOR_MARGIN)`` is reported as at the floor.
FLOOR_MARGIN = 0.01
AT_FLOOR = VAR_FLOOR * (1.0 + FLOOR_MARGIN)
#: Rows within this many of a floored node's standard deviations of its mean are the ones it sits on.
NEAR = 3.0
#: With at least this many distinct values among the rows a floored node sits on (in every
#: dimension looked at), the cause is the features' scales, not too few distinct values.
MANY_DISTINCT = 20
#: The most rows of a column read (evenly spaced) to tell the causes apart.
SAMPLE_ROWS = 100_000

_SCALES = "standardize the features, or set reg_covar"


def floor_line(what: str, rows: Callable[[], Data] | None, mean, cov: np.ndarray, dims: np.ndarray) -> str:
    """``what`` (the node and its floored variance) with the cause: the one its ``rows()``
    show (the prepared rows it was fitted to), or both without them. ``cov`` is the node's
    covariance (a diagonal one for a variance), ``dims`` the dimensions at the floor."""
    if rows is None:
        return (f"{what}: it sits on too few distinct values, or the features are on very different "
                f"scales ({_SCALES})")
    return f"{what}: {_cause(_sample(rows()), np.atleast_1d(np.asarray(mean, dtype=np.float64)), cov, dims)}"


def dims_named(columns, dim: int, dims: np.ndarray) -> str:
    """``dimension 3`` or ``columns 'a', 'b'`` (a table's names when the node has them)."""
    names = columns if isinstance(columns, tuple) and len(columns) == dim else None
    shown = ", ".join(repr(names[j]) if names else str(int(j)) for j in dims[:5])
    more = f" and {dims.size - 5} more" if dims.size > 5 else ""
    noun = ("column" if names else "dimension") + ("s" if dims.size > 1 else "")
    return f"{noun} {shown}{more}"


def _sample(column: Data) -> np.ndarray:
    """At most ``SAMPLE_ROWS`` evenly spaced rows of a float column, as ``(rows, dim)``."""
    x = np.asarray(column, dtype=np.float64)
    x = x.reshape(x.shape[0], -1)
    return x[:: max(1, x.shape[0] // SAMPLE_ROWS)]


def _cause(x: np.ndarray, mean: np.ndarray, cov: np.ndarray, dims: np.ndarray) -> str:
    """Which cause the rows ``x`` show for a node of ``mean`` and ``cov`` floored in ``dims``."""
    z = np.linalg.solve(np.linalg.cholesky(cov), (x - mean).T)
    near = x[np.einsum("ij,ij->j", z, z) <= NEAR * NEAR * mean.size]
    distinct = min(len(np.unique(near[:, j])) for j in dims)
    if distinct < MANY_DISTINCT:
        return f"it sits on too few distinct values ({distinct} near its mean)"
    spread = float(np.std(x[:, dims], axis=0).min())
    linear = " or some are linear combinations of others" if np.count_nonzero(cov - np.diag(np.diag(cov))) else ""
    return (f"its rows hold {distinct} distinct values near its mean, in a column whose standard deviation is "
            f"{spread:.3g} (sqrt(VAR_FLOOR) = {VAR_FLOOR ** 0.5:g}): the features are probably on very different "
            f"scales{linear} ({_SCALES})")
