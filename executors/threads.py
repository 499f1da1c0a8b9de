"""BLAS and OpenMP threads per worker: one by default, for the duration of a fit.

Several processes on the same cores, each running the BLAS's own pool of threads (one per
core by default), are many times slower than one thread each: two processes with two
OpenBLAS threads on two cores were measured 60x slower. So every executor limits the
thread pools of the libraries loaded in each worker (``threadpoolctl``: OpenBLAS, MKL,
BLIS, OpenMP) to ``blas_threads`` while the fit runs, and restores what was there after:

- ``local``: the calling process, around the fit (the caller's setting comes back after);
- ``multiprocessing``: each worker process from its start (the environment it is spawned
  with, so the libraries start with that many threads, and ``threadpoolctl`` in it), and the
  parent around the fit (its M-step);
- ``mpi``: each rank around the fit.

``blas_threads=None`` leaves every library as the environment and the caller set it.

A testing hook, as :mod:`executors.faults`: when ``EMGRID_THREAD_PROBE`` names a folder,
every worker writes ``threadpoolctl.threadpool_info()`` there once it holds its rows, inside
the fit, as ``<worker>.<pid>.json``. Unset (the normal case), it costs one lookup per worker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from emgrid.models.errors import ConfigError

#: Threads per worker unless asked otherwise.
DEFAULT_BLAS_THREADS = 1
#: The environment variables the common BLAS and OpenMP runtimes read when they load.
THREAD_ENV_KEYS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                   "BLIS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
PROBE_ENV = "EMGRID_THREAD_PROBE"


def check_blas_threads(value) -> int | None:
    """``value`` when it is an integer >= 1 or None; ConfigError naming it otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"blas_threads must be an integer >= 1 or None (leave the libraries as they are), "
                          f"got {value!r}")
    return value


def thread_env(n: int | None) -> dict[str, str]:
    """The environment a worker process starts with so that its libraries load with ``n`` threads."""
    return {} if n is None else {k: str(n) for k in THREAD_ENV_KEYS}


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` inside the block (for the processes it starts)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def limited(n: int | None) -> Iterator[None]:
    """Every loaded BLAS and OpenMP pool of this process at ``n`` threads inside the block;
    the setting before it is restored after. ``None``: nothing changes."""
    if n is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=n):
        yield


def pools() -> list[dict]:
    """``threadpoolctl.threadpool_info()``: every loaded pool and its number of threads."""
    from threadpoolctl import threadpool_info

    return threadpool_info()


def probe(worker: str) -> None:
    """Writes this process's pools to ``$EMGRID_THREAD_PROBE/<worker>.<pid>.json`` when set."""
    folder = os.environ.get(PROBE_ENV)
    if not folder:
        return
    path = Path(folder) / f"{worker}.{os.getpid()}.json"
    path.write_text(json.dumps({"worker": worker, "pid": os.getpid(), "pools": pools()}))
