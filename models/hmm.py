"""Hidden Markov model over variable-length sequences, vectorized across sequences.

Forward-backward runs scaled (per-position normalizers), with emission log densities
shifted by their per-position maximum before ``exp``. Two schedules compute the same
quantities:

- the step loop (:class:`_Schedule`) runs over time steps, each step a matrix operation over
  every sequence still active at that step (sequences are sorted by length once per block,
  so the active ones are a prefix): a block of many sequences;
- the scan (:class:`_Scan`) takes the forward (backward) direction of every position at once
  as products of the per-position matrices ``A diag(b_t)``, prefix (suffix) products within
  each sequence in ``ceil(log2 T)`` batched products (Hillis and Steele), then one
  vectorized step of the recursion for the normalizers: a block of few long sequences,
  where the loop's ``T`` steps would each cost a fixed few microseconds on rows of ``K``
  numbers (:func:`_scans`). The two agree to rounding (about 1e-15 relative).
"""

from __future__ import annotations

import math

import numpy as np

from .base import Internal
from .categorical import floor_probs
from .cost import NodeCost, stat_bytes
from .data import Ragged
from .floors import MIN_WEIGHT
from .hmm_steps import TimeMajor, backward, forward, shifted_emissions, transition_counts
from .mixture import sample_by_label
from .schema import POSITIVE, SIMPLEX, Children, Param, frozen
from .sequence import known_length, prepare_ragged
from .special import log_factorial
from .units import MATMUL_FLOPS, ROW_ACCESS_FLOPS, SCAN_FLOPS, SLOW_FLOPS

_TINY = 1e-300
#: The scan runs when ``levels * (SCAN_LEVEL_STEPS + positions * K**3 / SCAN_UNITS_PER_STEP)``
#: is below the loop's ``T`` steps (a level's fixed cost is about that of 3 loop steps, and
#: a loop step that of about 2e4 multiply-adds of batched 4x4 products, measured on 2-core
#: x86), and what it holds beyond the loop (``scan_bytes_per_position(K)``, measured with
#: tracemalloc: its matrices, their products and its index arrays) stays within
#: ``SCAN_MAX_BYTES``: that is not per row, so it must fit in the fixed bytes every worker's
#: plan keeps for a block's allocations that no row count scales
#: (``planner.costing.WORKER_BASE_BYTES``, 256 KiB), beside the others.
SCAN_LEVEL_STEPS = 3.0
SCAN_UNITS_PER_STEP = 2e4
SCAN_MAX_BYTES = 128 * 1024


def scan_bytes_per_position(k: int) -> int:
    """Bytes the scan holds per position beyond the loop's (measured: 56, 192 and 784 for
    K = 1, 2 and 4)."""
    return 48 * k * k + 16


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


class _Scan:
    """Per position, its steps since its sequence's first position (``pos``) and before its
    last (``rem``); the first positions and the others (``later``); the matrices
    ``A diag(b_t)`` (``G``); the backward directions the scan finds (``beta``)."""

    def __init__(self, data: Ragged, A: np.ndarray, B: np.ndarray):
        offsets = data.offsets
        lengths = np.diff(offsets)
        at = np.arange(int(offsets[-1]))
        self.pos = at - np.repeat(offsets[:-1], lengths)
        self.rem = np.repeat(offsets[1:], lengths) - 1 - at
        self.first = offsets[:-1][lengths > 0]
        self.later = np.flatnonzero(self.pos > 0)
        self.G = A[None, :, :] * B[:, None, :]
        self.beta: np.ndarray | None = None


def _scans(data: Ragged, k: int) -> bool:
    """Whether the block's forward-backward runs as a scan (module constants above)."""
    n = int(data.offsets[-1])
    if n == 0 or n * scan_bytes_per_position(k) > SCAN_MAX_BYTES:
        return False
    t_max = int(data.lengths.max())
    if t_max < 2:
        return False
    levels = math.ceil(math.log2(t_max))
    return levels * (SCAN_LEVEL_STEPS + n * k ** 3 / SCAN_UNITS_PER_STEP) < t_max


def _products(P: np.ndarray, reach: np.ndarray, runs: int) -> None:
    """Hillis-Steele scan in place: ``P[t]`` becomes the product of the matrices from its
    run's first position to ``t``, each level's products scaled to sum 1 (only directions
    are read). ``reach``: each position's steps since its run's first; ``runs``: when the
    matrices are that many runs of equal length end to end (one sequence's forward and
    backward runs), contiguous ranges replace the index arrays."""
    step, n = 1, P.shape[0]
    if runs:
        P = P.reshape(runs, n // runs, *P.shape[1:])
        n //= runs
    while step < n:
        if runs:
            Q = P[:, :-step] @ P[:, step:]
            Q /= np.maximum(Q.sum(axis=(2, 3)), _TINY)[:, :, None, None]
            P[:, step:] = Q
        else:
            at = np.flatnonzero(reach >= step)
            if at.size == 0:
                return
            Q = P[at - step] @ P[at]
            Q /= np.maximum(Q.sum(axis=(1, 2)), _TINY)[:, None, None]
            P[at] = Q
        step *= 2


class HMM(Internal):
    """Hidden states over a sequence; state ``k`` emits through ``emissions[k]``.

    Its free parameters (``n_parameters``) are hmmlearn's count: ``K - 1`` initial and
    ``K (K - 1)`` transition probabilities, plus every emission's own; ``mean_length`` is
    not one (lengths are given). ``bic`` counts positions, not sequences
    (``models.inference.n_observations``).
    """

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
        """The scan or the step loop (:mod:`models.hmm_steps`). ``aux`` is consumed by the one
        ``_distribute`` of its pass: the loop's backward recursion overwrites its emissions."""
        E, m = shifted_emissions(child_lds)
        if _scans(data, self.n_states):
            B = np.ascontiguousarray(E.T)
            del E
            alpha, c, scan = self._forward_scan(data, B)
            return data.segment_sum(np.log(c) + m), (B, alpha, c, scan)
        tm = TimeMajor(data)
        B = tm.rows_of(E)
        del E
        alpha, c = forward(tm, B, self.transitions, self.initial)
        per_row = np.log(c)
        per_row += tm.vector_of(m)
        return tm.per_sequence(per_row), (B, alpha, c, tm)

    def _forward_scan(self, data, B):
        """Scaled forward probabilities and normalizers of every position by the scan, and
        the direction of every backward vector (``scan.beta``), both in one scan.

        Forward: the first position's matrix is rank one (every row ``initial * b``), so
        every row of a prefix product ``F_s .. F_t`` is the direction of ``alpha_t``; one
        vectorized step of the recursion from those gives the normalizers. Backward: the
        product ``R_t .. R_e`` of the next positions' matrices (the last's all ones) has
        every column along ``beta_t``; transposed and in reverse order it is a prefix
        product too, so both run as the runs of one scan."""
        A, init = self.transitions, self.initial
        scan = _Scan(data, A, B)
        n = B.shape[0]
        P = np.empty((2 * n,) + scan.G.shape[1:])
        P[:n] = scan.G
        P[scan.first] = (init * B[scan.first])[:, None, :]
        R = P[n:][::-1]  # R[t] holds position t's backward matrix, transposed
        inner = np.flatnonzero(scan.rem > 0)
        R[inner] = scan.G[inner + 1].transpose(0, 2, 1)
        R[scan.rem == 0] = 1.0
        P /= np.maximum(P.sum(axis=(1, 2)), _TINY)[:, None, None]
        one = len(data.offsets) == 2
        _products(P, None if one else np.concatenate([scan.pos, scan.rem[::-1]]), 2 if one else 0)
        scan.beta = P[n:, 0, :][::-1]
        alpha = P[:n, 0, :] / np.maximum(P[:n, 0, :].sum(axis=1), _TINY)[:, None]
        c = np.ones(n)
        first, later = scan.first, scan.later
        a = init * B[first]
        s = np.maximum(a.sum(axis=1), _TINY)
        alpha[first], c[first] = a / s[:, None], s
        a = (alpha[later - 1] @ A) * B[later]
        s = np.maximum(a.sum(axis=1), _TINY)
        alpha[later], c[later] = a / s[:, None], s
        return alpha, c, scan

    def _backward_scan(self, B, alpha, c, scan, wpos):
        """Scaled backward probabilities from the scan's directions (:meth:`_forward_scan`),
        scaled so that each position's posterior ``alpha * beta`` sums to 1 as the
        recursion's would; and the transition statistics."""
        beta = scan.beta / np.maximum((alpha * scan.beta).sum(axis=1), _TINY)[:, None]
        later = scan.later
        G = B[later] * beta[later] / c[later][:, None]
        return beta, alpha[later - 1].T @ (G * wpos[later][:, None])

    def _distribute(self, data, w, child_lds, ld, aux):
        B, alpha, c, sched = aux
        A = self.transitions
        if isinstance(sched, _Scan):
            wpos = np.repeat(w, data.lengths)
            beta, xi = self._backward_scan(B, alpha, c, sched, wpos)
            xi *= A
            gamma = alpha * beta
            gamma *= wpos[:, None]
            first = data.offsets[:-1][data.lengths > 0]
            init = gamma[first].sum(axis=0)
            W = np.ascontiguousarray(gamma.T)
        else:
            beta = backward(sched, B, c, A)
            row_w = sched.row_weights(w)
            xi = transition_counts(sched, alpha, B, row_w)
            xi *= A
            del B
            gamma = np.multiply(beta, alpha, out=beta)
            gamma *= row_w[:, None]
            init = gamma[: sched.active[0]].sum(axis=0) if sched.t_max else np.zeros(self.n_states)
            W = sched.columns_of(gamma)
        return W, (init, xi, float(w.sum()), float(w @ data.lengths))

    def _estimate(self, own, children):
        init, xi, sw, slen = own
        initial = self.initial if init.sum() < MIN_WEIGHT else floor_probs(init / init.sum())
        rows = xi.sum(axis=1, keepdims=True)
        fitted = floor_probs(xi / np.where(rows > 0, rows, 1.0), axis=1)
        transitions = np.where(rows >= MIN_WEIGHT, fitted, self.transitions)
        mean_length = self.mean_length if sw < MIN_WEIGHT or slen <= 0 else np.array(slen / sw)
        return HMM._fitted(children, frozen(transitions), initial, frozen(mean_length))

    def _regularize(self, own, reg):
        """``pseudo_count`` more of every initial state and of every transition out of a state
        that some position left (the MAP under a symmetric Dirichlet prior)."""
        a = reg.pseudo_count
        if a <= 0:
            return own
        init, xi, sw, slen = own
        init = init + a if init.sum() >= MIN_WEIGHT else init
        rows = xi.sum(axis=1, keepdims=True)
        xi = np.where(rows >= MIN_WEIGHT, xi + a, xi)
        return (init, xi, sw, slen)

    @classmethod
    def _fitted(cls, children, transitions: np.ndarray, initial: np.ndarray, mean_length: np.ndarray) -> "HMM":
        """``HMM(children, transitions, initial, mean_length)`` for an M-step's result, without
        the checks its making settles (a fixed cost that is most of a small fit's M-step):
        ``children`` are the new versions of the old ones (their count and class), the
        probabilities come from ``floor_probs`` or the previous model, every array is frozen
        float64 (0-d for ``mean_length``). The attributes in the order ``Node._init_fields``
        sets them."""
        node = cls.__new__(cls)
        node.children, node.transitions, node.initial, node.mean_length = (tuple(children), transitions, initial,
                                                                           mean_length)
        node._sizes, node._unset = {}, ()
        return node

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
