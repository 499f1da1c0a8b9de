"""Run-tagged scratch folders for the engines a fit starts, removed however the fit ends.

An engine started for one fit (a local Ray instance, a Dask ``LocalCluster``, an ``mpiexec``
job of emgrid's launcher, the multiprocessing executor's copy of the caller's arrays) keeps
its scratch (Ray's ``session_*`` folder, Dask's worker folders, hydra's
``hydra_hwloc_xmlfile_*``, the ``.npy`` copy) in a folder of its own, ``emgrid-<kind>-<random>``
in the system temporary folder, made by :class:`Scratch`. The folder holds an ``owner`` file:
the pid and start time of the process the fit runs in.

When the fit ends, its process removes the folder (:meth:`Scratch.close`). For the ends it
cannot see, ``kill -9`` included, a warden process (:mod:`executors.warden`) kills what still
uses the folder (Ray's agents outlive a killed driver by a minute, waiting on a dead GCS) and
removes it; it runs in a session of its own, so a terminal's Ctrl-C does not reach it.

Were the warden killed too, the next :class:`Scratch` of any kind sweeps the temporary
folder (:func:`sweep`): every ``emgrid-<kind>-*`` folder whose owner is gone is treated so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

from . import warden

#: The kinds of scratch folders (``emgrid-<kind>-*``) that :func:`sweep` may remove.
KINDS = ("ray", "dask", "mpi", "data")
OWNER = warden.OWNER


class Scratch:
    """A run-tagged temporary folder and its warden; a context manager (``close`` on exit).

    ``kind``: one of :data:`KINDS`; ``parent``: where the folder goes (default: the system
    temporary folder). ``kill_at_close``: :meth:`close` also kills the processes that still
    use the folder (an engine whose stop may leave some behind), not only the warden after
    this process died. ``guard=False`` skips the warden process (the folder then goes at
    :meth:`close`, or at the next sweep after a kill).
    """

    def __init__(self, kind: str, parent: str | os.PathLike | None = None, kill_at_close: bool = False,
                 guard: bool = True):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        sweep(parent)
        self.path = Path(tempfile.mkdtemp(prefix=f"emgrid-{kind}-", dir=parent))
        self.kill_at_close = kill_at_close
        me = os.getpid()
        (self.path / OWNER).write_text(f"{me} {warden.start_time(me) or ''}\n")
        self._warden: subprocess.Popen | None = None
        if guard and sys.platform.startswith("linux"):
            self._warden = _start_warden(self.path)

    def close(self) -> None:
        """Removes the folder (after killing what still uses it, with ``kill_at_close``) and
        tells the warden it is done."""
        warden.clear(self.path, os.getpid(), kill=self.kill_at_close)
        w, self._warden = self._warden, None
        if w is not None:
            with suppress(OSError):  # it is gone: nothing left for it to do
                w.stdin.write(warden.DONE)
                w.stdin.close()
            with suppress(subprocess.TimeoutExpired):  # pragma: no cover - it exits at once on DONE
                w.wait(5.0)

    def __enter__(self) -> "Scratch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Scratch({str(self.path)!r})"


def _start_warden(folder: Path) -> subprocess.Popen | None:
    """The warden of ``folder``: ``python -I -S warden.py FOLDER OWNER_PID``, in a session of
    its own, its standard input the pipe whose end it waits for."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", warden.__file__, str(folder), str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd="/", start_new_session=True, close_fds=True)
    except OSError:
        return None  # the sweep of a later run removes the folder instead


def sweep(parent: str | os.PathLike | None = None) -> list[Path]:
    """Removes every ``emgrid-<kind>-*`` scratch folder in ``parent`` (default: the system
    temporary folder) whose owner process is gone, after killing what still holds it;
    returns the folders removed. A folder without a readable ``owner`` file is left alone
    (it is being made, or it is not a scratch folder)."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    removed = []
    try:
        entries = [p for p in parent.iterdir() if any(p.name.startswith(f"emgrid-{k}-") for k in KINDS)]
    except OSError:
        return removed
    for folder in entries:
        try:
            pid, _, started = (folder / OWNER).read_text().strip().partition(" ")
            pid = int(pid)
        except (OSError, ValueError):
            continue
        if warden.alive(pid, started or None):
            continue
        warden.clear(folder, None)
        if not folder.exists():
            removed.append(folder)
    return removed


_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int, parent: int | None = None) -> None:
    """Linux: this process gets ``sig`` when its parent dies (a no-op elsewhere); when the
    process ``parent`` (the fit) is already gone, exits at once. What ties a worker process, or a rank,
    to the fit that started it, so that none outlives a ``kill -9`` of the fit."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and not warden.pid_alive(parent):  # it died before the signal was armed
        os._exit(128 + int(sig))


__all__ = ["Scratch", "sweep", "KINDS", "set_parent_death_signal"]
