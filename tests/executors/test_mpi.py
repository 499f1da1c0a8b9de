"""MPI: ``mpiexec -n 2`` and ``-n 4`` (oversubscribed on two cores) give the local trace, with
the blocking collectives and with the timed transport (``timeout_s``); a plan needing more
ranks than started is refused on every rank before any work.

The in-process test runs the MPI executor on ``COMM_SELF``, so it holds under plain pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from emgrid.executors import get, optimize
from emgrid.models import n_rows
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
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, str(SCRIPT), str(d), str(m), str(out)]
    if timeout_s is not None:
        cmd.append(str(timeout_s))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))


@pytest.fixture(scope="module")
def local_results(nested):
    model, data = nested
    n = n_rows(model.prepare(data))
    return {g: optimize(data, model, plan=grid_plan(model, n, *g), max_iter=ITERATIONS, tol=0.0)
            for g in [(2, 1), (1, 2), (2, 2)]}


@needs_mpiexec
@pytest.mark.parametrize("ranks,grid,timeout_s", [
    (2, (2, 1), None), (2, (1, 2), None), (4, (2, 2), None), (3, (1, 2), None),
    (4, (2, 2), 60.0), (3, (1, 2), 60.0),
], ids=["n2-2x1", "n2-1x2", "n4-2x2", "n3-1x2-one-idle", "n4-2x2-timed", "n3-1x2-one-idle-timed"])
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
    refusals = [line for line in proc.stdout.splitlines() if line.startswith("PLANERROR")]
    assert len(refusals) == 2
    assert "needs 4 workers (2x2 grid)" in refusals[0] and "2 rank(s)" in refusals[0]
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
