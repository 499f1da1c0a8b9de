"""Where an HMM's states start when its emissions read few distinct integers: k-means of the
positions' contexts.

A position is described by the values around it in its sequence, ``CONTEXT_WIDTH`` before
and after it and its own: one indicator per offset and distinct value (all zero past either
end of the sequence). Positions that occur in like contexts fall in one cluster, and
context is what tells an HMM's states apart: clusters of the values alone (or a random
partition) give states that differ in their histograms only, and EM then spends tens of
iterations finding the order in which they follow each other.
"""

from __future__ import annotations

import numpy as np

from .kmeans import kmeans_fit, nearest

__all__ = ["CONTEXT_WIDTH", "MAX_VALUES", "context_labels"]

#: Positions on each side of a position that describe it.
CONTEXT_WIDTH = 3
#: Distinct values at most (the indicators' width per offset); beyond, no context labels.
MAX_VALUES = 64
#: Floats of the indicator matrix the Lloyd iterations see (a subsample of the positions
#: beyond it; every position is then labelled by its nearest centre, in chunks).
FIT_FLOATS = 1 << 22
_CHUNK = 4096


def context_labels(values: np.ndarray, offsets: np.ndarray, w: np.ndarray, k: int,
                   rng: np.random.Generator) -> np.ndarray | None:
    """Cluster labels of the positions ``values`` (sequences cut at ``offsets``, position
    weights ``w``): k-means++ and Lloyd iterations on their contexts. None when the values
    are not integers or more than ``MAX_VALUES`` distinct ones."""
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iub":
        return None
    distinct, code = np.unique(values, return_inverse=True)
    if distinct.size > MAX_VALUES:
        return None
    code = code.reshape(-1)
    seq = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    n, width = code.size, (2 * CONTEXT_WIDTH + 1) * distinct.size
    m = max(k, FIT_FLOATS // width)
    if n <= m:
        return kmeans_fit(_indicators(code, seq, distinct.size, np.arange(n)), w, k, rng)[0]
    fit = np.sort(rng.choice(n, size=m, replace=False))
    _, centres = kmeans_fit(_indicators(code, seq, distinct.size, fit), w[fit], k, rng)
    labels = np.empty(n, dtype=np.int64)
    for a in range(0, n, _CHUNK):
        at = np.arange(a, min(n, a + _CHUNK))
        labels[at] = nearest(_indicators(code, seq, distinct.size, at), centres)
    return labels


def _indicators(code: np.ndarray, seq: np.ndarray, v: int, at: np.ndarray) -> np.ndarray:
    """Rows ``at``: per offset ``-CONTEXT_WIDTH..CONTEXT_WIDTH``, the indicator of the value
    there (``v`` columns), zero where the offset leaves the position's sequence."""
    X = np.zeros((at.size, (2 * CONTEXT_WIDTH + 1) * v))
    for j, d in enumerate(range(-CONTEXT_WIDTH, CONTEXT_WIDTH + 1)):
        there = at + d
        ok = (there >= 0) & (there < code.size)
        ok[ok] = seq[there[ok]] == seq[at[ok]]
        X[np.flatnonzero(ok), j * v + code[there[ok]]] = 1.0
    return X
