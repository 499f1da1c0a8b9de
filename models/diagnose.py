"""What a fitted model says about its own fit: collapsed components and variances at the floor.

``fit_warnings(model)`` lists one line per finding, each naming the node path, for the
warnings ``executors.optimize`` raises (``models.errors.ConvergenceWarning``):

- a ``Mixture`` component whose weight is below ``COLLAPSED_WEIGHT`` (it explains almost
  none of the rows reaching the mixture);
- a ``Gaussian`` or ``DiagGaussian`` variance, or a ``FullGaussian`` covariance's smallest
  eigenvalue, within ``FLOOR_MARGIN`` of ``floors.VAR_FLOOR`` (the M-step held it there: the
  component sits on too few distinct points).
"""

from __future__ import annotations

import numpy as np

from .base import Node
from .floors import VAR_FLOOR
from .gaussian import DiagGaussian, FullGaussian, Gaussian
from .mixture import Mixture

#: A mixture weight below this is reported as collapsed.
COLLAPSED_WEIGHT = 1e-3
#: A variance at most ``VAR_FLOOR * (1 + FLOOR_MARGIN)`` is reported as at the floor.
FLOOR_MARGIN = 0.01


def _where(path: str) -> str:
    return repr(path) if path else "'<root>'"


def fit_warnings(model: Node, prefix: str = "") -> list[str]:
    """One line per collapsed component or floored variance of a complete model (or of the
    subtree at path ``prefix`` of one, or of a shard's part: stubs are skipped)."""
    out = []
    at_floor = VAR_FLOOR * (1.0 + FLOOR_MARGIN)
    for path, node in model.nodes(prefix):
        if isinstance(node, Mixture) and node.weights is not None:
            for k in np.flatnonzero(node.weights < COLLAPSED_WEIGHT):
                out.append(f"Mixture at path {_where(path)}: component {int(k)} has weight {float(node.weights[k]):.3g} "
                           f"(below {COLLAPSED_WEIGHT:g}): it has collapsed")
        elif isinstance(node, (Gaussian, DiagGaussian)) and node.var is not None:
            low = float(np.min(node.var))
            if low <= at_floor:
                out.append(f"{node.family} at path {_where(path)}: a variance is at the floor ({low:.3g}, "
                           f"VAR_FLOOR={VAR_FLOOR:g}): it sits on too few distinct values")
        elif isinstance(node, FullGaussian) and node.cov is not None:
            low = float(np.linalg.eigvalsh(node.cov)[0])
            if low <= at_floor:
                out.append(f"FullGaussian at path {_where(path)}: the covariance's smallest eigenvalue is at the "
                           f"floor ({low:.3g}, VAR_FLOOR={VAR_FLOOR:g}): it sits on too few distinct points")
    return out
