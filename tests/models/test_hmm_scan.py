"""The HMM's two forward-backward schedules (the step loop and the scan over time) give the
same log-likelihoods, posteriors and transition statistics, and both equal brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from emgrid.models import HMM, Categorical, Gaussian, Poisson, Ragged
from emgrid.models import hmm as hmm_module


def _model(k, rng, emission="poisson"):
    A = rng.dirichlet(np.ones(k), size=k)
    init = rng.dirichlet(np.ones(k))
    if emission == "poisson":
        kids = [Poisson(r) for r in rng.uniform(1, 20, size=k)]
    elif emission == "gauss":
        kids = [Gaussian(m, 1.0) for m in rng.normal(0, 3, size=k)]
    else:
        kids = [Categorical(rng.dirichlet(np.ones(5))) for _ in range(k)]
    return HMM(kids, A, init, mean_length=10.0)


def _data(model, lengths, rng):
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    child = model.children[0]
    values = np.concatenate([c.sample(int(offsets[-1]), rng) for c in model.children[:1]])
    if isinstance(child, Poisson):
        values = rng.poisson(8.0, size=int(offsets[-1])).astype(np.int64)
    return model.prepare(Ragged(values, offsets))


def _passes(model, data, monkeypatch, scan):
    monkeypatch.setattr(hmm_module, "_scans", lambda d, k: scan)
    ld = model.log_density(data)
    stats = model.accumulate(data, np.linspace(0.5, 1.5, len(data)))
    return ld, stats


def _flat(stats):
    """Every number of a ``Stats`` mapping (path -> tuple of arrays and floats), in path order."""
    return np.concatenate([np.ravel(np.asarray(a, dtype=float)) for path in sorted(stats) for a in stats[path]])


@pytest.mark.parametrize("k,lengths,emission", [
    (4, [107], "poisson"), (2, [300, 1, 0, 57], "poisson"), (3, [40, 40, 39], "gauss"),
    (5, [1], "cat"), (3, [0, 12, 0], "cat"),
])
def test_the_scan_and_the_loop_agree(k, lengths, emission, monkeypatch):
    rng = np.random.default_rng(k * 100 + len(lengths))
    model = _model(k, rng, emission)
    data = _data(model, lengths, rng)
    ld_loop, st_loop = _passes(model, data, monkeypatch, False)
    ld_scan, st_scan = _passes(model, data, monkeypatch, True)
    np.testing.assert_allclose(ld_scan, ld_loop, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_flat(st_scan), _flat(st_loop), rtol=1e-10, atol=1e-12)


def test_the_scan_equals_brute_force_on_a_short_sequence(monkeypatch):
    rng = np.random.default_rng(3)
    k, T = 3, 6
    model = _model(k, rng, "poisson")
    x = rng.poisson(8.0, size=T).astype(np.int64)
    data = model.prepare(Ragged(x, np.array([0, T])))
    emit = np.array([[np.exp(c.log_density(np.array([v]))[0]) for c in model.children] for v in x])
    total, pair = 0.0, np.zeros((k, k))
    for path in itertools.product(range(k), repeat=T):
        p = model.initial[path[0]] * emit[0, path[0]]
        for t in range(1, T):
            p *= model.transitions[path[t - 1], path[t]] * emit[t, path[t]]
        total += p
        for t in range(1, T):
            pair[path[t - 1], path[t]] += p
    ld, stats = _passes(model, data, monkeypatch, True)
    np.testing.assert_allclose(ld[0], np.log(total), rtol=1e-12)
    fitted = model.estimate(stats)
    np.testing.assert_allclose(fitted.transitions, pair / pair.sum(axis=1, keepdims=True), rtol=1e-9)


def test_a_block_of_few_long_sequences_scans_and_one_of_many_short_ones_loops():
    one = Ragged(np.zeros(107), np.array([0, 107]))
    many = Ragged(np.zeros(360 * 64), np.arange(0, 360 * 64 + 1, 64))
    assert hmm_module._scans(one, 4)
    assert not hmm_module._scans(many, 8)
    assert not hmm_module._scans(Ragged(np.zeros(3), np.array([0, 1, 2, 3])), 4)  # nothing to gain


def test_an_m_steps_hmm_has_the_fields_order_and_pickle_the_constructor_gives():
    import pickle

    rng = np.random.default_rng(4)
    model = _model(3, rng, "poisson")
    data = _data(model, [30, 12, 7], rng)
    fitted = model.estimate(model.accumulate(data))
    built = HMM(fitted.children, np.array(fitted.transitions), np.array(fitted.initial), float(fitted.mean_length))
    assert list(vars(fitted)) == list(vars(built))
    assert pickle.dumps(fitted) == pickle.dumps(built)
    for name in ("transitions", "initial", "mean_length"):
        assert not getattr(fitted, name).flags.writeable
