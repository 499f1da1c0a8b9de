"""The HMM's step loop over a time-major layout (``models.hmm_steps``): the layout's moves
are exact permutations, and the loop's log-likelihoods, posteriors and statistics equal
brute force over every state path, on blocks of equal lengths (the strided layout) and of
mixed lengths with empty and one-position sequences (the indexed layout)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from emgrid.models import HMM, Gaussian, Ragged
from emgrid.models import hmm as hmm_module
from emgrid.models.engine import child_weights
from emgrid.models.hmm_steps import TimeMajor


def _ragged(lengths, values):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Ragged(values[: offsets[-1]], offsets)


@pytest.mark.parametrize("lengths", [[4, 4, 4], [3, 0, 5, 1, 4, 0], [1, 1], [0, 0]])
def test_the_time_major_layout_moves_every_position_once_and_back(lengths):
    data = _ragged(lengths, np.arange(100.0))
    tm = TimeMajor(data)
    n = int(data.offsets[-1])
    cols = np.vstack([np.arange(n, dtype=float), -np.arange(n, dtype=float)])  # (K=2, positions)
    rows = tm.rows_of(cols)
    np.testing.assert_array_equal(tm.columns_of(rows), cols)
    np.testing.assert_array_equal(tm.vector_of(cols[0]), rows[:, 0])
    np.testing.assert_array_equal(tm.per_sequence(rows[:, 0]), data.segment_sum(cols[0]))
    seq_of = np.repeat(np.arange(len(lengths)), lengths)
    step_of = np.arange(n) - np.repeat(data.offsets[:-1], lengths)
    at = rows[:, 0].astype(np.int64)  # each time-major row's position in the block
    for t in range(tm.t_max):  # step t's rows: the positions of step t, longest sequences first
        block = at[tm.step_start[t]:tm.step_start[t] + tm.active[t]]
        assert (step_of[block] == t).all()
        assert list(np.asarray(lengths)[seq_of[block]]) == sorted(np.asarray(lengths)[seq_of[block]], reverse=True)
    later = at[tm.step_start[min(1, tm.t_max)]:]
    np.testing.assert_array_equal(tm.predecessors(rows)[:, 0], later - 1)
    w = np.arange(1.0, len(lengths) + 1)
    np.testing.assert_array_equal(tm.row_weights(w), w[seq_of[at]])


def _brute_force(model, x, offsets, w):
    """Per sequence ``log p(x)``; per position the posterior of each state; the weighted
    expected initial states and transitions; by enumerating every path."""
    k = model.n_states
    emit = np.exp(np.stack([c.log_density(x) for c in model.children], axis=1))
    ld, gamma = [], np.zeros((len(x), k))
    init, pair = np.zeros(k), np.zeros((k, k))
    for i in range(len(offsets) - 1):
        a, b = int(offsets[i]), int(offsets[i + 1])
        if a == b:
            ld.append(0.0)
            continue
        total, g, p2, p0 = 0.0, np.zeros((b - a, k)), np.zeros((k, k)), np.zeros(k)
        for path in itertools.product(range(k), repeat=b - a):
            p = model.initial[path[0]] * emit[a, path[0]]
            for t in range(1, b - a):
                p *= model.transitions[path[t - 1], path[t]] * emit[a + t, path[t]]
            total += p
            g[np.arange(b - a), path] += p
            p0[path[0]] += p
            for t in range(1, b - a):
                p2[path[t - 1], path[t]] += p
        ld.append(np.log(total))
        gamma[a:b] = g / total
        init += w[i] * p0 / total
        pair += w[i] * p2 / total
    return np.array(ld), gamma, init, pair


@pytest.mark.parametrize("lengths", [[5, 5, 5, 5], [3, 0, 5, 1, 4, 0, 2]], ids=["equal", "mixed"])
def test_the_step_loop_equals_brute_force(lengths, monkeypatch):
    monkeypatch.setattr(hmm_module, "_scans", lambda d, k: False)
    rng = np.random.default_rng(7)
    k = 3
    model = HMM([Gaussian(m, s) for m, s in zip([-2.0, 0.5, 3.0], [1.0, 0.7, 1.5])],
                rng.dirichlet(np.ones(k), size=k), rng.dirichlet(np.ones(k)), 3.0)
    n = sum(lengths)
    x = rng.normal(0.0, 2.5, size=n)
    data = model.prepare(_ragged(lengths, x))
    w = np.linspace(0.5, 1.5, len(lengths))
    ld, gamma, init, pair = _brute_force(model, x, data.offsets, w)
    np.testing.assert_allclose(model.log_density(data), ld, rtol=1e-12, atol=1e-12)
    W, _ = child_weights(model, data, "")
    np.testing.assert_allclose(W.T, gamma, rtol=1e-10, atol=1e-12)
    own = model.accumulate(data, w)[""]
    np.testing.assert_allclose(own[0], init, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(own[1], pair, rtol=1e-10, atol=1e-12)
    assert own[2] == pytest.approx(w.sum()) and own[3] == pytest.approx(w @ np.asarray(lengths))


def test_a_block_with_no_positions_gives_zero_log_densities_and_no_counts(monkeypatch):
    monkeypatch.setattr(hmm_module, "_scans", lambda d, k: False)
    model = HMM([Gaussian(0.0, 1.0), Gaussian(2.0, 1.0)], [[0.9, 0.1], [0.2, 0.8]], [0.5, 0.5], 3.0)
    data = model.prepare(_ragged([0, 0, 0], np.zeros(0)))
    np.testing.assert_array_equal(model.log_density(data), np.zeros(3))
    own = model.accumulate(data)[""]
    assert not own[0].any() and not own[1].any()
