"""Ray actors give the local trace on every grid; a killed cell stops the fit, named; nothing stays.

One local Ray instance of two CPUs serves the module (``start_local``, as the executor starts
one); the grids with more cells than CPUs give each cell's actor a share of them.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

ray = pytest.importorskip("ray")

from emgrid.executors import NpyDataset, get, optimize  # noqa: E402
from emgrid.executors.warden import pid_alive  # noqa: E402
from emgrid.models import n_rows  # noqa: E402
from emgrid.models.errors import FitError  # noqa: E402
from emgrid.planner import Resources  # noqa: E402

from .actor_checks import GRIDS, assert_same_fit, grid_id, local_fits  # noqa: E402
from .fault_models import ROWS, blocky_data, blocky_model  # noqa: E402
from .plans import grid_plan  # noqa: E402
from .test_elastic import CASES  # noqa: E402
from .test_faults import deadline  # noqa: E402


@pytest.fixture(scope="module")
def instance():
    """The instance the executor would start (on loopback, its session in a scratch folder),
    started here once for the module and used by every fit as a cluster already connected."""
    from emgrid.executors.ray_grid import start_local

    scratch = start_local(2)
    yield
    ray.shutdown()
    scratch.close()


@pytest.fixture(scope="module")
def reference(nested):
    return local_fits(*nested)


class Cells:
    """The executor, and the pids its cells had while the fit ran."""

    def __init__(self, **options):
        self.ex = get("ray", **options)
        self.pids: list[int] = []

    def callback(self, it, ll, result):
        if it == 1:
            self.pids = list(self.ex.worker_pids)



def assert_nothing_left(pids, within_s: float = 30.0) -> None:
    """Every cell's process is gone and the cluster's CPUs are free again."""
    assert pids
    end = time.monotonic() + within_s
    while time.monotonic() < end and (any(map(pid_alive, pids))
                                      or ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]):
        time.sleep(0.1)
    assert not [p for p in pids if pid_alive(p)], "cells' processes left running"
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]


@pytest.mark.parametrize("grid", GRIDS, ids=grid_id)
def test_actor_grids_give_the_local_trace_and_bytes(instance, nested, reference, grid, tmp_path, monkeypatch):
    """The trace and the gathered model are local's to the last bit (each shard's column
    reduced and estimated on its head, the shards fetched from the heads). The 1x2 grid's
    cells map their rows of a dataset on disk; the others receive theirs. Every cell also
    reports its BLAS pools from inside the fit: one thread each."""
    model, data = nested
    n = n_rows(model.prepare(data))
    (tmp_path / "probe").mkdir()
    monkeypatch.setenv("EMGRID_THREAD_PROBE", str(tmp_path / "probe"))
    if grid == (1, 2):
        data = NpyDataset.write(data, tmp_path / "ds", model=model)
    cells = Cells()
    res = optimize(data, model, plan=grid_plan(model, n, *grid), executor=cells.ex, max_iter=4, tol=0.0,
                   callback=cells.callback)
    assert_same_fit(res, reference[grid], "ray", tmp_path / "probe", grid[0] * grid[1])
    assert_nothing_left(cells.pids)


def test_resources_read_the_instance(instance):
    res = Resources.from_ray()
    assert res.n_workers == 2
    assert all(w.memory_bytes and w.memory_bytes > 0 for w in res.workers)
    node = ray.nodes()[0]["NodeManagerAddress"]
    assert [w.name for w in res.workers] == [f"{node}/0", f"{node}/1"]


def test_a_killed_cell_stops_the_fit_with_its_name_and_iteration(instance):
    model = blocky_model()
    data = blocky_data(model)
    cells = Cells()

    def kill_second_cell(it, ll, result):
        if it == 1:
            cells.pids = list(cells.ex.worker_pids)
            os.kill(cells.pids[1], signal.SIGKILL)

    t0 = time.monotonic()
    died = r"worker 'w1' \(replica 0, shard 1, pid \d+ on .*\) died in iteration 2"
    with deadline(60), pytest.raises(FitError, match=died):
        optimize(data, model, plan=grid_plan(model, ROWS, 1, 2), executor=cells.ex, max_iter=5, tol=0.0,
                 callback=kill_second_cell)
    assert time.monotonic() - t0 < 30
    assert cells.ex.worker_pids == []
    assert_nothing_left(cells.pids)


def test_a_hung_cell_is_named_after_the_timeout_and_killed(instance, monkeypatch):
    model = blocky_model()
    data = blocky_data(model)
    cells = Cells(timeout_s=2.0)
    monkeypatch.setenv("EMGRID_FAULT", "hang:worker=w1:iteration=2:block=1:seconds=600")
    with deadline(60), pytest.raises(FitError, match=r"no answer within 2 s in iteration 2 from worker 'w1' \(") as e:
        optimize(data, model, plan=grid_plan(model, ROWS, 2, 1), executor=cells.ex, max_iter=4, tol=0.0,
                 callback=cells.callback)
    assert "worker 'w0'" not in str(e.value)  # the column's head waits for w1, and says so in a note
    assert any(n.startswith("worker 'w0' (replica 0, shard 0") and "waits for the partial sums of its column's "
               "replica(s) [1]" in n for n in e.value.__notes__)
    assert_nothing_left(cells.pids)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}")
def test_a_killed_cell_is_replanned_when_asked_and_the_fit_ends_as_the_uninterrupted_one(instance, nested, case):
    """A cell's actor process killed at a random iteration (seeded per grid) of a 2x1, a 1x2
    (a column's only cell: the coordinator's kept model restarts it) and a 3x1 fit: the fit
    re-plans on the workers left and ends as the uninterrupted one."""
    import random

    import numpy as np

    from .test_elastic import Killer, assert_close_models

    (d, m), workers = case
    model, data = nested
    n = n_rows(model.prepare(data))
    resources = Resources.uniform(workers)
    plan = grid_plan(model, n, d, m)
    want = optimize(data, model, plan=plan, resources=resources, max_iter=40, tol=1e-7)
    rng = random.Random(f"ray-{d}x{m}")
    ex = get("ray")
    kill = Killer(ex, rng.randint(1, min(4, want.iterations - 1)), d * m, rng)
    with deadline(180):
        got = optimize(data, model, plan=plan, resources=resources, executor=ex, max_iter=40, tol=1e-7,
                       callback=kill, on_worker_loss="replan")
    (lost,) = got.replans
    assert lost["iteration"] == kill.at + 1 and lost["old_grid"] == [d, m]
    assert lost["worker"] == plan.per_worker[kill.cell].name
    assert got.iterations == want.iterations
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)
    assert_close_models(got.model, want.model)
    assert_nothing_left(kill.pids)
