"""Every executor against ``models.reference.reference_fit``, EM written as plainly as the
family contract allows (no blocks, batches or shards): an independent computation of the
same iterations, so agreement is to rounding (its sums run in another order), not bitwise.
The executors' bitwise agreement with one another is in their own tests."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from emgrid.executors import get, optimize
from emgrid.models import n_rows
from emgrid.models.reference import reference_fit
from tests import strategies as S

from .plans import grid_plan
from .test_mpi import ITERATIONS, needs_mpiexec, run_mpi

RTOL = 1e-9


def assert_close_traces(actual, expected) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * max(1.0, float(np.abs(expected).max())))


def assert_close_models(actual, expected) -> None:
    a, b = actual.nodes(), expected.nodes()
    assert [(p, n.family) for p, n in a] == [(p, n.family) for p, n in b]
    for (path, x), (_, y) in zip(a, b):
        for name, value in x.params().items():
            np.testing.assert_allclose(value, y.params()[name], rtol=1e-7, atol=1e-10, err_msg=f"{path}.{name}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=S.models_with_data(min_rows=5, max_rows=40))
def test_the_local_executor_computes_the_reference_iterations(case):
    # two iterations: the start's log-likelihood (an E-step) and the first M-step's model's
    model, data = case
    _, expected = reference_fit(model, data, max_iter=2, tol=0.0)
    got = optimize(data, model, max_iter=2, tol=0.0)
    assert_close_traces(got.log_likelihood, expected)


@pytest.fixture(scope="module")
def reference(nested):
    model, data = nested
    return reference_fit(model, data, max_iter=ITERATIONS, tol=0.0)


def fit_on(executor, nested, grid):
    model, data = nested
    n = n_rows(model.prepare(data))
    return optimize(data, model, plan=grid_plan(model, n, *grid), executor=executor, max_iter=ITERATIONS, tol=0.0)


@pytest.mark.parametrize("grid", [(2, 1), (1, 2), (2, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_multiprocessing_computes_the_reference_iterations(nested, reference, grid):
    res = fit_on("multiprocessing", nested, grid)
    assert_close_traces(res.log_likelihood, reference[1])
    assert_close_models(res.model, reference[0])


def test_dask_computes_the_reference_iterations(nested, reference):
    pytest.importorskip("distributed")
    res = fit_on(get("dask", n_workers=2), nested, (2, 2))
    assert_close_traces(res.log_likelihood, reference[1])
    assert_close_models(res.model, reference[0])


def test_ray_computes_the_reference_iterations(nested, reference):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this process is connected to another Ray instance")
    res = fit_on(get("ray", num_cpus=2), nested, (2, 2))
    assert_close_traces(res.log_likelihood, reference[1])
    assert_close_models(res.model, reference[0])


@needs_mpiexec
def test_mpi_computes_the_reference_iterations(reference, tmp_path):
    # mpi_script.py fits the same nested model and data on every rank
    out = tmp_path / "mpi.json"
    proc = run_mpi(4, 2, 2, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_close_traces(json.loads(out.read_text())["trace"], reference[1])
