"""What a fitted model answers: the public questions a node takes after the fit.

:class:`Answering` is a base of ``models.base.Node``; every method delegates to
``models.inference``, which runs the E-step's passes block by block. Shapes: one entry per
row the children of the node at ``at`` read, in a ``Ragged`` per sequence on the way.
"""

from __future__ import annotations

import numpy as np

from . import inference
from .data import Data


class Answering:
    """The answers side of a node: log-likelihoods, posteriors, decoding, criteria."""

    def score_samples(self, data) -> np.ndarray:
        """Log-likelihood of every row, ``(n,)``."""
        return inference.score_samples(self, data)

    def predict_proba(self, data, at: str = "") -> Data:
        """The row weights the Mixture or HMM at ``at`` hands its children, ``(rows, K)``."""
        return inference.predict_proba(self, data, at)

    def predict(self, data, at: str = "") -> Data:
        """The most probable child of the Mixture or HMM at ``at`` per row (int64)."""
        return inference.predict(self, data, at)

    def posterior_states(self, data, at: str = "") -> Data:
        """The HMM at ``at``: state probabilities per position, a ``Ragged`` of ``(positions, K)``."""
        return inference.posterior_states(self, data, at)

    def viterbi(self, data, at: str = "") -> Data:
        """The HMM at ``at``: the most probable state path per sequence, a ``Ragged`` of int64."""
        return inference.viterbi(self, data, at)

    def n_observations(self, data) -> int:
        """The ``n`` of ``bic``: positions when the rows are sequences (the innermost level,
        as hmmlearn counts), else rows (``models.inference.n_observations``)."""
        return inference.n_observations(self, data)

    def bic(self, data) -> float:
        """Bayesian information criterion, ``-2 log L + n_parameters() log n_observations(data)``
        (lower is better; hmmlearn's and scikit-learn's definition)."""
        return inference.bic(self, data)

    def aic(self, data) -> float:
        """Akaike information criterion, ``-2 log L + 2 n_parameters()`` (lower is better)."""
        return inference.aic(self, data)

    def _draw_labels(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        """A node that chooses among its children (``shares_child_data``): the child that
        generates each row its children read, and the offsets of the sequences when those
        rows are positions (else None); what its ``_sample`` draws first."""
        raise NotImplementedError
