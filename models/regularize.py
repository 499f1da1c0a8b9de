"""Regularization as pseudo-statistics: what users set where the floors of ``models.floors``
are not enough.

- ``reg_covar``: added to every fitted variance and to the diagonal of every fitted
  covariance (scikit-learn's ``reg_covar``, hmmlearn's ``min_covar``); in statistics, ``sw *
  reg_covar`` more on the diagonal of the second moments.
- ``pseudo_count``: added to every count behind a probability: a Categorical's value counts,
  a Mixture's component counts, an HMM's initial and transition counts (the MAP estimate
  under a symmetric Dirichlet prior of ``1 + pseudo_count``).

Each family adds what applies to it (``Node._regularize``); a new family's counts take
``pseudo_count`` there. Both default to 0, which leaves the statistics untouched (the
floors alone act). A node whose statistics carry less than ``floors.MIN_WEIGHT`` keeps its
parameters either way. Applied to the reduced statistics before the M-step, on the
coordinator, so every executor and grid regularizes alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import Node
from .errors import ConfigError
from .stats import Stats


@dataclass(frozen=True)
class Regularization:
    """The knobs of the M-step (see the module docstring); both >= 0."""

    reg_covar: float = 0.0
    pseudo_count: float = 0.0

    def __post_init__(self):
        for name in ("reg_covar", "pseudo_count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {v!r}")

    @property
    def active(self) -> bool:
        return self.reg_covar > 0 or self.pseudo_count > 0


def regularize(model: Node, stats: Stats, reg: Regularization | None) -> Stats:
    """``stats`` with the pseudo-statistics of ``reg`` added (the same object when inactive)."""
    if reg is None or not reg.active:
        return stats
    out = dict(stats)
    for path, node in model.nodes():
        if path in out:
            out[path] = node._regularize(out[path], reg)
    return Stats(out)
