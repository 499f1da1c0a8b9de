"""What a fitted model says about its own fit: collapsed components and variances at the floor.

``fit_warnings(model)`` lists one line per finding, each naming the node path, for the
warnings ``executors.optimize`` raises (``models.errors.ConvergenceWarning``):

- a ``Mixture`` component whose weight is below ``COLLAPSED_WEIGHT`` (it explains almost
  none of the rows reaching the mixture);
- a ``Gaussian`` or ``DiagGaussian`` variance, or a ``FullGaussian`` covariance's smallest
  eigenvalue, within ``FLOOR_MARGIN`` of ``floors.VAR_FLOOR`` (the M-step held it there).

A variance reaches the floor for one of two reasons, and given the data the line names the
one it shows. The rows the node sits on are those within ``NEAR`` of its standard
deviations of its mean (squared Mahalanobis distance at most ``NEAR**2 * dim``): when they
hold fewer than ``MANY_DISTINCT`` distinct values in some dimension (a floored one, for a
``DiagGaussian``), the component sits on too few distinct values (duplicates, a constant or
discrete feature); otherwise it spans many distinct values whose spread is tiny next to
``VAR_FLOOR``: the features are on very different scales (standardize them, or set
``reg_covar``; for a covariance, also features that are linear combinations of others).
Without the data the line names both.
"""

from __future__ import annotations

import numpy as np

from .base import Node
from .data import Data
from .engine import subtree_data
from .floors import VAR_FLOOR
from .gaussian import DiagGaussian, FullGaussian, Gaussian
from .mixture import Mixture

#: A mixture weight below this is reported as collapsed.
COLLAPSED_WEIGHT = 1e-3
#: A variance at most ``VAR_FLOOR * (1 + FLOOR_MARGIN)`` is reported as at the floor.
FLOOR_MARGIN = 0.01
#: Rows within this many of a floored node's standard deviations of its mean are the ones it sits on.
NEAR = 3.0
#: With at least this many distinct values among the rows a floored node sits on (in every
#: dimension looked at), the cause is the features' scales, not too few distinct values.
MANY_DISTINCT = 20
#: The most rows of a column read (evenly spaced) to tell the causes apart.
SAMPLE_ROWS = 100_000

_SCALES = "standardize the features, or set reg_covar"


def _where(path: str) -> str:
    return repr(path) if path else "'<root>'"


def fit_warnings(model: Node, prefix: str = "", data=None) -> list[str]:
    """One line per collapsed component or floored variance of a complete model (or of the
    subtree at path ``prefix`` of one, or of a shard's part: stubs are skipped).

    ``data``, when given, is the rows ``model`` was fitted to (anything ``model.prepare``
    takes); a floored variance's line then names the cause its rows show (module docstring)."""
    out = []
    at_floor = VAR_FLOOR * (1.0 + FLOOR_MARGIN)
    prepared = None if data is None else model.prepare(data)
    for path, node in model.nodes(prefix):
        if isinstance(node, Mixture) and node.weights is not None:
            for k in np.flatnonzero(node.weights < COLLAPSED_WEIGHT):
                out.append(f"Mixture at path {_where(path)}: component {int(k)} has weight {float(node.weights[k]):.3g} "
                           f"(below {COLLAPSED_WEIGHT:g}): it has collapsed")
            continue
        if isinstance(node, (Gaussian, DiagGaussian)) and node.var is not None:
            var = np.atleast_1d(np.asarray(node.var, dtype=np.float64))
            dims = np.flatnonzero(var <= at_floor)
            if dims.size == 0:
                continue
            where = f" in {_dims(node, dims)}" if isinstance(node, DiagGaussian) else ""
            what = (f"{node.family} at path {_where(path)}: a variance is at the floor ({float(var.min()):.3g}, "
                    f"VAR_FLOOR={VAR_FLOOR:g}){where}")
            cov = np.diag(var)
        elif isinstance(node, FullGaussian) and node.cov is not None:
            cov = np.asarray(node.cov, dtype=np.float64)
            low = float(np.linalg.eigvalsh(cov)[0])
            if low > at_floor:
                continue
            dims = np.arange(node.dim)
            what = (f"FullGaussian at path {_where(path)}: the covariance's smallest eigenvalue is at the "
                    f"floor ({low:.3g}, VAR_FLOOR={VAR_FLOOR:g})")
        else:
            continue
        if prepared is None:
            out.append(f"{what}: it sits on too few distinct values, or the features are on very different "
                       f"scales ({_SCALES})")
            continue
        column = _sample(subtree_data(model, prepared, _relative(path, prefix)))
        out.append(f"{what}: {_cause(column, np.atleast_1d(np.asarray(node.mean, dtype=np.float64)), cov, dims)}")
    return out


def _relative(path: str, prefix: str) -> str:
    """``path`` (a node under ``prefix``) relative to the node at ``prefix``."""
    if not prefix or path == prefix:
        return "" if prefix else path
    return path[len(prefix) + 1:]


def _dims(node: DiagGaussian, dims: np.ndarray) -> str:
    """``dimension 3`` or ``columns 'a', 'b'`` (a table's names when the node has them)."""
    names = node.columns if isinstance(node.columns, tuple) and len(node.columns) == node.dim else None
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
