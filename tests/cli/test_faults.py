"""``emgrid fit`` with a worker killed (multiprocessing) or a rank raising, killed or exiting
(mpi) mid-fit: exit 3 in bounded time, one line naming the worker and the iteration, a
readable checkpoint, and ``--resume`` finishes the fit. Under MPI a rank that dies takes the
job down with it, rank 0 included: the parent that started ``mpiexec`` reports it
(``emgrid.cli.launch``), whatever status ``mpiexec`` exits with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emgrid.cli.checkpoint import read_checkpoint, write_checkpoint
from emgrid.cli.launch import ENV as RECORD_ENV
from emgrid.cli.launch import launch

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
    return subprocess.run([sys.executable, "-m", "emgrid.cli.main", *map(str, args)], capture_output=True,
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


def test_a_hung_worker_fails_the_fit_within_the_configured_timeout(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG.replace('kind = "multiprocessing"', 'kind = "multiprocessing"\ntimeout_s = 3'))
    # the worker sleeps a minute in iteration 3; the fit must stop after about 3 s, not hang
    r = emgrid("fit", cfg, "--quiet", cwd=tmp_path, fault="hang:worker=0:iteration=3:seconds=60", timeout=45)
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emgrid:")]
    assert len(lines) == 1, r.stderr
    assert re.match(r"emgrid: fit failed: no answer within 3 s in iteration 3 from worker '\w+' \(replica 0, shard 0, "
                    r"pid \d+\); the checkpoint of iteration 2 is in .*out: continue with --resume$", lines[0]), lines[0]
    iteration, _, trace = read_checkpoint(tmp_path / "out")
    assert iteration == 2 and len(trace) == 2


needs_mpiexec = pytest.mark.skipif(not Path(sys.executable).with_name("mpiexec").exists(),
                                   reason="no mpiexec next to python")
# a fast network, so the plan uses both ranks: rank 1 is worker 'w1', the second replica or the
# second shard as the planner prefers (the network makes them cost nearly the same)
MPI_CONFIG = (CONFIG.replace('kind = "multiprocessing"', 'kind = "mpi"')
              .replace("workers = 2", "workers = 2\nlatency_s = 1e-9\nbytes_per_s = 1e12"))
W1 = r"worker 'w1' \(replica (?:1, shard 0|0, shard 1), rank 1(?:, pid \d+)?\)"


@needs_mpiexec
def test_an_mpi_rank_raising_fails_the_fit_with_one_line_and_resume_finishes(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(MPI_CONFIG)
    r = emgrid("fit", cfg, "--quiet", cwd=tmp_path, fault="raise:worker=w1:iteration=5")
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emgrid:")]
    assert len(lines) == 1, r.stderr  # every rank raised; only rank 0 says so
    assert re.match(rf"emgrid: fit failed: {W1} failed in iteration 5: "
                    r".*InjectedFault.*; the checkpoint of iteration 4 is in .*: continue with --resume$", lines[0])
    assert read_checkpoint(tmp_path / "out")[0] == 4
    r = emgrid("fit", cfg, "--quiet", "--resume", cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert json.loads((tmp_path / "out" / "report.json").read_text())["iterations"] == 8


@needs_mpiexec
@pytest.mark.parametrize("fault", ["kill:worker=w1:iteration=5", "exit:worker=w1:iteration=5:code=1"],
                         ids=["killed", "exits-with-1"])
def test_an_mpi_rank_that_dies_fails_the_fit_with_exit_3_one_line_and_resume_finishes(tmp_path, fault):
    # mpiexec exits 9 for the kill and 1 (or 9: the status of a rank it killed) for the exit:
    # neither is the command's code, and 1 would read as "not converged"
    cfg = tmp_path / "run.toml"
    cfg.write_text(MPI_CONFIG)
    r = emgrid("fit", cfg, "--quiet", cwd=tmp_path, fault=fault, timeout=60)
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("emgrid:")]
    assert len(lines) == 1, r.stderr
    assert re.match(rf"emgrid: fit failed: {W1} died in iteration 5 "
                    r"\(killed, or exited without reporting\); mpiexec ended the job with status \d+; "
                    r"the checkpoint of iteration 4 is in .*out: continue with --resume$", lines[0]), lines[0]
    iteration, _, trace = read_checkpoint(tmp_path / "out")  # rank 0 was killed too: the last periodic one
    assert iteration == 4 and len(trace) == 4 and np.all(np.isfinite(trace))
    assert not (tmp_path / "out" / "report.json").exists()
    r = emgrid("fit", cfg, "--quiet", "--resume", cwd=tmp_path, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["iterations"] == 8 and report["log_likelihood"][:4] == trace


# What the launcher makes of what the ranks recorded, with a stand-in for mpiexec (no MPI).
STAND_IN = """
import os, pathlib, sys, time
folder = pathlib.Path(os.environ[{env!r}])
for name, text in {files!r}.items():
    (folder / name).write_text(text.replace("PID", str(os.getpid())))

def pidfds_on_me():
    base, mine, n = f"/proc/{{os.getppid()}}/fdinfo", f"Pid:\\t{{os.getpid()}}\\n", 0
    for fd in os.listdir(base):
        try:
            with open(f"{{base}}/{{fd}}") as f:
                n += mine in f.read()
        except OSError:
            pass
    return n

if {watch}:  # do not die before the parent watches this "rank" (a pidfd beside the job's own)
    end = time.monotonic() + 30
    while pidfds_on_me() < 2 and time.monotonic() < end:
        time.sleep(0.01)
sys.exit({status})
"""


@pytest.mark.parametrize("files,status,code,line", [
    ({"exit": "1"}, 9, 1, None),  # rank 0 reported: its code, whatever mpiexec's status
    ({"exit": "3"}, 3, 3, None),  # rank 0 reported a failure and said so itself
    ({}, 0, 0, None),
    # rank 0 hung and was named by rank 1, which aborted the job
    ({"progress": "1", "error.1": "no answer within 5 s in iteration 2 from worker 'w0' (rank 0)"}, 3, 3,
     r"emgrid: fit failed: no answer within 5 s in iteration 2 from worker 'w0' \(rank 0\); "
     r"the checkpoint of iteration 1 is in .*: continue with --resume$"),
    # the stand-in is "rank 0" and dies: the parent watched its pid
    ({"pid.0": "PID", "progress": "2"}, 9, 3,
     r"emgrid: fit failed: worker 'w0' \(replica 0, shard 0, rank 0\) died in iteration 3 "
     r"\(killed, or exited without reporting\); mpiexec ended the job with status 9; the checkpoint of iteration 1"),
    ({}, 13, 3, r"emgrid: fit failed: an MPI rank died before the fit started .* with status 13; the checkpoint"),
], ids=["reported", "reported-failure", "clean", "judged-by-rank-1", "died", "died-unwatched"])
def test_the_mpi_launcher_reports_what_the_ranks_recorded(tmp_path, capsys, files, status, code, line):
    from emgrid.models import Gaussian

    from tests.executors.plans import grid_plan

    plan = grid_plan(Gaussian(0.0, 1.0), 100, 2, 1)
    write_checkpoint(tmp_path / "out", 1, Gaussian(0.0, 1.0), [-1.0])
    script = STAND_IN.format(env=RECORD_ENV, files=files, watch="pid.0" in files, status=status)
    assert launch([sys.executable, "-c", script], plan, tmp_path / "out", max_iter=8) == code
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("emgrid:")]
    if line is None:
        assert said == []
    else:
        assert len(said) == 1 and re.match(line, said[0]), said
