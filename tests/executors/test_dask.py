"""Dask actors give the local trace on every grid; a killed cell stops the fit, named; nothing stays.

One local cluster of two worker processes (one thread each) serves the module; the grids
with more cells than workers put two cells in one process.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from emgrid.executors import NpyDataset, get, optimize  # noqa: E402
from emgrid.models import n_rows  # noqa: E402
from emgrid.models.errors import FitError  # noqa: E402
from emgrid.planner import Resources  # noqa: E402

from .actor_checks import GRIDS, assert_same_fit, assert_same_model, grid_id, local_fits  # noqa: E402
from .fault_models import ROWS, blocky_data, blocky_model  # noqa: E402
from .plans import assert_same_trace, grid_plan  # noqa: E402
from .test_elastic import assert_close_models  # noqa: E402
from .test_faults import deadline  # noqa: E402


@contextmanager
def dask_cluster(n_workers: int):
    """The cluster the executor would start (``local_cluster``: loopback, quiet, its folders in
    a scratch folder) and a client of it, stopped after."""
    from emgrid.executors.dask_grid import local_cluster
    from emgrid.executors.scratch import Scratch

    scratch = Scratch("dask")
    cluster = local_cluster(n_workers, 1, scratch)
    c = distributed.Client(cluster)
    try:
        yield cluster, c
    finally:
        c.close()
        cluster.close()
        scratch.close()


@pytest.fixture(scope="module")
def client():
    """Two workers, started once for the module and passed to every fit as a client."""
    with dask_cluster(2) as (_, c):
        yield c


@pytest.fixture(scope="module")
def reference(nested):
    return local_fits(*nested)


def leftovers(client) -> dict:
    """Per worker: the actors it holds and the cells' threads still alive."""
    import threading

    def look(dask_worker):
        threads = [t.name for t in threading.enumerate() if t.name.startswith("emgrid-")]
        return len(dask_worker.state.actors), threads

    return {a: v for a, v in client.run(look).items() if v != (0, [])}


def assert_nothing_left(client, within_s: float = 60.0) -> None:
    """No actor and no cell's thread on any worker, within ``within_s`` (a worker ended after
    a hang leaves the cluster and its nanny's new one joins meanwhile)."""
    end = time.monotonic() + within_s
    while True:
        try:
            left = leftovers(client)
        except OSError as e:  # a worker that is going away
            left = {"?": repr(e)}
        if not left or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert not left, f"left on the cluster: {left}"


@pytest.mark.parametrize("grid", GRIDS, ids=grid_id)
def test_actor_grids_give_the_local_trace_and_bytes(client, nested, reference, grid, tmp_path, monkeypatch):
    """The trace and the gathered model are local's to the last bit (each shard's column
    reduced and estimated on its head, the shards fetched from the heads). Every cell also
    reports its BLAS pools from inside the fit: one thread each."""
    model, data = nested
    n = n_rows(model.prepare(data))
    monkeypatch.setenv("EMGRID_THREAD_PROBE", str(tmp_path))
    res = optimize(data, model, plan=grid_plan(model, n, *grid), executor=get("dask", address=client.scheduler.address),
                   max_iter=4, tol=0.0)
    assert_same_fit(res, reference[grid], "dask", tmp_path, grid[0] * grid[1])
    assert_nothing_left(client)


def test_cells_map_their_rows_of_a_dataset_on_disk(client, nested, reference, tmp_path):
    model, data = nested
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    res = optimize(dataset, model, plan=grid_plan(model, dataset.n_rows, 2, 2), executor=get("dask", address=client),
                   max_iter=4, tol=0.0)
    assert res.log_likelihood == reference[(2, 2)].log_likelihood
    assert_same_model(res.model, reference[(2, 2)].model)


def test_resources_read_the_cluster_and_plans_place_cells_on_it(client, nested, reference):
    res = Resources.from_dask(client)
    info = client.scheduler_info(n_workers=-1)["workers"]
    assert res.n_workers == 2
    assert {w.memory_bytes for w in res.workers} == {w["memory_limit"] for w in info.values()}
    assert all("@" in w.name for w in res.workers)
    model, data = nested
    fitted = optimize(data, model, resources=res, executor=get("dask", address=client), max_iter=3, tol=0.0)
    assert fitted.plan.workers_used <= 2
    assert {p.name for p in fitted.plan.per_worker} <= {w.name for w in res.workers}
    assert len(fitted.log_likelihood) == 3


def test_a_killed_cell_stops_the_fit_with_its_name_and_iteration(client):
    model = blocky_model()
    data = blocky_data(model)
    ex = get("dask", address=client)
    pids = []

    def kill_second_cell(it, ll, result):
        if it == 1:
            pids.extend(ex.worker_pids)
            os.kill(ex.worker_pids[1], signal.SIGKILL)

    t0 = time.monotonic()
    died = r"worker 'w1' \(replica 0, shard 1, pid \d+ .*\) died in iteration 2"
    with deadline(60), pytest.raises(FitError, match=died):
        optimize(data, model, plan=grid_plan(model, ROWS, 1, 2), executor=ex, max_iter=5, tol=0.0,
                 callback=kill_second_cell)
    assert time.monotonic() - t0 < 30
    assert ex.worker_pids == []
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker
    assert_nothing_left(client)


def test_a_hung_cell_is_named_after_the_timeout_and_its_process_ended(client, monkeypatch):
    model = blocky_model()
    data = blocky_data(model)
    monkeypatch.setenv("EMGRID_FAULT", "hang:worker=w3:iteration=2:block=1:seconds=600")
    ex = get("dask", address=client, timeout_s=2.0)
    with deadline(60), pytest.raises(FitError, match=r"no answer within 2 s in iteration 2 from worker 'w3' \(") as e:
        optimize(data, model, plan=grid_plan(model, ROWS, 2, 2), executor=ex, max_iter=4, tol=0.0)
    assert "worker 'w2'" not in str(e.value)  # it waits for w3, and says so in a note
    notes = "\n".join(e.value.__notes__)
    assert "worker 'w2' (replica 1, shard 0" in notes and "waits for the coupling message of shard(s) [1]" in notes
    for head in ("w0' (replica 0, shard 0", "w1' (replica 0, shard 1"):  # the heads wait for their columns
        assert f"worker '{head}" in notes
    assert notes.count("waits for the partial sums of its column's replica(s) [1]") == 2
    client.wait_for_workers(2, timeout=60)
    assert_nothing_left(client)


def test_without_an_address_a_cluster_starts_and_closes_with_the_fit(nested, reference):
    import psutil

    model, data = nested
    n = n_rows(model.prepare(data))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    environ = dict(os.environ)
    res = optimize(data, model, plan=grid_plan(model, n, 1, 1), executor="dask", max_iter=2, tol=0.0)
    assert dict(os.environ) == environ  # Dask's nanny leaves its workers' variables in its own process
    assert_same_trace(res.log_likelihood, reference[(2, 1)].log_likelihood[:2])  # every grid's trace is one
    end = time.monotonic() + 30  # the cluster's processes exit in their own time on a loaded machine
    while (new := {p.pid for p in psutil.Process().children(recursive=True)} - before) and time.monotonic() < end:
        time.sleep(0.2)
    assert not new, f"processes left: {new}"


def test_a_cell_that_cannot_open_its_rows_is_named_with_its_error(client, nested, tmp_path):
    model, data = nested
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    (tmp_path / "ds" / "c0.npy").unlink()  # a column the cells cannot map
    failed = r"(?s)worker 'w[01]' .* failed while starting: FileNotFoundError.*c0\.npy"
    with deadline(60), pytest.raises(FitError, match=failed):
        optimize(dataset, model, plan=grid_plan(model, dataset.n_rows, 2, 1), executor=get("dask", address=client),
                 max_iter=2)
    assert_nothing_left(client)


def test_a_cell_error_on_a_cluster_of_its_own_is_emgrids_message_alone(nested, tmp_path, capfd):
    """On the cluster the executor starts, a cell whose rows cannot be opened stops the fit
    with the FitError alone: distributed's "Compute Failed" and its traceback (logged by the
    worker process, on the same stderr) are not printed first, and this process's loggers are
    as they were after the fit."""
    model, data = nested
    dataset = NpyDataset.write(data, tmp_path / "ds", model=model)
    (tmp_path / "ds" / "c0.npy").unlink()
    levels = {name: logging.getLogger(name).level for name in ("distributed", "tornado")}
    with deadline(120), pytest.raises(FitError, match="failed while starting: FileNotFoundError"):
        optimize(dataset, model, plan=grid_plan(model, dataset.n_rows, 2, 1), executor="dask", max_iter=2)
    err = capfd.readouterr().err
    assert "distributed" not in err and "Traceback" not in err, err
    assert {name: logging.getLogger(name).level for name in levels} == levels


CTRL_C_CONFIG = """
[model]
inline = { family = "Mixture", weights = [0.5, 0.5], components = [ { family = "Gaussian", mean = -1.0, var = 1.0 },
  { family = "Gaussian", mean = 1.0, var = 1.0 } ] }
[data]
synthetic = 4000
seed = 0
[resources]
workers = 2
[executor]
kind = "dask"
[fit]
max_iter = 100000
tol = 0.0
checkpoint_every = 1
output = "out"
"""


def test_ctrl_c_at_a_terminal_prints_emgrids_line_alone(tmp_path):
    """A terminal's Ctrl-C is a SIGINT to every process of the foreground group, the Dask
    workers included: the fit stops with exit 130 and emgrid's one line, none of the
    workers' tracebacks."""
    import subprocess
    import sys

    (tmp_path / "run.toml").write_text(CTRL_C_CONFIG)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "emgrid.cli.main", "fit", "run.toml", "--quiet"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,  # a group of its own, as a terminal's foreground job
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        end = time.monotonic() + 120
        while not (tmp_path / "out" / "checkpoint.json").exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 130, err
    assert len(lines) == 1 and lines[0].startswith("emgrid: interrupted"), err


@pytest.mark.parametrize("grid", [(2, 1), (1, 2)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_a_killed_cell_is_replanned_when_asked_and_the_fit_ends_as_the_uninterrupted_one(client, nested, grid):
    """A cell's worker killed at a random iteration (seeded per grid); its nanny restarts it,
    and the fit re-plans on the cluster as Dask reports it and goes on from the last completed
    iteration's model (for 1x2, the coordinator's kept copy of the lost column's shard)."""
    import random

    from .test_elastic import Killer, assert_close_models

    model, data = nested
    n = n_rows(model.prepare(data))
    plan = grid_plan(model, n, *grid)
    want = optimize(data, model, plan=plan, max_iter=40, tol=1e-7)
    client.wait_for_workers(2, timeout=60)  # a worker an earlier test killed is back
    rng = random.Random(f"dask-{grid}")
    ex = get("dask", address=client)
    kill = Killer(ex, rng.randint(1, min(4, want.iterations - 1)), grid[0] * grid[1], rng)
    with deadline(180):
        got = optimize(data, model, plan=plan, executor=ex, max_iter=40, tol=1e-7, callback=kill,
                       on_worker_loss="replan")
    assert [r["iteration"] for r in got.replans if r["kind"] == "loss"] == [kill.at + 1]
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)
    assert_close_models(got.model, want.model)
    assert got.iterations == want.iterations
    client.wait_for_workers(2, timeout=60)
    assert_nothing_left(client)


# ---------------------------------------------------------------- an elastic fit grows
@pytest.fixture
def one_worker_cluster():
    """A cluster of one worker that a test scales up."""
    with dask_cluster(1) as got:
        yield got


def growing_fit(cluster, client, n_rows_: int):
    """An elastic fit planned on the cluster's one worker; a second joins after iteration 1."""
    from emgrid.models import DiagGaussian, Mixture

    rng = np.random.default_rng(5)
    model = Mixture([DiagGaussian(rng.normal(size=6) * 3, np.ones(6)) for _ in range(4)], np.full(4, 0.25))
    data = model.sample(n_rows_, rng)
    start = Mixture([DiagGaussian(rng.normal(size=6), np.ones(6)) for _ in range(4)], np.full(4, 0.25))

    def add_a_worker(it, ll, result):
        if it == 1:
            cluster.scale(2)
            client.wait_for_workers(2, timeout=60)

    want = optimize(data, start, max_iter=6, tol=0.0)
    with deadline(180):
        got = optimize(data, start, executor=get("dask", address=client), max_iter=6, tol=0.0,
                       callback=add_a_worker, on_worker_loss="replan")
    return want, got


def test_a_worker_that_joins_is_used_from_the_next_iteration_when_it_pays(one_worker_cluster):
    """600,000 rows: two replicas cut the predicted iteration by about 40%, beyond the 20%
    threshold; the fit moves onto them at the iteration's end and ends as the fit that never
    moved."""
    want, got = growing_fit(*one_worker_cluster, 600_000)
    (grew,) = got.replans
    assert grew["kind"] == "growth" and grew["old_grid"] == [1, 1] and grew["new_grid"][0] * grew["new_grid"][1] == 2
    assert grew["predicted_s"] < 0.8 * grew["was_predicted_s"] and len(grew["workers"]) == 1
    assert (got.plan.data_parallel, got.plan.model_parallel) == tuple(grew["new_grid"])
    assert got.iterations == want.iterations == 6 and not got.growth_declined
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)
    assert_close_models(got.model, want.model)
    assert_nothing_left(one_worker_cluster[1])


def test_a_worker_that_joins_is_left_alone_when_it_does_not_pay(one_worker_cluster):
    """300 rows: a second replica saves less than the actors' exchange costs; the offer is
    recorded once, and the fit stays where it was."""
    want, got = growing_fit(*one_worker_cluster, 300)
    assert not got.replans and (got.plan.data_parallel, got.plan.model_parallel) == (1, 1)
    (offer,) = got.growth_declined
    assert not offer["predicted_s"] < 0.8 * offer["was_predicted_s"]
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_killed_worker_of_three_is_replanned_on_the_two_left(nested, seed):
    """A 3x1 fit planned for a cluster of three workers (by their names): one killed at a
    random iteration; the re-plan excludes it (its nanny's new process, under the same name,
    is an offer to grow, declined or taken by the rule), and the fit ends as the
    uninterrupted one; nothing stays on the cluster."""
    import random

    from emgrid.planner import SolverConfig, balance_plan

    from .test_elastic import Killer

    model, data = nested
    n = n_rows(model.prepare(data))
    with dask_cluster(3) as (_, c):
        resources = Resources.from_dask(c)
        plan = balance_plan(model, resources, n_data=n, grid=(3, 1), solver=SolverConfig(seed=0, num_workers=1))
        want = optimize(data, model, plan=plan, max_iter=40, tol=1e-7)
        rng = random.Random(f"dask-3x1-{seed}")
        ex = get("dask", address=c)
        kill = Killer(ex, rng.randint(1, min(4, want.iterations - 1)), 3, rng)
        with deadline(240):
            got = optimize(data, model, plan=plan, resources=resources, executor=ex, max_iter=40, tol=1e-7,
                           callback=kill, on_worker_loss="replan")
        (lost,) = [r for r in got.replans if r["kind"] == "loss"]
        assert lost["iteration"] == kill.at + 1 and lost["old_grid"] == [3, 1]
        assert lost["worker"] == plan.per_worker[kill.cell].name
        assert lost["new_grid"][0] * lost["new_grid"][1] <= 2
        assert got.iterations == want.iterations
        np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)
        assert_close_models(got.model, want.model)
        c.wait_for_workers(3, timeout=60)
        assert_nothing_left(c)
