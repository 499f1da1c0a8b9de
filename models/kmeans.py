"""Weighted k-means++ seeding and Lloyd iterations: how initialization partitions rows.

Used by ``models.init`` on a bounded sample of rows (a few thousand) and by
``models.context`` on a bounded number of an HMM's positions, never on the whole data, so
plain numpy on one process is fast enough: each Lloyd iteration is one ``(m, K)`` distance
block.
"""

from __future__ import annotations

import numpy as np

#: Lloyd iterations after the k-means++ seeding (on the sample; EM refines from there).
LLOYD_ITER = 10
#: Entries of the cluster-indicator block :func:`_cluster_sums` multiplies at a time.
_BLOCK = 1 << 20


def _sq_dist(X: np.ndarray, C: np.ndarray, xx: np.ndarray | None = None) -> np.ndarray:
    """Squared distances ``(m, K)`` of rows to centres, clipped at 0 (rounding); ``xx``: the
    rows' squared norms, when known."""
    xx = (X * X).sum(axis=1) if xx is None else xx
    d = xx[:, None] - 2.0 * X @ C.T + (C * C).sum(axis=1)[None, :]
    return np.maximum(d, 0.0)


def kmeans_pp(X: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` centres chosen by greedy k-means++ (Arthur and Vassilvitskii; scikit-learn's
    default): the first with probability proportional to the row weight; for each next one,
    ``2 + floor(log k)`` candidates drawn proportional to the weight times the squared
    distance to the nearest centre so far, the one that leaves the smallest weighted sum of
    squared distances kept. Plain k-means++ (one candidate) often takes a far outlier as a
    centre, and a cluster of a few outliers is a component fitted to too few rows. A row
    already chosen has distance 0, so no centre repeats while the rows hold ``k`` distinct
    points."""
    m = X.shape[0]
    p = w / w.sum()
    xx = (X * X).sum(axis=1)
    first = int(rng.choice(m, p=p))
    centres = [X[first]]
    closest = _sq_dist(X, X[first][None, :], xx)[:, 0]
    trials = 2 + int(np.log(k))
    for _ in range(1, k):
        score = w * closest
        total = score.sum()
        candidates = rng.choice(m, size=trials, p=score / total) if total > 0 else rng.choice(m, size=trials, p=p)
        after = np.minimum(closest[:, None], _sq_dist(X, X[candidates], xx))  # (m, trials)
        best = int(np.argmin(w @ after))
        centres.append(X[candidates[best]])
        closest = after[:, best].copy()
    return np.array(centres)


def kmeans_labels(X: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator,
                  n_iter: int = LLOYD_ITER) -> np.ndarray:
    """Cluster labels of the rows of ``X`` (weights ``w``): k-means++ seeding, then
    ``n_iter`` weighted Lloyd iterations. Every cluster keeps at least one row: an empty
    one takes the row farthest from its own centre."""
    return kmeans_fit(X, w, k, rng, n_iter)[0]


def kmeans_fit(X: np.ndarray, w: np.ndarray, k: int, rng: np.random.Generator,
               n_iter: int = LLOYD_ITER) -> tuple[np.ndarray, np.ndarray]:
    """:func:`kmeans_labels` and the centres ``(k, d)`` of its last Lloyd update."""
    C = kmeans_pp(X, w, k, rng)
    m = X.shape[0]
    xx = (X * X).sum(axis=1)
    labels = np.zeros(m, dtype=np.int64)
    for _ in range(n_iter + 1):
        D = _sq_dist(X, C, xx)
        new = D.argmin(axis=1)
        new = _fill_empty(new, D, k)
        if np.array_equal(new, labels) and _ > 0:
            break
        labels = new
        mass = np.bincount(labels, weights=w, minlength=k)
        sums = _cluster_sums(X, w, labels, k)
        keep = mass > 0
        C[keep] = sums[keep] / mass[keep, None]
    return labels, C


def _cluster_sums(X: np.ndarray, w: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """``(k, d)``: each cluster's weighted sum of its rows, as products of the rows with the
    clusters' weighted indicators, ``_BLOCK`` indicator entries at a time."""
    m = X.shape[0]
    sums = np.zeros((k, X.shape[1]))
    step = max(1, _BLOCK // k)
    for a in range(0, m, step):
        b = min(m, a + step)
        member = np.zeros((k, b - a))
        member[labels[a:b], np.arange(b - a)] = w[a:b]
        sums += member @ X[a:b]
    return sums


def nearest(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Each row's nearest centre."""
    return _sq_dist(X, C).argmin(axis=1)


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
