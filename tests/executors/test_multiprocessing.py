"""Worker processes give the in-process trace; a dead worker stops the fit without hanging."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal

import numpy as np
import pytest

from emgrid.executors import NpyDataset, get, optimize
from emgrid.executors.faults import ENV
from emgrid.models import n_rows
from emgrid.models.errors import FitError

from .plans import assert_same_bytes, grid_plan


#: 4x1: a column reduce with an inner node of its tree (replica 2 sums replica 3's, then sends)
GRIDS = [(1, 2), (2, 2), (1, 4), (4, 1)]
MID_FIT = 2  # the iteration after which the callbacks fetch the model from the grid


def assert_same_model(a, b) -> None:
    """The same tree with the same parameters, to the last bit."""
    nodes_a, nodes_b = a.nodes(), b.nodes()
    assert [(p, type(n)) for p, n in nodes_a] == [(p, type(n)) for p, n in nodes_b]
    for (path, x), (_, y) in zip(nodes_a, nodes_b):
        px, py = x.params(), y.params()
        assert px.keys() == py.keys(), path
        for k in px:
            assert np.array_equal(px[k], py[k]), (path, k, px[k], py[k])


def fit(nested, grid, executor="local"):
    """A 4-iteration fit and, fetched inside its callback after iteration ``MID_FIT``, the
    model as the grid's heads held it then (``result.shards``)."""
    model, data = nested
    n = n_rows(model.prepare(data))
    seen = {}

    def callback(it, ll, result):
        if it == MID_FIT:
            assert result.model is None  # on the grid until the fit ends
            seen["model"] = result.shards.gather()
            seen["last shard"] = result.shards.shard(grid[1] - 1)

    res = optimize(data, model, plan=grid_plan(model, n, *grid), executor=executor, max_iter=4, tol=0.0,
                   callback=callback)
    return res, seen


@pytest.fixture(scope="module")
def reference(nested):
    """The local executor's results per grid, the oracle for the process grids."""
    return {g: fit(nested, g) for g in GRIDS + [(2, 1)]}


@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: f"{g[0]}x{g[1]}")
def test_process_grids_give_the_local_trace_model_and_bytes(nested, reference, grid):
    res, seen = fit(nested, grid, "multiprocessing")
    local, local_seen = reference[grid]
    assert res.log_likelihood == local.log_likelihood  # the same sums in the same order: bit for bit
    assert_same_model(res.model, local.model)
    assert_same_model(seen["model"], local_seen["model"])  # fetched from the heads mid-fit
    assert seen["last shard"].keys() == local_seen["last shard"].keys() != set()
    # equal up to pickle's memo: arrays estimated from unpickled statistics carry a dtype
    # that is not numpy's shared singleton, so a skeleton's pickle writes it out again (a
    # few dozen bytes); and the heads' reports say what their column moved (local's say 0)
    assert_same_bytes(res.bytes_moved, local.bytes_moved)
    assert set(res.worker_peak_bytes) == {f"w{i}" for i in range(grid[0] * grid[1])}
    assert res.executor == "multiprocessing"
    assert not multiprocessing.active_children()


def test_workers_map_a_dataset_on_disk(nested, reference, tmp_path):
    model, data = nested
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    res = optimize(dataset, model, plan=grid_plan(model, dataset.n_rows, 2, 1), executor="multiprocessing",
                   max_iter=4, tol=0.0)
    assert res.log_likelihood == reference[(2, 1)][0].log_likelihood
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


def test_a_column_head_killed_before_its_reduce_is_named_not_the_replica_sending_to_it(nested, monkeypatch):
    # w1 (replica 1) sends its statistics to its column's head w0 and loses the pipe
    model, data = nested
    n = n_rows(model.prepare(data))
    monkeypatch.setenv(ENV, "kill:worker=w0:iteration=2")
    with pytest.raises(FitError, match=r"^worker 'w0' \(replica 0, shard 0, pid \d+\) was killed by signal 9 "
                                       r"in iteration 2$"):
        optimize(data, model, plan=grid_plan(model, n, 2, 1), executor="multiprocessing", max_iter=4, tol=0.0)
    assert not multiprocessing.active_children()


def test_a_hung_leaf_of_the_column_tree_is_named_not_the_workers_waiting_for_it(nested, monkeypatch):
    # 4x1: w3 hangs; w2 waits for w3's partial sum, the head w0 for w2's: only w3 is named
    model, data = nested
    n = n_rows(model.prepare(data))
    monkeypatch.setenv(ENV, "hang:worker=w3:iteration=2:seconds=600")
    with pytest.raises(FitError, match=r"^no answer within 3 s in iteration 2 from worker 'w3' "
                                       r"\(replica 3, shard 0, pid \d+\)") as info:
        optimize(data, model, plan=grid_plan(model, n, 4, 1), executor=get("multiprocessing", timeout_s=3.0),
                 max_iter=4, tol=0.0)
    assert "\n" not in str(info.value)  # the cells waiting for it are notes
    waiting = [re.sub(r" \(replica \d, shard 0, pid \d+\)", "", note) for note in info.value.__notes__]
    assert waiting == ["worker 'w0' waits for the partial sums of its column's replica(s) [2, 3]",
                       "worker 'w2' waits for the partial sums of its column's replica(s) [3]"]
    assert not multiprocessing.active_children()
