"""BLAS and OpenMP at one thread per worker inside every fit, the caller's setting after.

Every worker writes ``threadpoolctl.threadpool_info()`` inside the fit (the
``EMGRID_THREAD_PROBE`` hook of ``executors.threads``); the environment the tests start
processes with carries no thread variables, so without the limit the BLAS runs one thread
per core, which the controls below check (on a machine with two cores or more).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from emgrid.executors import get, optimize
from emgrid.executors.threads import PROBE_ENV, THREAD_ENV_KEYS
from emgrid.models import n_rows
from emgrid.models.errors import ConfigError

from .plans import grid_plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

needs_two_cores = pytest.mark.skipif(CORES < 2, reason="the BLAS runs one thread anyway on one core")


def blas_threads() -> set[int]:
    """The thread counts of this process's BLAS pools (numpy's, and scipy's once it is loaded)."""
    return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


def probed(folder: Path) -> dict[str, set[int]]:
    """Worker name -> the thread counts of the BLAS pools it reported inside the fit."""
    out = {}
    for f in sorted(folder.glob("*.json")):
        got = json.loads(f.read_text())
        out[got["worker"]] = {p["num_threads"] for p in got["pools"] if p["user_api"] == "blas"}
    return out


@pytest.fixture
def probe(tmp_path, monkeypatch):
    folder = tmp_path / "probe"
    folder.mkdir()
    monkeypatch.setenv(PROBE_ENV, str(folder))
    for key in THREAD_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    return folder


@pytest.fixture(scope="module")
def small(nested):
    model, data = nested
    return model, data, grid_plan(model, n_rows(model.prepare(data)), 2, 1)


def test_the_numpy_here_has_a_blas_that_threadpoolctl_controls():
    assert blas_threads(), threadpool_info()


@needs_two_cores
@pytest.mark.parametrize("caller", [2, 1])
def test_local_runs_one_thread_inside_the_fit_and_restores_the_callers_setting(small, probe, caller):
    model, data, plan = small
    seen = []
    with threadpool_limits(limits=caller):
        optimize(data, model, plan=plan, max_iter=3, tol=0.0,
                 callback=lambda i, ll, so_far: seen.append(blas_threads()))
        after = blas_threads()
    assert seen and all(t == {1} for t in seen)
    assert probed(probe) == {"local": {1}}
    assert after == {caller}


@needs_two_cores
def test_local_with_blas_threads_none_keeps_the_callers_setting(small, probe):
    model, data, plan = small
    seen = []
    with threadpool_limits(limits=2):
        optimize(data, model, plan=plan, executor=get("local", blas_threads=None), max_iter=2, tol=0.0,
                 callback=lambda i, ll, so_far: seen.append(blas_threads()))
    assert seen == [{2}, {2}]


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_every_multiprocessing_worker_and_the_parent_run_one_thread(small, probe, start_method):
    model, data, plan = small
    seen = []
    with threadpool_limits(limits=2):
        optimize(data, model, plan=plan, executor=get("multiprocessing", start_method=start_method),
                 max_iter=3, tol=0.0, callback=lambda i, ll, so_far: seen.append(blas_threads()))
        after = blas_threads()
    assert probed(probe) == {"w0": {1}, "w1": {1}}
    assert seen and all(t == {1} for t in seen)  # the parent's M-step
    assert after == {min(2, CORES)}


@needs_two_cores
@pytest.mark.parametrize("limit,expected", [(2, {2}), (None, {CORES})], ids=["two", "inherit"])
def test_multiprocessing_workers_run_the_threads_asked_for(small, probe, limit, expected):
    model, data, plan = small
    optimize(data, model, plan=plan, executor=get("multiprocessing", blas_threads=limit), max_iter=2, tol=0.0)
    assert probed(probe) == {"w0": expected, "w1": expected}


@pytest.mark.parametrize("kind", ["local", "multiprocessing", "mpi"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_a_bad_blas_threads_is_refused_naming_it(kind, value):
    with pytest.raises(ConfigError, match=r"blas_threads must be .* got " + repr(value).replace(".", r"\.")):
        get(kind, blas_threads=value)


def run_mpi(tmp_path: Path, limit: str) -> tuple[dict, list]:
    folder = tmp_path / f"probe-{limit}"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_KEYS}
    env.update({PROBE_ENV: str(folder),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    out = tmp_path / f"result-{limit}.json"
    proc = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, str(HERE / "mpi_threads_script.py"), str(out),
                           limit], capture_output=True, text=True, timeout=120, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return probed(folder), json.loads(out.read_text())


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
@needs_two_cores
def test_every_mpi_rank_runs_one_thread_inside_the_fit_and_its_own_setting_after(tmp_path):
    inside, ranks = run_mpi(tmp_path, "1")
    assert inside == {"w0": {1}, "w1": {1}}
    assert [set(r["before"]) for r in ranks] == [{CORES}, {CORES}]  # the control: unlimited outside the fit
    assert [r["after"] for r in ranks] == [r["before"] for r in ranks]
    inside, _ = run_mpi(tmp_path, "inherit")
    assert inside == {"w0": {CORES}, "w1": {CORES}}


LATE_LOAD_SCRIPT = r"""
import ctypes, json, sys
from threadpoolctl import threadpool_info
from emgrid.executors.threads import limited

def blas():
    return {p["filepath"]: p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}

with limited(1):  # lists the pools of this process: numpy's BLAS only
    first = blas()
ctypes.CDLL(sys.argv[1])  # a second BLAS, loaded without importing any module
with limited(1):
    inside = blas()
print(json.dumps({"first": first, "inside": inside, "after": blas()}))
"""


def _scipy_blas() -> str | None:
    """scipy's own OpenBLAS (a library numpy does not load), found without importing scipy."""
    import importlib.util

    spec = importlib.util.find_spec("scipy")
    if spec is None or spec.origin is None:
        return None
    found = sorted((Path(spec.origin).parent.parent / "scipy.libs").glob("libscipy_openblas*.so"))
    return str(found[0]) if found else None


@needs_two_cores
@pytest.mark.skipif(_scipy_blas() is None, reason="no second OpenBLAS to load")
def test_a_blas_loaded_after_an_earlier_fit_is_limited_in_the_next_one():
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_KEYS}
    proc = subprocess.run([sys.executable, "-c", LATE_LOAD_SCRIPT, _scipy_blas()], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout)
    late = set(got["inside"]) - set(got["first"])
    assert late, got  # the control: the library was not there at the first fit
    assert set(got["inside"].values()) == {1}
    assert {got["after"][lib] for lib in late} == {CORES}  # its own setting back after the fit


def test_the_pools_are_kept_while_no_library_loads():
    from emgrid.executors.threads import _LOADS, controller

    if _LOADS() is None:
        pytest.skip("this loader does not count its loads: the pools are listed on every fit")
    first = controller()
    assert controller() is first
