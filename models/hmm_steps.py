"""The HMM's step loop: scaled forward-backward over time steps, each step one matrix
operation over every sequence of the block still running at that step.

The block's positions are laid out *time-major* (:class:`TimeMajor`): sequences sorted by
decreasing length, then step ``t``'s positions are the contiguous rows
``[step_start[t], step_start[t] + active[t])``, and the same sequences' previous positions
are the first ``active[t]`` rows of step ``t - 1``. Every step of the loop thus reads and
writes contiguous slices (no index arrays), and the transition statistics are one matrix
product over the whole block after the backward loop instead of one per step. When every
sequence has the same length (the common block) the layout is a transposition of the
``(sequences, steps)`` positions, made by strided copies; otherwise by index arrays.

Emission densities arrive as ``(K, positions)`` log densities; each position's are shifted
by their maximum before ``exp`` (the shift goes back into the log-likelihood), so each
step's normalizer stays away from underflow.
"""

from __future__ import annotations

import numpy as np

from .data import Ragged
from .floors import LOG_CLAMP
from .kernels import raise_to

_TINY = 1e-300


class TimeMajor:
    """The time-major order of a block's positions (see the module docstring).

    ``order``: the sequences by decreasing length (stable); ``active[t]``: how many are
    longer than ``t``; ``step_start[t]``: step ``t``'s first row. ``uniform``: every
    sequence has ``t_max`` positions, and row ``t * n + j`` is sequence ``j``'s step ``t``.
    Otherwise ``perm[r]`` is row ``r``'s position in the block and ``seq[r]`` its sequence's
    rank in ``order``."""

    def __init__(self, data: Ragged):
        lengths = data.lengths
        self.n_seq = lengths.size
        self.n = int(data.offsets[-1])
        self.t_max = int(lengths.max()) if lengths.size else 0
        self.uniform = self.n > 0 and int(lengths.min()) == self.t_max
        if self.uniform:
            self.order = np.arange(self.n_seq)
            self.active = np.full(self.t_max, self.n_seq, dtype=np.int64)
        else:
            self.order = np.argsort(-lengths, kind="stable")
            self.active = np.searchsorted(-lengths[self.order], -np.arange(self.t_max), side="left")
        self.step_start = np.concatenate([[0], np.cumsum(self.active)]).astype(np.int64)
        if not self.uniform:
            self.seq = np.arange(self.n) - np.repeat(self.step_start[:-1], self.active)
            steps = np.repeat(np.arange(self.t_max), self.active)
            self.perm = data.offsets[:-1][self.order][self.seq] + steps

    def rows_of(self, per_position: np.ndarray) -> np.ndarray:
        """``(K, positions)`` in block order -> ``(positions, K)`` in time-major order."""
        k = per_position.shape[0]
        if self.uniform:
            return np.ascontiguousarray(per_position.reshape(k, self.n_seq, self.t_max).transpose(2, 1, 0)).reshape(
                self.n, k)
        return per_position.T[self.perm]

    def vector_of(self, per_position: np.ndarray) -> np.ndarray:
        """One number per position, block order -> time-major order."""
        if self.uniform:
            return per_position.reshape(self.n_seq, self.t_max).T.ravel()
        return per_position[self.perm]

    def columns_of(self, rows: np.ndarray) -> np.ndarray:
        """``(positions, K)`` in time-major order -> contiguous ``(K, positions)`` in block order."""
        k = rows.shape[1]
        if self.uniform:
            return np.ascontiguousarray(rows.reshape(self.t_max, self.n_seq, k).transpose(2, 1, 0)).reshape(k, self.n)
        out = np.empty((k, self.n))
        out[:, self.perm] = rows.T
        return out

    def per_sequence(self, per_row: np.ndarray) -> np.ndarray:
        """Sums of a time-major per-position vector within each sequence, in block order."""
        if self.uniform:
            return per_row.reshape(self.t_max, self.n_seq).sum(axis=0)
        out = np.empty(self.n_seq)
        out[self.order] = np.bincount(self.seq, weights=per_row, minlength=self.n_seq)
        return out

    def row_weights(self, w: np.ndarray) -> np.ndarray:
        """Each time-major row's sequence weight."""
        if self.uniform:
            return np.tile(w, self.t_max)
        return w[self.order][self.seq]

    def predecessors(self, rows: np.ndarray) -> np.ndarray:
        """The rows of every position's previous step, for the positions from step 1 on."""
        if self.uniform:
            return rows[: self.n - self.n_seq]
        later = np.arange(self.step_start[min(1, self.t_max)], self.n)
        return rows[later - np.repeat(self.active[:-1], self.active[1:])]


def shifted_emissions(child_lds) -> tuple[np.ndarray, np.ndarray]:
    """``exp(log b - m)`` as ``(K, positions)`` and ``m``, each position's largest log density
    (0 where none is finite), with the exponent clamped at ``LOG_CLAMP``."""
    lds = np.asarray(child_lds, dtype=np.float64)
    m = lds.max(axis=0)
    m[~np.isfinite(m)] = 0.0
    B = raise_to(np.subtract(lds, m), LOG_CLAMP)
    np.exp(B, out=B)
    return B, m


def forward(tm: TimeMajor, B: np.ndarray, A: np.ndarray, initial: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scaled forward probabilities ``alpha`` (rows summing to 1) and normalizers ``c`` of the
    time-major emissions ``B`` (``(positions, K)``)."""
    n, k = B.shape
    alpha = np.empty_like(B)
    c = np.empty(n)
    ones = np.ones(k)
    starts, active = tm.step_start, tm.active
    for t in range(tm.t_max):
        lo, hi = starts[t], starts[t] + active[t]
        cur, s = alpha[lo:hi], c[lo:hi]
        if t == 0:
            np.multiply(B[lo:hi], initial, out=cur)
        else:
            np.matmul(alpha[starts[t - 1]:starts[t - 1] + active[t]], A, out=cur)
            np.multiply(cur, B[lo:hi], out=cur)
        np.matmul(cur, ones, out=s)
        np.maximum(s, _TINY, out=s)
        np.divide(cur, s[:, None], out=cur)
    return alpha, c


def backward(tm: TimeMajor, B: np.ndarray, c: np.ndarray, A: np.ndarray) -> np.ndarray:
    """Scaled backward probabilities (so that ``alpha * beta`` sums to 1 per position).

    ``B`` is overwritten: from step 1 on, its rows become ``b_t beta_t / c_t``, the factor of
    the transition statistics (:func:`transition_counts`)."""
    beta = np.empty_like(B)
    if tm.t_max == 0:
        return beta
    starts, active = tm.step_start, tm.active
    np.divide(B, c[:, None], out=B)
    last = tm.t_max - 1
    beta[starts[last]:starts[last] + active[last]] = 1.0
    At = A.T
    for t in range(last, 0, -1):
        lo, hi = starts[t], starts[t] + active[t]
        G = B[lo:hi]
        np.multiply(G, beta[lo:hi], out=G)
        prev = starts[t - 1]
        np.matmul(G, At, out=beta[prev:prev + active[t]])
        if active[t - 1] > active[t]:  # sequences whose last position is at step t - 1
            beta[prev + active[t]:prev + active[t - 1]] = 1.0
    return beta


def transition_counts(tm: TimeMajor, alpha: np.ndarray, G: np.ndarray, row_w: np.ndarray) -> np.ndarray:
    """``sum_t w alpha_{t-1}^T (b_t beta_t / c_t)`` over every position from step 1 on, as
    one product (times ``A`` elementwise: the expected transitions); ``G`` (:func:`backward`'s
    ``B``) is scaled by the weights in place."""
    later = slice(int(tm.step_start[min(1, tm.t_max)]), tm.n)
    Gl = G[later]
    np.multiply(Gl, row_w[later, None], out=Gl)
    return tm.predecessors(alpha).T @ Gl
