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

Finding the loaded pools means listing every shared library of the process (``threadpoolctl``
reads ``/proc/self/maps``: about 4 ms once scikit-learn and scipy are loaded), so the list is
kept (:func:`controller`) until the dynamic loader reports that a library was loaded or
unloaded since (glibc's ``dl_iterate_phdr`` counters, one call of a few microseconds); where
those counters cannot be read, every fit lists the libraries again.

A testing hook, as :mod:`executors.faults`: when ``EMGRID_THREAD_PROBE`` names a folder,
every worker writes ``threadpoolctl.threadpool_info()`` there once it holds its rows, inside
the fit, as ``<worker>.<pid>.json``. Unset (the normal case), it costs one lookup per worker.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
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
def patched(mapping, values: dict) -> Iterator[None]:
    """``mapping`` updated with ``values`` inside the block, as it was after (a key it lacked
    removed again)."""
    missing = object()
    saved = {k: mapping.get(k, missing) for k in values}
    mapping.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is missing:
                mapping.pop(k, None)
            else:
                mapping[k] = v


def environment(values: dict[str, str]):
    """``os.environ`` updated with ``values`` inside the block (for the processes it starts)."""
    return patched(os.environ, values)


@contextmanager
def limited(n: int | None) -> Iterator[None]:
    """Every loaded BLAS and OpenMP pool of this process at ``n`` threads inside the block;
    the setting before it is restored after. ``None``: nothing changes."""
    if n is None:
        yield
        return
    with controller().limit(limits=n):
        yield


class _PhdrInfo(ctypes.Structure):
    """The head of glibc's ``struct dl_phdr_info`` up to its load counters."""

    _fields_ = [("dlpi_addr", ctypes.c_void_p), ("dlpi_name", ctypes.c_char_p), ("dlpi_phdr", ctypes.c_void_p),
                ("dlpi_phnum", ctypes.c_uint16), ("dlpi_adds", ctypes.c_ulonglong), ("dlpi_subs", ctypes.c_ulonglong)]


_PHDR_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t, ctypes.c_void_p)


class _LoadCounter:
    """How many shared libraries the dynamic loader has loaded and unloaded in this process
    (``dlpi_adds``, ``dlpi_subs`` of ``dl_iterate_phdr``), read from its first object only.

    The call keeps the GIL (``ctypes.PyDLL``): the callback then never waits for it while
    the loader's lock is held, the deadlock that makes ``threadpoolctl`` avoid
    ``dl_iterate_phdr`` with the GIL released."""

    def __init__(self) -> None:
        self.seen: tuple[int, int] | None = None
        self.iterate = None
        self.callback = _PHDR_CALLBACK(self._first)
        if sys.platform.startswith("linux"):
            try:
                self.iterate = ctypes.PyDLL(None).dl_iterate_phdr
                self.iterate.argtypes = [_PHDR_CALLBACK, ctypes.c_void_p]
                self.iterate.restype = ctypes.c_int
            except (OSError, AttributeError):
                self.iterate = None

    def _first(self, info, size, data) -> int:
        # a loader whose structure ends before the counters (not glibc's) reports none
        if size >= ctypes.sizeof(_PhdrInfo):
            self.seen = (int(info.contents.dlpi_adds), int(info.contents.dlpi_subs))
        return 1  # the first object is enough: the counters are the process's

    def __call__(self) -> tuple[int, int] | None:
        """``(loaded, unloaded)`` so far, or None where the loader does not count them."""
        if self.iterate is None:
            return None
        self.seen = None
        self.iterate(self.callback, None)
        return self.seen


_LOADS = _LoadCounter()
_CACHED: tuple[tuple[int, int] | None, object] | None = None
_CACHE_LOCK = threading.Lock()


def _new_lock_after_fork() -> None:
    # a process forked while another thread listed the libraries must not inherit the lock held
    global _CACHE_LOCK
    _CACHE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def controller():
    """A ``threadpoolctl.ThreadpoolController`` of every pool loaded now. Kept between calls
    while no shared library was loaded or unloaded (a BLAS or OpenMP runtime that a later
    import or ``ctypes`` load brings in is found on the next call; an unloaded one is never
    called); listed again on every call where the loader does not count its loads. The
    controller holds no thread counts: each ``limit`` reads the current ones."""
    global _CACHED
    from threadpoolctl import ThreadpoolController

    with _CACHE_LOCK:
        key = _LOADS()
        if key is None or _CACHED is None or _CACHED[0] != key:
            _CACHED = (key, ThreadpoolController())
        return _CACHED[1]


def probe(worker: str) -> None:
    """Writes this process's pools (``threadpoolctl.threadpool_info()``) to
    ``$EMGRID_THREAD_PROBE/<worker>.<pid>.json`` when set."""
    folder = os.environ.get(PROBE_ENV)
    if not folder:
        return
    from threadpoolctl import threadpool_info

    path = Path(folder) / f"{worker}.{os.getpid()}.json"
    path.write_text(json.dumps({"worker": worker, "pid": os.getpid(), "pools": threadpool_info()}))
