"""MPI: ``mpiexec -n 2``, ``-n 3`` and ``-n 4`` (oversubscribed on two cores) give the local
trace, with the blocking collectives and with the timed transport (``timeout_s``); a plan
needing more ranks than started is refused on every rank before any work.

The sharded M-step across ranks (``mpi_shard_script.py``, one ``mpiexec -n 4`` job for every
grid): each shard's statistics reduced over its column to its head, the head estimating its
subtrees: the traces and fitted models are the local executor's to the last bit, and a
model left on the grid is fetched from the heads shard by shard. A model larger than every
worker's memory (``mpiexec -n 8``) is planned and fitted, each worker within its plan.

The in-process test runs the MPI executor on ``COMM_SELF``, so it holds under plain pytest.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emgrid.executors import get, optimize
from emgrid.models import DiagGaussian, n_rows
from emgrid.models.errors import PlanError

from .plans import assert_same_bytes, assert_same_trace, grid_plan

mpi4py = pytest.importorskip("mpi4py")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
SCRIPT = HERE / "mpi_script.py"
ITERATIONS = 6  # as mpi_script.py runs

needs_mpiexec = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")


def run_mpi(ranks: int, d: int, m: int, out: Path, timeout_s: float | None = None) -> subprocess.CompletedProcess:
    cmd = [str(d), str(m), str(out)] + ([] if timeout_s is None else [str(timeout_s)])
    return mpiexec(ranks, SCRIPT, *cmd)


def mpiexec(ranks: int, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=str(ROOT))


def assert_same_model(actual, expected) -> None:
    """The same tree with bitwise equal parameters."""
    a, b = actual.nodes(), expected.nodes()
    assert [(p, n.family) for p, n in a] == [(p, n.family) for p, n in b]
    for (path, x), (_, y) in zip(a, b):
        px, py = x.params(), y.params()
        assert px.keys() == py.keys(), path
        for k in px:
            assert np.array_equal(px[k], py[k]), (path, k)


@pytest.fixture(scope="module")
def local_results(nested):
    model, data = nested
    n = n_rows(model.prepare(data))
    return {g: optimize(data, model, plan=grid_plan(model, n, *g), max_iter=ITERATIONS, tol=0.0)
            for g in [(2, 1), (1, 2), (2, 2)]}


@needs_mpiexec
@pytest.mark.parametrize("ranks,grid,timeout_s", [
    (2, (2, 1), None), (3, (1, 2), None), (4, (2, 2), 60.0), (3, (1, 2), 60.0),
], ids=["n2-2x1", "n3-1x2-one-idle", "n4-2x2-timed", "n3-1x2-one-idle-timed"])  # 1x2, 2x2 blocking: below
def test_mpiexec_gives_the_local_trace_on_every_rank(tmp_path, local_results, ranks, grid, timeout_s):
    out = tmp_path / "result.json"
    proc = run_mpi(ranks, *grid, out, timeout_s)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    local = local_results[grid]
    assert got["executor"] == "mpi" and got["iterations"] == ITERATIONS
    assert got["same_on_all_ranks"]
    assert_same_trace(got["trace"], local.log_likelihood)
    assert_same_bytes(got["bytes"], local.bytes_moved)


@needs_mpiexec
def test_a_plan_with_more_workers_than_ranks_is_refused_on_every_rank(tmp_path):
    out = tmp_path / "result.json"
    proc = run_mpi(2, 2, 2, out)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    # every rank prints its refusal; hydra may forward the two ranks' lines interleaved
    assert proc.stdout.count("PLANERROR: the plan needs 4 workers (2x2 grid) but this MPI job has 2 rank(s)") == 2, \
        proc.stdout
    assert not out.exists()


def test_the_mpi_executor_on_comm_self_gives_the_local_trace(nested):
    from mpi4py import MPI

    model, data = nested
    n = n_rows(model.prepare(data))
    plan = grid_plan(model, n)
    res = optimize(data, model, plan=plan, executor=get("mpi", comm=MPI.COMM_SELF), max_iter=3, tol=0.0)
    local = optimize(data, model, plan=plan, max_iter=3, tol=0.0)
    assert res.executor == "mpi"
    assert_same_trace(res.log_likelihood, local.log_likelihood)
    with pytest.raises(PlanError, match="needs 2 workers"):
        optimize(data, model, plan=grid_plan(model, n, 2, 1), executor=get("mpi", comm=MPI.COMM_SELF))


# ---------------------------------------------------------------- the sharded M-step across ranks
@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """Rank 0's pickled results of ``mpi_shard_script.py grids`` under ``mpiexec -n 4``."""
    out = tmp_path_factory.mktemp("mpi") / "grids.pkl"
    proc = mpiexec(4, HERE / "mpi_shard_script.py", "grids", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return pickle.loads(out.read_bytes())


@needs_mpiexec
def test_mpiexec_fits_sharded_models_as_the_local_executor_on_every_grid(sharded_runs):
    from .mpi_shard_script import GRIDS, ITERATIONS, grid_cases

    assert len(sharded_runs) == 2 * len(GRIDS) + 1
    for name, model, data in grid_cases():
        n = n_rows(model.prepare(data))
        for d, m in GRIDS:
            got = sharded_runs[name, d, m]
            local = optimize(data, model, plan=grid_plan(model, n, d, m), max_iter=ITERATIONS, tol=0.0)
            assert got["same_on_all_ranks"], (name, d, m)
            assert got["trace"] == local.log_likelihood, (name, d, m)  # bitwise: one summation order
            assert_same_model(got["model"], local.model)
            assert_same_bytes(got["bytes"], local.bytes_moved)
            if (d, m) == (2, 2):
                on_2x2 = local
    # the last case on 2x2, its model left on the grid, fetched from its heads by the coordinator's callback
    fetched = sharded_runs["fetched", 2, 2]
    assert fetched["same_on_all_ranks"] and fetched["trace"] == on_2x2.log_likelihood
    assert_same_model(fetched["model"], on_2x2.model)


@needs_mpiexec
def test_a_model_larger_than_every_workers_memory_is_planned_and_fitted_under_mpiexec(tmp_path):
    # 4 workers of less memory than the model's parameters: on 1x4 each holds its shard's
    # parameters, statistics and log tables once, and one leaf twice in its M-step
    # (planner.costing.fixed_bytes with D = 1)
    from emgrid.planner import balance_plan

    from .mpi_shard_script import MEMORY_WORKERS, memory_case, memory_limit, memory_resources, param_bytes

    model, data = memory_case()
    limit = memory_limit()
    assert limit < param_bytes(model)
    plan = balance_plan(model, memory_resources(), n_data=n_rows(model.prepare(data)))  # no InfeasiblePlanError
    assert plan.workers_used == MEMORY_WORKERS and all(w.memory_bytes <= limit for w in plan.per_worker)
    out, planned = tmp_path / "memory.pkl", tmp_path / "plan.pkl"
    planned.write_bytes(pickle.dumps(plan))
    proc = mpiexec(MEMORY_WORKERS, HERE / "mpi_shard_script.py", "memory", str(out), str(planned))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = pickle.loads(out.read_bytes())["memory"]
    ran = got["plan"]
    local = optimize(data, model, plan=ran, max_iter=3, tol=0.0)
    assert got["same_on_all_ranks"] and got["trace"] == local.log_likelihood
    assert got["left_on_the_grid"]  # no rank has room for the whole model: not gathered by default
    assert_same_model(got["model"], local.model)
    for w in ran.per_worker:
        # every rank, the coordinator included, measures within 25% of the plan's figure
        # (MPI's shared-memory buffers it touches count too)
        assert got["peaks"][w.name] <= 1.25 * w.memory_bytes, (w.name, got["peaks"][w.name], w.memory_bytes)


@needs_mpiexec
def test_a_model_parallel_rank_holds_no_more_than_its_plan_across_iterations(tmp_path):
    """Every block of a 1x2 fit sends each shard's densities to the other rank: a rank that
    kept its sent messages (MPI requests hold their buffers) grew by a block's densities per
    block and iteration; each rank stays within 25% of its plan."""
    from emgrid.executors import NpyDataset
    from emgrid.planner import Resources, balance_plan

    from .mpi_shard_script import coupling_case

    model, data = coupling_case()
    NpyDataset.write(data, tmp_path / "rows", model)
    plan = balance_plan(model, Resources.uniform(2), n_data=n_rows(model.prepare(data)), grid=(1, 2))
    out, planned = tmp_path / "coupling.pkl", tmp_path / "plan.pkl"
    planned.write_bytes(pickle.dumps(plan))
    proc = mpiexec(2, HERE / "mpi_shard_script.py", "coupling", str(out), str(planned), str(tmp_path / "rows"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = pickle.loads(out.read_bytes())["coupling"]
    assert got["trace"] == optimize(data, model, plan=plan, max_iter=4, tol=0.0).log_likelihood
    for w in plan.per_worker:
        assert got["peaks"][w.name] <= 1.25 * w.memory_bytes, (w.name, got["peaks"][w.name], w.memory_bytes)


@needs_mpiexec
def test_ranks_fit_what_the_callers_mapped_array_holds_not_what_its_file_does(tmp_path):
    """The caller's script maps a ``.npy`` copy-on-write and changes it in memory on every
    rank: the ranks fit those values (their rows are views of the caller's arrays), as the
    local executor does."""
    x = np.random.default_rng(4).standard_normal((2000, 3))
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.json"
    proc = mpiexec(2, HERE / "mpi_mapped_script.py", str(tmp_path / "x.npy"), str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(out.read_text())
    model = DiagGaussian(np.zeros(3), np.ones(3))
    want = optimize(x + 100.0, model, plan=grid_plan(model, len(x), 2, 1), max_iter=3, tol=0.0)
    assert got["same_on_all_ranks"]
    np.testing.assert_allclose(got["trace"], want.log_likelihood, rtol=1e-12)
    np.testing.assert_allclose(got["mean"], want.model.mean, rtol=1e-12)
