"""Signals and leaks, each in a process of its own: Ctrl-C or SIGTERM in the middle of a fit on
any executor writes the checkpoint of the last finished iteration and exits 130 or 143 with one
line, and ``--resume`` then gives the uninterrupted trace; the MPI launcher stops its job
cleanly, or kills it, and no rank outlives it; a local fit never starts MPI; nothing is left in
the output folder but what the run wrote, nor in ``/dev/shm``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emgrid.cli.checkpoint import checkpoint_files, read_checkpoint
from emgrid.cli.main import main
from emgrid.cli.outdir import MANIFEST

CONFIG = """
[model]
inline = {{ family = "Mixture", weights = [0.5, 0.5], components = [
  {{ family = "Gaussian", mean = -1.0, var = 1.0 }}, {{ family = "Gaussian", mean = 1.0, var = 1.0 }} ] }}
[data]
synthetic = {rows}
truth = {{ family = "Mixture", weights = [0.3, 0.7], components = [
  {{ family = "Gaussian", mean = -0.6, var = 1.0 }}, {{ family = "Gaussian", mean = 0.4, var = 1.0 }} ] }}
[resources]
workers = 2
latency_s = 1e-9
bytes_per_s = 1e12
[executor]
kind = "{kind}"
[fit]
max_iter = 100000
tol = 0.0
checkpoint_every = 1
output = "out"
"""
# The truth's components overlap, so EM creeps for thousands of iterations (well-separated ones
# converge in 15, which a fast machine finishes before the signal arrives).
MPIEXEC = Path(sys.executable).with_name("mpiexec")
needs_mpiexec = pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec next to python")


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_fit_outlives_its_test():
    """A test that fails before its fit ended does not leave the fit running (it would load the
    machine for every test after it)."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def _default_sigint():
    # SIGINT as a terminal's fit has it: a suite started in the background of a shell without
    # job control inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(tmp_path, kind, rows=100_000, env=None):
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG.format(kind=kind, rows=rows))
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", **(env or {}))
    full_env.pop("EMGRID_FAULT", None)
    proc = subprocess.Popen([sys.executable, "-m", "emgrid.cli.main", "fit", str(cfg), "--quiet"], cwd=tmp_path,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    STARTED.append(proc)
    return cfg, proc


def wait_for_checkpoint(out: Path, proc, at_least: int = 2, timeout: float = 90.0) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()
        try:
            it = read_checkpoint(out)[0]
            if it >= at_least:
                return it
        except Exception:  # noqa: BLE001 - not written yet
            pass
        time.sleep(0.1)
    raise AssertionError("no checkpoint in time")


def descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = {int(k) for k in f.read().split()}
                out |= kids
                todo.extend(kids)
        except OSError:
            continue
    return out


def alive(pids) -> list[int]:
    living = []
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().split(")")[-1].split()[0] != "Z":
                    living.append(p)
        except OSError:
            pass
    return living


def outlived(pids, within: float = 10.0) -> list[int]:
    """The processes of ``pids`` still alive ``within`` seconds from now (helpers such as
    multiprocessing's resource tracker exit a moment after their parent)."""
    deadline = time.monotonic() + within
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def mpich_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")} if os.path.isdir("/dev/shm") else set()


def emgrid_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("emgrid:")]


def test_a_local_fit_never_imports_mpi(tmp_path):
    (tmp_path / "run.toml").write_text(CONFIG.format(kind="local", rows=2000).replace("max_iter = 100000",
                                                                                     "max_iter = 2"))
    code = ("import sys; from emgrid.cli.main import main; c = main(['fit', 'run.toml', '--quiet']); "
            "print('MPI' if 'mpi4py' in sys.modules else 'no MPI'); sys.exit(c)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "no MPI"


@pytest.mark.parametrize("kind,sig", [("local", signal.SIGINT), ("multiprocessing", signal.SIGTERM)],
                         ids=["local-ctrl-c", "multiprocessing-sigterm"])
def test_a_signal_mid_fit_checkpoints_the_last_iteration_and_resume_equals_the_uninterrupted_fit(
        tmp_path, monkeypatch, capsys, kind, sig):
    cfg, proc = start(tmp_path, kind)
    out = tmp_path / "out"
    seen = wait_for_checkpoint(out, proc)
    workers = descendants(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    lines = emgrid_lines(err)
    assert len(lines) == 1 and re.fullmatch(r"emgrid: interrupted: the checkpoint of iteration (\d+) is in .*out; "
                                            r"continue with --resume", lines[0]), err
    reached, _, trace = read_checkpoint(out)
    assert reached >= seen and int(re.search(r"iteration (\d+)", lines[0]).group(1)) == reached
    # no lock, no scratch copy of the data: the checkpoint only (and its shard files when the plan splits the model)
    assert sorted(p.name for p in out.iterdir()) == sorted(checkpoint_files(out) + [MANIFEST])
    assert outlived(workers) == []

    monkeypatch.chdir(tmp_path)
    target = reached + 2
    assert main(["fit", str(cfg), "--quiet", "--resume", "--max-iter", str(target), "--executor", "local"]) == 1
    resumed = json.loads((out / "report.json").read_text())["log_likelihood"]
    assert main(["fit", str(cfg), "--quiet", "--max-iter", str(target), "--executor", "local",
                 "--output", "whole"]) == 1
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())["log_likelihood"]
    assert resumed[:reached] == trace and len(resumed) == len(whole) == target
    assert all(abs(a - b) <= 1e-9 * abs(b) for a, b in zip(resumed, whole))


def wait_until_stuck(out: Path, pid: int, quiet_s: float = 0.5, timeout: float = 30.0) -> None:
    """Until process ``pid`` is stopped and the job's checkpoint (written every iteration) has
    not moved for ``quiet_s``: the job waits for the stopped rank."""
    def state() -> str:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0]

    def iteration():
        try:
            return read_checkpoint(out)[0]
        except Exception:  # noqa: BLE001 - being replaced
            return None

    end = time.monotonic() + timeout
    while state() not in ("T", "t"):
        assert time.monotonic() < end, f"process {pid} did not stop"
        time.sleep(0.01)
    last, since = iteration(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < end, "the job kept going with a rank stopped"
        time.sleep(0.05)
        now = iteration()
        if now != last:
            last, since = now, time.monotonic()


def _ranks(out: Path) -> list[int]:
    pids = []
    for f in out.glob(".emgrid-scratch-*-mpi/pid.*"):
        try:
            pids.append(int(f.read_text()))
        except ValueError:
            pass
    return pids


@needs_mpiexec
@pytest.mark.parametrize("how", ["sigterm", "launcher-killed", "stopped-rank-then-ctrl-c"])
def test_an_mpi_fit_stops_with_its_launcher_and_no_rank_outlives_it(tmp_path, how):
    shm = mpich_shm()
    # a short grace where the job cannot stop (a stopped rank), the default one where it stops
    # by itself: a loaded machine may take more than 2 s to end the ranks and mpiexec
    grace = "2" if how == "stopped-rank-then-ctrl-c" else "30"
    _, proc = start(tmp_path, "mpi", env={"EMGRID_STOP_GRACE_S": grace})
    out = tmp_path / "out"
    wait_for_checkpoint(out, proc)
    ranks = _ranks(out)
    job = descendants(proc.pid)
    assert len(ranks) == 2 and set(ranks) <= job
    t0 = time.monotonic()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "launcher-killed":
        proc.kill()
    else:
        stopped = ranks[1] if ranks[1] != ranks[0] else ranks[0]
        os.kill(stopped, signal.SIGSTOP)
        wait_until_stuck(out, stopped)  # rank 0 must not finish an iteration and see the stop request
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert outlived(job) == [], "processes of the job outlived the launcher"
    assert mpich_shm() <= shm  # MPICH's segments were unlinked once every rank had started
    lines = emgrid_lines(err)
    if how == "launcher-killed":
        assert proc.returncode == -signal.SIGKILL
        read_checkpoint(out)  # the periodic checkpoint is whole
        return
    assert "Traceback" not in err
    assert len(lines) == 1, err
    if how == "sigterm":
        assert proc.returncode == 143, err
        assert re.fullmatch(r"emgrid: interrupted: the checkpoint of iteration \d+ is in .*out; continue with --resume",
                            lines[0]), err
    else:
        assert proc.returncode == 130, err
        assert took < 20
        assert re.fullmatch(r"emgrid: interrupted: the MPI job did not stop in time and was killed; the checkpoint of "
                            r"iteration \d+ is in .*out: continue with --resume", lines[0]), err
    read_checkpoint(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(checkpoint_files(out) + [MANIFEST])
