"""Each start's trace (``FitResult.init_traces``) and the progress the starts report
(``optimize(..., init_callback=...)``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.models import complete_shapes, initialize
from emgrid.models.errors import ConvergenceWarning
from emgrid.models.starts import distinct_starts

from .plans import assert_same_trace, grid_plan
from .template_models import N, template, template_data


@pytest.fixture(scope="module")
def hetero():
    return template(), template_data()


def _fit(template, data, d=1, m=1, executor="local", **kw):
    plan = grid_plan(complete_shapes(template, data), N, d, m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return optimize(data, template, plan=plan, executor=executor, max_iter=2, tol=0.0, **kw)


def test_every_start_keeps_its_trace_and_reports_its_progress(hetero):
    template, data = hetero
    seen = []

    def progress(iteration, loglik, so_far):
        seen.append((so_far.start, so_far.n_init, iteration, loglik))

    fit = _fit(template, data, n_init=4, seed=3, init_iter=3, init_callback=progress)
    assert fit.n_init == 4 and fit.start is None
    assert len(fit.init_traces) == 4
    for trace, last in zip(fit.init_traces, fit.init_log_likelihoods):
        assert len(trace) == 3 and trace[-1] == last
    # the starts are distinct here, so each is refined and reported once, in start order
    shaped = complete_shapes(template, data)
    kept, _ = distinct_starts(initialize(shaped, data, N, seed=3, start=s) for s in range(4))
    assert len(kept) == 4
    assert [(s, n, i) for s, n, i, _ in seen] == [(s, 4, i) for s in range(4) for i in (1, 2, 3)]
    assert [ll for *_, ll in seen] == [ll for trace in fit.init_traces for ll in trace]
    # each trace is the trace of EM from its own start, run alone
    for s in range(4):
        alone = _fit(initialize(shaped, data, N, seed=3, start=s), data)
        assert_same_trace(fit.init_traces[s][:2], alone.log_likelihood)


def test_the_starts_traces_are_the_same_on_local_and_multiprocessing(hetero):
    template, data = hetero
    ref = _fit(template, data, n_init=3, seed=5, init_iter=2)
    for d, m in [(2, 1), (1, 2)]:
        other = _fit(template, data, d, m, "multiprocessing", n_init=3, seed=5, init_iter=2,
                     init_callback=lambda *a: None)
        assert len(other.init_traces) == 3
        for a, b in zip(other.init_traces, ref.init_traces):
            assert_same_trace(a, b)


def test_a_start_equal_to_an_earlier_one_repeats_its_trace():
    from emgrid.models import from_spec

    # two well separated clusters: k-means from every seed finds the same partition
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-10, 1, 300), rng.normal(10, 1, 300)])
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit = optimize(x, from_spec({"family": "Mixture", "k": 2, "component": {"family": "Gaussian"}}),
                       n_init=5, init_iter=2, max_iter=1, tol=0.0,
                       init_callback=lambda i, ll, so_far: seen.append(so_far.start))
    assert len(fit.init_traces) == 5 and fit.n_init == 5
    assert all(t == fit.init_traces[0] for t in fit.init_traces)
    assert [t[-1] for t in fit.init_traces] == fit.init_log_likelihoods
    assert seen == [0, 0]  # one distinct start, refined (and reported) once


def test_a_warm_start_has_no_starts():
    from emgrid.models import Gaussian

    fit = optimize(np.random.default_rng(1).normal(size=50), Gaussian(0.0, 1.0), max_iter=2, tol=0.0,
                   init_callback=lambda *a: pytest.fail("a warm start has no starts to report"))
    assert fit.init_traces == [] and fit.n_init == 0 and fit.start is None
