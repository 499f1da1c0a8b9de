"""Hidden Markov model over variable-length sequences, vectorized across sequences.

Forward-backward runs scaled (per-position normalizers), with emission log densities
shifted by their per-position maximum before ``exp``; the loop runs over time steps, each
step a matrix operation over every sequence still active at that step (sequences are
sorted by length once per block, so the active ones are a prefix).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Internal
from .categorical import floor_probs
from .cost import NodeCost, stat_bytes
from .data import Ragged
from .floors import LOG_CLAMP, MIN_WEIGHT
from .mixture import sample_by_label
from .schema import POSITIVE, SIMPLEX, Children, Param
from .sequence import known_length, prepare_ragged
from .special import log_factorial
from .units import MATMUL_FLOPS, ROW_ACCESS_FLOPS, SCAN_FLOPS, SLOW_FLOPS

_TINY = 1e-300


class _Schedule:
    """Row order by decreasing length and, per step t, how many rows are longer than t."""

    def __init__(self, data: Ragged):
        lengths = data.lengths
        self.order = np.argsort(-lengths, kind="stable")
        sorted_len = lengths[self.order]
        self.starts = data.offsets[:-1][self.order]
        self.t_max = int(sorted_len[0]) if sorted_len.size else 0
        self.active = np.searchsorted(-sorted_len, -np.arange(self.t_max), side="left")

    def positions(self, t: int) -> np.ndarray:
        return self.starts[: self.active[t]] + t


class HMM(Internal):
    """Hidden states over a sequence; state ``k`` emits through ``emissions[k]``."""

    family = "HMM"
    schema = (Children("emissions", noun="state", same_type=True),
              Param("transitions", 2, SIMPLEX, shape=("K", "K"), axis=1),
              Param("initial", 1, SIMPLEX, shape=("K",)),
              Param("mean_length", 0, POSITIVE, free=False))
    has_own_stats = True
    shares_child_data = True
    reads_ragged = True
    repeat = ("n_states", "emission")

    def __init__(self, emissions, transitions=None, initial=None, mean_length: float | None = None):
        self._init_fields(emissions=emissions, transitions=transitions, initial=initial, mean_length=mean_length)

    @property
    def emissions(self):
        return self.children

    @property
    def n_states(self):
        return len(self.children)

    def child_rows(self, i):
        return known_length(self)

    def describe(self):
        length = "?" if self.mean_length is None else f"{float(self.mean_length):.3g}"
        return f"HMM K={self.n_states} L~{length}"

    def data_type(self):
        return f"seq<{self.children[0].data_type()}>"

    def _prepare(self, data, where):
        return prepare_ragged(data, self.children, where, self.family)

    def _child_data(self, data, i):
        return data.values

    def _combine(self, data, child_lds, shifted):
        B = np.array(child_lds, dtype=np.float64).T.copy()  # (positions, K)
        m = B.max(axis=1)
        m = np.where(np.isfinite(m), m, 0.0)
        B -= m[:, None]
        np.maximum(B, LOG_CLAMP, out=B)
        np.exp(B, out=B)
        sched = _Schedule(data)
        alpha = np.empty_like(B)
        c = np.ones(B.shape[0])
        A = self.transitions
        for t in range(sched.t_max):
            idx = sched.positions(t)
            a = (self.initial * B[idx]) if t == 0 else (alpha[idx - 1] @ A) * B[idx]
            s = np.maximum(a.sum(axis=1), _TINY)
            alpha[idx] = a / s[:, None]
            c[idx] = s
        ld = data.segment_sum(np.log(c) + m)
        return ld, (B, alpha, c, sched)

    def _distribute(self, data, w, child_lds, ld, aux):
        B, alpha, c, sched = aux
        A = self.transitions
        k = self.n_states
        beta = np.ones_like(B)
        wpos = np.repeat(w, data.lengths)
        xi = np.zeros((k, k))
        for t in range(sched.t_max - 1, 0, -1):
            idx = sched.positions(t)
            G = B[idx] * beta[idx] / c[idx][:, None]
            beta[idx - 1] = G @ A.T
            xi += alpha[idx - 1].T @ (G * wpos[idx][:, None])
        xi *= A
        gamma = alpha * beta
        gamma *= wpos[:, None]
        first = data.offsets[:-1][data.lengths > 0]
        init = gamma[first].sum(axis=0)
        W = np.ascontiguousarray(gamma.T)
        return W, (init, xi, float(w.sum()), float(w @ data.lengths))

    def _estimate(self, own, children):
        init, xi, sw, slen = own
        initial = self.initial if init.sum() < MIN_WEIGHT else floor_probs(init / init.sum())
        rows = xi.sum(axis=1, keepdims=True)
        fitted = floor_probs(xi / np.where(rows > 0, rows, 1.0), axis=1)
        transitions = np.where(rows >= MIN_WEIGHT, fitted, self.transitions)
        mean_length = self.mean_length if sw < MIN_WEIGHT or slen <= 0 else slen / sw
        return HMM(children, transitions, initial, mean_length)

    def _sample(self, n, rng):
        states, offsets = self._draw_labels(n, rng)
        return Ragged(sample_by_label(self.children, states, rng), offsets)

    def _draw_labels(self, n, rng):
        lengths = rng.poisson(float(self.mean_length), size=n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        data = Ragged(np.zeros(int(offsets[-1])), offsets)
        sched = _Schedule(data)
        states = np.empty(int(offsets[-1]), dtype=np.int64)
        cum_init = np.cumsum(self.initial)
        cum_trans = np.cumsum(self.transitions, axis=1)
        k = self.n_states
        for t in range(sched.t_max):
            idx = sched.positions(t)
            u = rng.random(idx.size)
            cum = cum_init[None, :] if t == 0 else cum_trans[states[idx - 1]]
            states[idx] = np.minimum((u[:, None] >= cum).sum(axis=1), k - 1)
        return states, offsets

    def child_data_shares(self):
        """The expected share of positions in each state: ``initial T^t`` averaged over the
        positions of Poisson(``mean_length``) sequences, as ``sample`` draws them (uniform
        while the transitions or initial probabilities are unset)."""
        if self.transitions is None or self.initial is None:
            return super().child_data_shares()
        L = known_length(self)
        k = np.arange(int(min(100_000, L + 12.0 * math.sqrt(L) + 30)))
        pmf = np.exp(k * math.log(L) - L - log_factorial(k))
        survive = np.clip(1.0 - np.cumsum(pmf), 0.0, 1.0)  # P(length > t)
        p, occupancy = np.asarray(self.initial, dtype=np.float64), np.zeros(self.n_states)
        for s in survive:
            occupancy += s * p
            p = p @ self.transitions
        total = occupancy.sum()
        return occupancy / total if total > 0 else np.full(self.n_states, 1.0 / self.n_states)

    def cost(self, length: float | None = None):
        """Per row of ``length`` positions (default: ``mean_length``; see ``models.cost.data_lengths``)."""
        k, L = self.n_states, known_length(self, length)
        # per position, forward and backward: rows of K gathered and scattered at one time
        # step's positions, elementwise and K x K work, the segment sums' running sum
        per_pos = (7 * ROW_ACCESS_FLOPS + (17 * k + 4) * SLOW_FLOPS + (6 * k + 10)
                   + 6.0 * k * k * MATMUL_FLOPS + SCAN_FLOPS)
        # per row: the length schedule, segment gathers, first positions, two sums
        per_row = (6 + k) * SLOW_FLOPS + 5
        return NodeCost(flops_per_row=per_pos * L + per_row, param_bytes=8 * (k * k + k + 1),
                        stat_bytes=stat_bytes(arrays=[k, k * k], scalars=2), data_bytes_per_row=8.0,
                        coupling_bytes_per_row=8.0 * k * L, work_bytes_per_row=(16.0 * k + 16) * L + 8,
                        scratch_bytes_per_row=(24.0 * k + 16) * L,
                        # forward and backward step through the block's longest sequence
                        # (about L + 4 sqrt(L) of Poisson lengths)
                        calls_per_block=1.0 + 0.8 * (L + 4.0 * math.sqrt(L)))
