"""A worker that raises, dies, hangs or poisons its statistics stops the fit in bounded time.

Faults are injected with the ``EMGRID_FAULT`` testing hook (``executors.faults``), which
reaches spawned worker processes and ``mpiexec`` ranks through the environment. Every case
runs under a deadline (SIGALRM in this process, ``timeout=`` for subprocesses), so a hang
fails the test instead of stalling the suite. The model runs in three row blocks, so a
fault at ``block=1`` strikes between two coupling exchanges of a model-parallel replica.
A hung MPI rank is found by the MPI executor's ``timeout_s`` (the timed transport), which
names it and aborts the job; the hang itself lasts ten minutes, far past every deadline. A
dead MPI rank ends the job by ``mpiexec``, or by its peers on the host, which look at its
process while they wait, name it and abort the job.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emgrid.executors import get, optimize
from emgrid.executors.faults import ENV, Fault, parse
from emgrid.models.errors import ConfigError, FitError

from .fault_models import ROWS, blocky_data, blocky_model
from .plans import grid_plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
DEADLINE_S = 120  # generous: the machine has two shared cores


@contextlib.contextmanager
def deadline(seconds: float = DEADLINE_S):
    """Raises TimeoutError in this (the main) thread if the block runs longer than ``seconds``."""
    def expire(signum, frame):
        raise TimeoutError(f"no result within {seconds} s: the fit hangs")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def blocky():
    model = blocky_model()
    return model, blocky_data(model)


def fit(blocky, fault: str, monkeypatch, *, grid=(1, 2), executor="multiprocessing", max_iter=4):
    model, data = blocky
    monkeypatch.setenv(ENV, fault)
    with deadline():
        return optimize(data, model, plan=grid_plan(model, ROWS, *grid), executor=executor, max_iter=max_iter,
                        tol=0.0)


# ---------------------------------------------------------------- the hook itself
def test_the_hook_parses_and_refuses_nonsense():
    assert parse("raise:worker=w1:iteration=2;exit:code=13") == (
        Fault("raise", worker="w1", iteration=2), Fault("exit", code=13))
    assert Fault("kill", worker="3").targets("w9", 3) and not Fault("kill", worker="w1").targets("w0", 0)
    for bad, words in [("explode", "unknown fault kind"), ("raise:worker", "key=value"),
                       ("raise:iteration=two", "iteration must be a number"), ("raise:colour=red", "key=value")]:
        with pytest.raises(ConfigError, match=words):
            parse(bad)


# ---------------------------------------------------------------- multiprocessing
def test_a_worker_raising_mid_exchange_is_named_with_the_iteration(blocky, monkeypatch):
    t0 = time.perf_counter()
    with pytest.raises(FitError, match=r"^worker 'w1' \(replica 0, shard 1, pid \d+\) failed in iteration 2: "
                                       r".*InjectedFault: injected fault") as info:
        fit(blocky, "raise:worker=w1:iteration=2:block=1", monkeypatch)
    assert "\n" not in str(info.value)  # one line; the worker's traceback is a note
    assert any("faults.py" in note for note in info.value.__notes__)
    assert time.perf_counter() - t0 < 60
    assert not multiprocessing.active_children()


def test_a_worker_killed_mid_exchange_is_named_not_its_waiting_peer(blocky, monkeypatch):
    # w1 waits on w0's pipe when w0 dies and reports the lost pipe; the parent names w0
    with pytest.raises(FitError, match=r"^worker 'w0' \(replica 0, shard 0, pid \d+\) was killed by signal 9 "
                                       r"in iteration 3$"):
        fit(blocky, "kill:worker=w0:iteration=3:block=1", monkeypatch)
    assert not multiprocessing.active_children()


def test_a_worker_exiting_is_named_with_its_exit_code(blocky, monkeypatch):
    with pytest.raises(FitError, match=r"^worker 'w1' \(replica 1, shard 0, pid \d+\) exited with code 13 "
                                       r"in iteration 2$"):
        fit(blocky, "exit:worker=1:iteration=2:code=13", monkeypatch, grid=(2, 1))
    assert not multiprocessing.active_children()


def test_a_hung_worker_hits_the_executor_timeout_and_is_terminated(blocky, monkeypatch):
    model, data = blocky
    monkeypatch.setenv(ENV, "hang:worker=w1:iteration=2:seconds=600")
    t0 = time.perf_counter()
    with deadline(), pytest.raises(FitError, match=r"no answer within 3 s in iteration 2 from worker 'w1'"):
        optimize(data, model, plan=grid_plan(model, ROWS, 2, 1), executor=get("multiprocessing", timeout_s=3.0),
                 max_iter=4, tol=0.0)
    assert time.perf_counter() - t0 < 60
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("executor", ["local", "multiprocessing"])
def test_a_nan_in_a_workers_statistics_stops_the_fit_naming_the_node(blocky, monkeypatch, executor):
    with pytest.raises(FitError, match=r"^iteration 2: the statistics of node '0\.0\.1' \(Gaussian\) are not finite"):
        fit(blocky, "nan:worker=w1:iteration=2:node=0.0.1", monkeypatch, executor=executor)


def test_a_fault_for_a_later_iteration_leaves_earlier_ones_alone(blocky, monkeypatch):
    res = fit(blocky, "raise:worker=w1:iteration=9", monkeypatch, max_iter=3)
    assert res.iterations == 3
    assert set(res.worker_peak_bytes) == {"w0", "w1"}


# ---------------------------------------------------------------- MPI
def test_an_mpi_rank_raising_on_comm_self_raises_fit_error_naming_it(blocky, monkeypatch):
    mpi = pytest.importorskip("mpi4py.MPI")
    with pytest.raises(FitError, match=r"^worker 'w0' \(replica 0, shard 0, rank 0, pid \d+\) failed in iteration 2: "
                                       r".*InjectedFault"):
        fit(blocky, "raise:worker=w0:iteration=2:block=1", monkeypatch, grid=(1, 1),
            executor=get("mpi", comm=mpi.COMM_SELF))


def test_the_mpi_executor_takes_the_multiprocessing_timeout_options():
    pytest.importorskip("mpi4py.MPI")
    ex = get("mpi", timeout_s=2.5, startup_timeout_s=30.0)
    assert (ex.timeout_s, ex.startup_timeout_s) == (2.5, 30.0)
    assert get("mpi").timeout_s is None  # as multiprocessing: no limit unless asked
    for bad in (0, -1.0):
        with pytest.raises(ConfigError, match="timeout_s must be > 0 or None"):
            get("mpi", timeout_s=bad)


def test_the_timed_mpi_transport_on_comm_self_gives_the_local_trace_and_names_a_raising_rank(blocky, monkeypatch):
    # one rank: nothing to send, but the timed transport's barriers, deadlines and failure path run
    mpi = pytest.importorskip("mpi4py.MPI")
    model, data = blocky
    plan = grid_plan(model, ROWS, 1, 1)
    with deadline():
        timed = optimize(data, model, plan=plan, executor=get("mpi", comm=mpi.COMM_SELF, timeout_s=30.0), max_iter=3,
                         tol=0.0)
    local = optimize(data, model, plan=plan, max_iter=3, tol=0.0)
    assert timed.log_likelihood == local.log_likelihood
    with pytest.raises(FitError, match=r"^worker 'w0' \(replica 0, shard 0, rank 0, pid \d+\) failed in iteration 2: "
                                       r".*InjectedFault"):
        fit(blocky, "raise:worker=w0:iteration=2:block=1", monkeypatch, grid=(1, 1),
            executor=get("mpi", comm=mpi.COMM_SELF, timeout_s=30.0))


needs_mpiexec = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")


def run_mpi(fault: str, d: int, m: int, ranks: int = 2, timeout_s: float | None = None,
            deadline_s: float = DEADLINE_S,
            hide_death_of: int | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """``mpi_fault_script.py`` under ``mpiexec`` with ``fault``; ``hide_death_of``: the rank
    whose death ``mpiexec`` is kept from seeing (the script's ``HIDE_DEATH_OF``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", **{ENV: fault})
    env.pop("HIDE_DEATH_OF", None)
    if hide_death_of is not None:
        env["HIDE_DEATH_OF"] = str(hide_death_of)
    cmd = [str(MPIEXEC), "-n", str(ranks), sys.executable, str(HERE / "mpi_fault_script.py"), str(d), str(m)]
    if timeout_s is not None:
        cmd.append(str(timeout_s))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT))
    try:
        out, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        # a hang fails the test, saying what each process of the job was doing then
        job = _descendants(proc.pid)
        states = "\n".join(_describe(pid) for pid in [proc.pid, *job])
        proc.kill()  # hydra's proxy ends its ranks when mpiexec dies
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # ranks still holding the pipes: end them too
            for pid in job:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"mpiexec did not end within {deadline_s} s; its processes then (pid state wchan command):\n"
                    f"{states}\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.perf_counter() - t0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
                found += kids
                todo += kids
    return found


def _describe(pid: int) -> str:
    def read(name: str) -> str:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return "?"

    state = read("stat").rpartition(")")[2].split()[:1]
    return f"{pid} {state[0] if state else '?'} {read('wchan')} {read('cmdline').replace(chr(0), ' ').strip()}"


def fit_errors(proc) -> dict[int, str]:
    # hydra may still glue two ranks' lines together: split at every marker
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"FITERROR (\d+): (.*?)(?=FITERROR|\n|$)", proc.stdout)}


@needs_mpiexec
@pytest.mark.parametrize("fault,grid,expected", [
    ("raise:worker=w1:iteration=2:block=1", (1, 2),
     r"worker 'w1' \(replica 0, shard 1, rank 1, pid \d+\) failed in iteration 2: .*InjectedFault"),
    ("raise:worker=w0:iteration=3", (2, 1),
     r"worker 'w0' \(replica 0, shard 0, rank 0, pid \d+\) failed in iteration 3: .*InjectedFault"),
    ("nan:worker=w1:iteration=2:node=1", (2, 1),
     r"iteration 2: the statistics of node '1' \(Poisson\) are not finite"),
], ids=["raise-mid-exchange", "raise-on-the-coordinator", "nan"])
def test_an_mpi_rank_that_fails_makes_every_rank_raise_the_same_fit_error(fault, grid, expected):
    proc, _ = run_mpi(fault, *grid)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = fit_errors(proc)
    assert sorted(errors) == [0, 1], proc.stdout + proc.stderr
    assert errors[0] == errors[1]
    assert re.match(expected, errors[0]), errors[0]


@needs_mpiexec
@pytest.mark.parametrize("fault", ["kill:worker=w1:iteration=2:block=1", "exit:worker=w1:iteration=2:code=13"],
                         ids=["killed", "exits"])
def test_an_mpi_rank_that_dies_ends_the_job_non_zero(fault):
    from emgrid.executors.mpi import ABORT_STATUS

    proc, _ = run_mpi(fault, 1, 2)  # run_mpi's timeout= bounds the wait: a hang fails the test
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "DONE" not in out
    pid = re.search(r"RANK 1 PID (\d+)", proc.stdout)
    errors = fit_errors(proc)
    if errors:  # rank 0 found rank 1's process gone first: it names it (and aborts the job)
        assert sorted(errors) == [0], out
        named = re.fullmatch(r"worker 'w1' \(replica 0, shard 1, rank 1, pid (\d+)\) died in iteration 2", errors[0])
        assert named, out
        assert pid is None or named.group(1) == pid.group(1), out
    if proc.returncode == ABORT_STATUS:  # rank 0's abort ended the job before hydra did
        assert errors, out
    elif fault.startswith("exit"):
        # hydra passes on the dead rank's exit code, or (about one run in sixty here) the
        # signal with which it then killed the other rank
        assert proc.returncode in (13, 9), out
        assert "exits with code 13" in out, out
    else:
        assert "BAD TERMINATION" in out and "signal 9" in out, out
        if pid:  # hydra names the dead process by pid: it is rank 1's
            assert f"PID {pid.group(1)} " in out, out


@needs_mpiexec
@pytest.mark.parametrize("fault,grid,dead,judge,expected", [
    ("exit:worker=w1:iteration=2:block=1:code=13", (1, 2), 1, 0,
     r"worker 'w1' \(replica 0, shard 1, rank 1, pid (\d+)\) died in iteration 2"),
    ("exit:worker=w1:iteration=2:code=13", (2, 1), 1, 0,
     r"worker 'w1' \(replica 1, shard 0, rank 1, pid (\d+)\) died in iteration 2"),
    ("exit:worker=w0:iteration=2:code=13", (2, 1), 0, 1,
     r"worker 'w0' \(replica 0, shard 0, rank 0, pid (\d+)\) died in iteration 2"),
], ids=["worker-mid-exchange", "worker", "coordinator"])
def test_a_dead_mpi_rank_that_mpiexec_misses_is_named_by_its_peer_which_aborts_the_job(fault, grid, dead, judge,
                                                                                     expected):
    # the dead rank's descriptors stay open and it stays unreaped: only the peer's look ends the job
    from emgrid.executors.mpi import ABORT_STATUS

    proc, wall = run_mpi(fault, *grid, deadline_s=60, hide_death_of=dead)
    out = proc.stdout + proc.stderr
    assert proc.returncode == ABORT_STATUS, out
    assert "DONE" not in out
    errors = fit_errors(proc)
    assert sorted(errors) == [judge], out
    named = re.fullmatch(expected, errors[judge])
    assert named, out
    assert named.group(1) == re.search(rf"RANK {dead} PID (\d+)", proc.stdout).group(1)
    assert wall < 30, f"took {wall:.1f} s"


@needs_mpiexec
@pytest.mark.parametrize("fault,grid,timeout_s,judge,expected", [
    ("hang:worker=w1:iteration=2:seconds=600", (2, 1), 2.0, 0,
     r"no answer within 2 s in iteration 2 from worker 'w1' \(replica 1, shard 0, rank 1, pid (\d+)\)$"),
    ("hang:worker=w1:iteration=2:block=1:seconds=600", (1, 2), 2.0, 0,
     r"no answer within 2 s in iteration 2 from worker 'w1' \(replica 0, shard 1, rank 1, pid (\d+)\)$"),
    # the coordinator is a worker too: the other ranks wait 2 * 1.5 + 2 s before they name it
    ("hang:worker=w0:iteration=3:seconds=600", (2, 1), 1.5, 1,
     r"no answer within 5 s in iteration 3 from worker 'w0' \(replica 0, shard 0, rank 0, pid (\d+)\)$"),
], ids=["worker", "worker-mid-exchange", "coordinator"])
def test_a_hung_mpi_rank_hits_the_executor_timeout_and_the_job_is_aborted(fault, grid, timeout_s, judge, expected):
    from emgrid.executors.mpi import ABORT_STATUS

    proc, wall = run_mpi(fault, *grid, timeout_s=timeout_s, deadline_s=60)  # a hang fails the test in 60 s
    out = proc.stdout + proc.stderr
    assert proc.returncode == ABORT_STATUS, out  # the rank that named it aborted the job once it had said so
    assert "DONE" not in out
    errors = fit_errors(proc)
    assert judge in errors, out
    named = re.match(expected, errors[judge])
    assert named, errors[judge]
    hung = 1 - judge
    assert named.group(1) == re.search(rf"RANK {hung} PID (\d+)", proc.stdout).group(1)  # the hung process's pid
    assert wall < 30, f"took {wall:.1f} s"  # the hang lasts 600 s


def test_a_failure_after_the_starts_is_named_by_the_iteration_the_fit_counts(monkeypatch):
    # the starts' refining iterations run on the grid first: its E-step done + 2 is the fit's iteration 2
    import numpy as np

    from emgrid.models import from_spec
    from emgrid.planner import Resources

    data = np.random.default_rng(0).normal(size=300) * np.repeat([1.0, 3.0], 150) + np.repeat([-4.0, 4.0], 150)
    template = from_spec({"family": "Mixture", "k": 2, "component": {"family": "Gaussian"}})

    def run(**kw):
        return optimize(data, template, resources=Resources.uniform(1), executor="multiprocessing", max_iter=5,
                        tol=0.0, n_init=3, init="random", init_iter=3, seed=0, **kw)

    clean = run()
    done = sum(len(t) for t in clean.init_traces)
    assert len(clean.init_traces[0]) >= 2
    for grid_iteration, named in [(done + 2, "in iteration 2: "), (2, "in iteration 2 of start 1/3's refinement: ")]:
        monkeypatch.setenv(ENV, f"raise:iteration={grid_iteration}")
        with deadline(), pytest.raises(FitError, match=r"failed " + re.escape(named)) as info:
            run()
        if grid_iteration != 2:
            assert f"in iteration {grid_iteration}" not in str(info.value)
