"""Peak resident memory of a worker, measured the way the plan predicts it.

The plan's memory model (``planner.costing``, ``plan.per_worker[i].memory_bytes``) counts
what a worker holds *for the fit*: its rows of data, one block of working arrays, the
exchanged log densities and the parameters and statistics. It does not count the Python
interpreter, numpy and the other imported modules, which every worker pays alike
(about 30-60 MiB here) whatever it fits. So a worker reports its peak resident memory
*above its baseline*: the resident set size (``VmRSS``) when its meter starts, after the
imports and before it opens its rows.

How: on Linux, writing ``5`` to ``/proc/self/clear_refs`` resets the process's peak RSS
(``VmHWM``, which ``getrusage``'s ``ru_maxrss`` also reads) to its current RSS; the peak
above the baseline is then ``VmHWM - baseline``, exact to the page and without sampling.
Where ``/proc`` is unavailable the peak falls back to ``ru_maxrss - baseline`` (which can
read high when an earlier peak of the process was larger).

What the baseline holds, per executor:

- ``multiprocessing``: each worker process starts its meter (after :func:`warm_up`) before
  it opens its rows of the ``.npy`` files, so the increase holds its rows (mapped file pages
  count in RSS once read; vectors are read into memory column-major), its working arrays,
  parameters and statistics: the plan's terms.
- ``mpi``: each rank starts its meter when the fit starts. Rows the rank already holds in
  memory (an in-memory dataset every rank loaded before calling ``optimize``) are in its
  baseline, not in the increase; pass an :class:`executors.NpyDataset` to have each rank
  map only its own rows, which then count as under ``multiprocessing``.
- ``local``: the calling process, one meter for the whole grid, started when the fit
  starts (without the warm-up: the caller has usually run numpy already, and the local
  executor's figure is informative only); the caller's arrays are in the baseline (the
  grid holds views of them).

Starting a meter first returns the allocator's free pages to the kernel
(:func:`release_free_memory`), so that a process that ran fits before measures the next
one from what it holds. Side effect: starting a meter resets the calling process's peak-RSS mark, so after a fit
``ru_maxrss`` of an MPI rank or of a process running the local executor reads the peak
since the fit started.
"""

from __future__ import annotations

import os
from contextlib import suppress

from emgrid.models.units import BLOCK_BYTES

_STATUS = "/proc/self/status"
_READ = 16384


def _field_kb(text: bytes, name: bytes) -> int | None:
    """The value of the ``name:   <n> kB`` line of ``/proc/self/status``, or None."""
    at = text.find(b"\n" + name + b":")
    if at < 0:
        return None
    end = text.find(b"\n", at + 1)
    parts = text[at + len(name) + 2 : end if end >= 0 else len(text)].split()
    return int(parts[0]) if len(parts) == 2 and parts[1] == b"kB" and parts[0].isdigit() else None


def _status() -> dict[str, int] | None:
    """``{"VmRSS": bytes, "VmHWM": bytes}`` from /proc, or None where there is no /proc.
    Read with one ``os.read`` and parsed as bytes: it runs every iteration on every worker,
    and a buffered text file with a regular expression took twice as long as the kernel's part."""
    try:
        fd = os.open(_STATUS, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = chunk = os.read(fd, _READ)
        while len(chunk) == _READ:  # the file is 1-2 KiB: one read holds it
            chunk = os.read(fd, _READ)
            text += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    rss, hwm = _field_kb(text, b"VmRSS"), _field_kb(text, b"VmHWM")
    return None if rss is None or hwm is None else {"VmRSS": rss * 1024, "VmHWM": hwm * 1024}


def _maxrss_bytes() -> int:
    import resource
    import sys

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def rss_bytes() -> int:
    """Current resident set size of this process (bytes)."""
    st = _status()
    return st["VmRSS"] if st else _maxrss_bytes()


def reset_peak() -> bool:
    """Resets this process's peak RSS to its current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


_LIBC = None


def _libc():
    """glibc (loaded once), or None where there is none (its malloc calls are then skipped)."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            _LIBC = libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else False
        except OSError:
            _LIBC = False
    return _LIBC or None


def release_free_memory() -> None:
    """Hands the allocator's free heap pages back to the kernel (glibc's ``malloc_trim``), so
    that a process that has run fits before (an MPI rank, a caller of the local executor)
    starts its meter from what it really holds: without it, the next fit reuses free pages
    that are already resident and its increase reads too low. (No garbage collection: it
    took 10-40 ms in a busy process, and numpy arrays are freed by reference counting.)"""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


#: glibc's ``mallopt`` parameters: the free memory at the heap's top that ``free`` hands back
#: to the kernel, and the size from which blocks are mapped on their own
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: The environment variables that set them when a process starts (Dask's nanny starts its
#: workers with ``MALLOC_TRIM_THRESHOLD_=65536``), and glibc's value of both by default
_MALLOC_ENV = {M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_", M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_"}
GLIBC_THRESHOLD = 128 << 10
#: Blocks of this size or more that the heap's free memory cannot hold are mapped on their
#: own and unmapped when freed (what a cell sets, :func:`tune_allocator`): tables of
#: parameters and statistics, received messages, not a block's working arrays.
LARGE_BLOCK_BYTES = 4 << 20
#: The free memory a cell's heap keeps at its top (what ``free`` does not hand back to the
#: kernel): several blocks' working arrays (``models.units.BLOCK_BYTES`` each by the plan; a
#: block's numpy temporaries, or a block of ``MIN_BLOCK_ROWS`` wide rows, can exceed it).
KEPT_HEAP_BYTES = 8 * BLOCK_BYTES


def tune_allocator() -> None:
    """Sets glibc's allocator of a process while it holds a grid cell: a block of
    :data:`LARGE_BLOCK_BYTES` or more is mapped on its own (and unmapped when freed) unless
    the heap's free memory holds it, smaller ones come from the heap, whose free top is
    handed back to the kernel beyond :data:`KEPT_HEAP_BYTES`.

    By default glibc raises the mapping threshold to the size of the largest block freed so
    far, so once a worker frees its first parameter table the next ones come from the heap,
    and the holes an M-step leaves when it replaces them stay resident (4 MPI ranks holding
    16 MB of categorical tables each peaked at 4.1-4.6 tables' worth by default, 3.9-4.0 with
    this). Fixing the mapping threshold also fixes the trimming one, at 128 KiB unless set,
    and a threshold below a block's working arrays hands them back at the end of each block
    and faults them in again at the next: 2.7x the CPU time of a full-covariance block's
    features at 128 KiB (a Dask worker's ``MALLOC_TRIM_THRESHOLD_=65536`` does the same), and
    at 8 MiB 30,000 page faults and 3x the time of an E-step over 500,000 rows of a mixture of
    4 records, whose blocks hold 9 MB. A cell still hands the heap back whole before each
    pass (:func:`release_free_memory`), so what it keeps never outlasts an iteration, unless
    its plan holds too little beyond a worker's base for that to matter
    (``WorkerSpec.trims``, ``executors.step.TRIM_MIN_BYTES``).
    :func:`restore_allocator` gives a process that lives on the settings its environment
    asked for."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, KEPT_HEAP_BYTES)


def restore_allocator() -> None:
    """Sets back what this process's environment told glibc (the thresholds of ``MALLOC_*_``
    variables, glibc's 128 KiB where only the other is set) when a cell leaves a process that
    lives on (a Dask worker's); without such variables the cell's settings stay (glibc's
    own adjustment, once turned off, cannot be turned back on)."""
    libc = _libc()
    told = {param: os.environ.get(name) for param, name in _MALLOC_ENV.items()}
    if libc is None or not any(told.values()):
        return
    for param, value in told.items():
        try:
            libc.mallopt(param, int(value) if value else GLIBC_THRESHOLD)
        except ValueError:
            libc.mallopt(param, GLIBC_THRESHOLD)  # glibc ignores a value it cannot read, too


class PeakMeter:
    """Peak resident memory of this process above the RSS it had when the meter started."""

    __slots__ = ("baseline_bytes", "exact")

    def __init__(self) -> None:
        release_free_memory()
        self.exact = reset_peak() and _status() is not None
        self.baseline_bytes = rss_bytes()

    def peak_bytes(self) -> int:
        """The highest RSS since the meter started, minus the baseline (>= 0)."""
        st = _status() if self.exact else None
        peak = st["VmHWM"] if st else _maxrss_bytes()
        return max(0, peak - self.baseline_bytes)


def warm_up(model) -> None:
    """One E-step of ``model`` on four rows it samples itself, before a worker's meter starts.

    The first E-step of a process pages in code (numpy's and OpenBLAS's kernels, LAPACK for
    full covariances) and fills allocator arenas: about 1-2 MiB that belong to the libraries,
    not to the fit, and that the plan does not count. Every executor calls it under the fit's
    thread limit (:mod:`executors.threads`), so the pages it touches are those of the
    kernels the fit runs, and the BLAS allocates no buffers for threads the fit does not
    use. Best effort: a model that cannot sample skips it.
    """
    import numpy as np

    from emgrid.models.engine import e_step

    with suppress(Exception):  # only a warm-up
        e_step(model, model.prepare(model.sample(4, np.random.default_rng(0))))
