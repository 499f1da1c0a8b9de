"""The output folder of a fit: made and checked before any work, locked while a run uses it,
and written only atomically, never through a symlink.

- :meth:`OutputFolder.open` creates the folder (and its parents), proves it writable by
  creating the lock file in it, and takes the lock: ``fcntl.flock`` on ``.emgrid.lock``,
  which holds the holder's pid. A second run into the folder is refused at once naming
  that pid; a lock whose holder died is released by the kernel with the process, so the
  next run takes it over (whatever pid the file still names). The lock file is removed
  when the run ends; a run that starts checks that the file it locked is still the one at
  the path (a run that ended and removed it in between does not leave two holders).
- :func:`write_atomic` writes a temporary file in the folder (``O_CREAT | O_EXCL |
  O_NOFOLLOW``: never an existing file, never a symlink), syncs it and renames it over the
  target: a reader sees the old file or the new one, and a symlink planted at the target
  is replaced, its target left alone.
- Private scratch (``.emgrid-scratch-<pid>``: the multiprocessing executor's copy of the
  data, the MPI launcher's record of its ranks) lives in the folder, so that no end of a run,
  even a SIGKILL, leaves anything in ``/tmp``; the next run that takes the lock removes what
  a dead run left.

Every OSError becomes an :class:`OutputError` (an EmgridError: one line, exit 2, when it
happens before the fit) naming the path and the reason.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

from emgrid.models.errors import ConfigError

LOCK = ".emgrid.lock"
SCRATCH_PREFIX = ".emgrid-scratch-"


class OutputError(ConfigError):
    """The output folder cannot be made, written or locked (one line naming path and reason)."""


def describe_os_error(e: OSError) -> str:
    return e.strerror or type(e).__name__


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Writes ``data`` to ``path`` by a temporary file in its folder and a rename (see the module).
    The temporary file goes whatever stops the write, a signal while it is being opened included."""
    path = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    folder = path.parent
    tmp = None
    try:
        for attempt in range(100):
            tmp = folder / f".{path.name}.{os.getpid()}.{attempt}.tmp"  # named before it exists: see finally
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                break
            except FileExistsError:  # a stale temporary of an earlier process of this pid
                continue
            except OSError as e:
                raise OutputError(f"cannot write {str(path)!r}: {describe_os_error(e)}") from None
        else:  # pragma: no cover - a hundred stale temporaries of this very pid
            tmp = None
            raise OutputError(f"cannot write {str(path)!r}: too many leftover temporary files in {str(folder)!r}")
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _sync_folder(folder)
    except OSError as e:
        raise OutputError(f"cannot write {str(path)!r}: {describe_os_error(e)}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def remove_partial_writes(folder: Path) -> None:
    """Removes the temporary files of :func:`write_atomic` calls a killed process left
    unfinished in ``folder`` (call it only while no writer is at work there)."""
    for entry in folder.glob(".*.tmp"):
        try:
            entry.unlink()
        except OSError:
            pass


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputFolder:
    """A fit's output folder, locked by this process while it is open (see the module)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._scratch: list[Path] = []
        self._created = False

    @classmethod
    def open(cls, path) -> "OutputFolder":
        folder = cls(Path(path))
        folder._make()
        folder._lock()
        return folder

    # ------------------------------------------------------------ setting up
    def _make(self) -> None:
        p = self.path
        self._created = not p.exists()
        try:
            p.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise OutputError(f"output {str(p)!r} exists and is not a folder") from None
        except NotADirectoryError:
            raise OutputError(f"output {str(p)!r} cannot be made: a part of the path is a file, not a folder") from None
        except OSError as e:
            raise OutputError(f"output folder {str(p)!r} cannot be made: {describe_os_error(e)}") from None
        if not p.is_dir():
            raise OutputError(f"output {str(p)!r} exists and is not a folder")

    def _lock(self) -> None:
        path = self.path / LOCK
        for _ in range(20):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise OutputError(f"output folder {str(self.path)!r}: {LOCK} is a symlink; remove it") from None
                raise OutputError(f"output folder {str(self.path)!r} is not writable: {describe_os_error(e)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputError(f"output folder {str(self.path)!r} is in use by another emgrid run ({holder}); "
                                  "wait for it to end or choose another output") from None
            except OSError as e:
                os.close(fd)
                raise OutputError(f"output folder {str(self.path)!r} cannot be locked: {describe_os_error(e)}") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the run that held it ended and removed the file in between: lock the new one
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.time():.0f}\n".encode(), 0)
            except OSError as e:
                os.close(fd)
                raise OutputError(f"output folder {str(self.path)!r} is not writable: {describe_os_error(e)}") from None
            self._fd = fd
            self._clear_dead_scratch()
            return
        raise OutputError(f"output folder {str(self.path)!r}: its lock keeps changing hands")  # pragma: no cover

    def _clear_dead_scratch(self) -> None:
        """Scratch folders of runs that died (this process holds the lock: none is in use)."""
        for entry in self.path.glob(SCRATCH_PREFIX + "*"):
            shutil.rmtree(entry, ignore_errors=True)
        remove_partial_writes(self.path)

    # ------------------------------------------------------------ while running
    def scratch(self, what: str) -> Path:
        """A private folder for this run, removed by :meth:`close` (or by the next run)."""
        d = self.path / f"{SCRATCH_PREFIX}{os.getpid()}-{what}"
        try:
            d.mkdir()
        except FileExistsError:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
        except OSError as e:
            raise OutputError(f"cannot make scratch folder {str(d)!r}: {describe_os_error(e)}") from None
        self._scratch.append(d)
        return d

    def write(self, name: str, data: bytes | str) -> Path:
        return write_atomic(self.path / name, data)

    def close(self) -> None:
        for d in self._scratch:
            shutil.rmtree(d, ignore_errors=True)
        self._scratch = []
        if self._fd is not None:
            try:
                os.unlink(self.path / LOCK)
            except OSError:
                pass
            os.close(self._fd)  # releases the flock
            self._fd = None
            if self._created:  # a run that wrote nothing leaves no folder behind
                try:
                    self.path.rmdir()
                except OSError:
                    pass

    def __enter__(self) -> "OutputFolder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").split()
        pid = int(text[0])
    except (OSError, ValueError, IndexError):
        return "its pid is not recorded yet"
    host = text[1] if len(text) > 1 else "?"
    since = ""
    if len(text) > 2 and text[2].isdigit():
        since = f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(int(text[2])))}"
    alive = "" if host != socket.gethostname() or _pid_alive(pid) else ", not running"
    return f"pid {pid} on {host}{since}{alive}"
