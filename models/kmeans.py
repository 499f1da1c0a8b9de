"""Weighted k-means++ seeding and Lloyd iterations: how initialization partitions rows.

Used by ``models.init`` on a bounded sample of rows (a few thousand), never on the whole
data, so plain numpy on one process is fast enough: each Lloyd iteration is one ``(m, K)``
distance block.
"""

from __future__ import annotations

import numpy as np

#: Lloyd iterations after the k-means++ seeding (on the sample; EM refines from there).
LLOYD_ITER = 10


def _sq_dist(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Squared distances ``(m, K)`` of rows to centres, clipped at 0 (rounding)."""
    d = (X * X).sum(axis=1)[:, None] - 2.0 * X @ C.T + (C * C).sum(axis=1)[None, :]
    return np.maximum(d, 0.0)


def kmeans_pp(X: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` centres chosen by k-means++ (Arthur and Vassilvitskii): the first with
    probability proportional to the row weight, each next one proportional to the weight
    times the squared distance to the nearest centre so far. A row already chosen has
    distance 0, so no centre repeats while the rows hold ``k`` distinct points."""
    m = X.shape[0]
    p = w / w.sum()
    first = int(rng.choice(m, p=p))
    centres = [X[first]]
    closest = _sq_dist(X, X[first][None, :])[:, 0]
    for _ in range(1, k):
        score = w * closest
        total = score.sum()
        i = int(rng.choice(m, p=score / total)) if total > 0 else int(rng.choice(m, p=p))
        centres.append(X[i])
        np.minimum(closest, _sq_dist(X, X[i][None, :])[:, 0], out=closest)
    return np.array(centres)


def kmeans_labels(X: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator,
                  n_iter: int = LLOYD_ITER) -> np.ndarray:
    """Cluster labels of the rows of ``X`` (weights ``w``): k-means++ seeding, then
    ``n_iter`` weighted Lloyd iterations. Every cluster keeps at least one row: an empty
    one takes the row farthest from its own centre."""
    C = kmeans_pp(X, w, k, rng)
    labels = np.zeros(X.shape[0], dtype=np.int64)
    for _ in range(n_iter + 1):
        D = _sq_dist(X, C)
        new = D.argmin(axis=1)
        new = _fill_empty(new, D, k)
        if np.array_equal(new, labels) and _ > 0:
            break
        labels = new
        mass = np.bincount(labels, weights=w, minlength=k)
        sums = np.zeros_like(C)
        np.add.at(sums, labels, X * w[:, None])
        keep = mass > 0
        C[keep] = sums[keep] / mass[keep, None]
    return labels


def _fill_empty(labels: np.ndarray, D: np.ndarray, k: int) -> np.ndarray:
    """Labels with no empty cluster: each empty cluster takes the row farthest from the
    centre it is assigned to, among rows whose cluster has more than one row."""
    counts = np.bincount(labels, minlength=k)
    if counts.min() > 0 or labels.size < k:
        return labels
    labels = labels.copy()
    own = D[np.arange(labels.size), labels]
    for j in np.flatnonzero(counts == 0):
        movable = counts[labels] > 1
        i = int(np.argmax(np.where(movable, own, -1.0)))
        counts[labels[i]] -= 1
        labels[i] = j
        counts[j] = 1
        own[i] = -1.0
    return labels


def random_labels(m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A random partition of ``m`` rows into ``k`` parts of near-equal size (none empty when
    ``m >= k``)."""
    labels = np.empty(m, dtype=np.int64)
    labels[rng.permutation(m)] = np.arange(m) % k
    return labels
