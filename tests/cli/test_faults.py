"""``emgrid fit`` with a worker killed (multiprocessing) or a rank raising (mpi) mid-fit: exit 3
in bounded time, one line naming the worker and the iteration, a readable checkpoint, and
``--resume`` finishes the fit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emgrid_cli.checkpoint import read_checkpoint

CONFIG = """
[model]
inline = { family = "Mixture", weights = [0.5, 0.5], components = [
  { family = "Gaussian", mean = -1.0, var = 1.0 }, { family = "Gaussian", mean = 1.0, var = 1.0 } ] }
[data]
synthetic = 4000
truth = { family = "Mixture", weights = [0.3, 0.7], components = [
  { family = "Gaussian", mean = -3.0, var = 1.0 }, { family = "Gaussian", mean = 2.0, var = 0.5 } ] }
[resources]
workers = 2
[executor]
kind = "multiprocessing"
[fit]
max_iter = 8
tol = 0.0
checkpoint_every = 2
output = "out"
"""


def emgrid(*args, cwd, fault=None, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("EMGRID_FAULT", None)
    if fault:
        env["EMGRID_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "emgrid_cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, env=env)


def test_a_killed_worker_fails_the_fit_with_one_line_and_resume_finishes(tmp_path):
    cfg = tmp_path / "run.toml"
    # checkpoints every 3 iterations: the one of iteration 4 is written when the fit fails
    cfg.write_text(CONFIG.replace("checkpoint_every = 2", "checkpoint_every = 3"))
    # the plan runs one worker for 4000 rows: grid index 0 is the worker that does the work
    r = emgrid("fit", cfg, "--quiet", cwd=tmp_path, fault="kill:worker=0:iteration=5")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emgrid:")]
    assert len(lines) == 1, r.stderr
    assert re.match(r"emgrid: fit failed: worker '\w+' \(replica 0, shard 0, pid \d+\) was killed by signal 9 "
                    r"in iteration 5; the checkpoint of iteration 4 is in .*out: continue with --resume$", lines[0])

    iteration, model, trace = read_checkpoint(tmp_path / "out")  # readable, atomically written
    assert iteration == 4 and len(trace) == 4 and np.all(np.isfinite(trace))
    assert not (tmp_path / "out" / "report.json").exists()

    r = emgrid("fit", cfg, "--quiet", "--resume", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)  # finished max_iter=8 with tol=0: "not converged"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["iterations"] == 8
    assert report["log_likelihood"][:4] == trace
    ll = report["log_likelihood"]
    assert all(b >= a - 1e-9 * abs(a) for a, b in zip(ll, ll[1:]))


@pytest.mark.skipif(not Path(sys.executable).with_name("mpiexec").exists(), reason="no mpiexec next to python")
def test_an_mpi_rank_raising_fails_the_fit_with_one_line_and_resume_finishes(tmp_path):
    cfg = tmp_path / "run.toml"
    # a fast network, so the plan uses both ranks (2 replicas): rank 1 is worker 'w1'
    cfg.write_text(CONFIG.replace('kind = "multiprocessing"', 'kind = "mpi"')
                   .replace("workers = 2", "workers = 2\nlatency_s = 1e-9\nbytes_per_s = 1e12"))
    r = emgrid("fit", cfg, "--quiet", cwd=tmp_path, fault="raise:worker=w1:iteration=5")
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emgrid:")]
    assert len(lines) == 1, r.stderr  # every rank raised; only rank 0 says so
    assert re.match(r"emgrid: fit failed: rank 1 \(worker 'w1', replica 1, shard 0\) failed in iteration 5: "
                    r".*InjectedFault.*; the checkpoint of iteration 4 is in .*: continue with --resume$", lines[0])
    assert read_checkpoint(tmp_path / "out")[0] == 4
    r = emgrid("fit", cfg, "--quiet", "--resume", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert json.loads((tmp_path / "out" / "report.json").read_text())["iterations"] == 8
