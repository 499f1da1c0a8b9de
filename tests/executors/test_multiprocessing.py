"""Worker processes give the in-process trace; a dead worker stops the fit without hanging."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from emgrid.executors import NpyDataset, get, optimize
from emgrid.models import n_rows
from emgrid.models.errors import FitError

from .plans import assert_same_bytes, assert_same_trace, grid_plan


@pytest.fixture(scope="module")
def reference(nested):
    """The local executor's results per grid, the oracle for the process grids."""
    model, data = nested
    n = n_rows(model.prepare(data))
    return {g: optimize(data, model, plan=grid_plan(model, n, *g), max_iter=4, tol=0.0) for g in [(2, 1), (1, 2), (2, 2)]}


@pytest.mark.parametrize("grid", [(2, 1), (1, 2), (2, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_process_grids_give_the_local_trace_and_bytes(nested, reference, grid):
    model, data = nested
    n = n_rows(model.prepare(data))
    res = optimize(data, model, plan=grid_plan(model, n, *grid), executor="multiprocessing", max_iter=4, tol=0.0)
    local = reference[grid]
    assert_same_trace(res.log_likelihood, local.log_likelihood)
    assert_same_bytes(res.bytes_moved, local.bytes_moved)
    assert res.executor == "multiprocessing"
    assert not multiprocessing.active_children()


def test_workers_map_a_dataset_on_disk(nested, reference, tmp_path):
    model, data = nested
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    res = optimize(dataset, model, plan=grid_plan(model, dataset.n_rows, 2, 1), executor="multiprocessing",
                   max_iter=4, tol=0.0)
    assert_same_trace(res.log_likelihood, reference[(2, 1)].log_likelihood)
    assert (tmp_path / "ds").is_dir()  # the caller's dataset is left alone


def test_a_killed_worker_stops_the_fit_with_its_name_and_iteration(nested):
    model, data = nested
    n = n_rows(model.prepare(data))
    ex = get("multiprocessing")

    def kill_second_worker(it, ll, result):
        if it == 1:
            os.kill(ex.worker_pids[1], signal.SIGKILL)

    with pytest.raises(FitError, match=r"worker 'w1' \(replica 0, shard 1, pid \d+\) was killed by signal 9 .*iteration 2"):
        optimize(data, model, plan=grid_plan(model, n, 1, 2), executor=ex, max_iter=5, tol=0.0,
                 callback=kill_second_worker)
    assert not multiprocessing.active_children()
    assert ex.worker_pids == []


def test_a_worker_that_fails_while_starting_is_named_with_its_error(nested, tmp_path):
    model, data = nested
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    (tmp_path / "ds" / "c0.npy").unlink()  # a column the workers cannot map
    with pytest.raises(FitError, match=r"(?s)worker 'w[01]' .* failed while starting:.*c0\.npy"):
        optimize(dataset, model, plan=grid_plan(model, dataset.n_rows, 2, 1), executor="multiprocessing", max_iter=2)
    assert not multiprocessing.active_children()
