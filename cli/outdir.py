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
  is replaced, its target left alone. :func:`atomic_file` does the same for a file written
  by a library that wants a path (``emgrid predict``'s outputs). A temporary file is named
  ``.<name>.<tag>-<n>.tmp``, ``<tag>`` being :data:`RUN_TAG`, this process's own.
- Private scratch (``.emgrid-scratch-<tag>-<what>``: the multiprocessing executor's copy of
  the data, the MPI launcher's record of its ranks) lives in the folder, so that no end of a
  run, even a SIGKILL, leaves anything in ``/tmp``.
- The folder's manifest (``.emgrid-manifest.json``, :class:`Manifest`) lists what emgrid can
  prove it wrote there: the files it wrote (each recorded before it is made) and the tags of
  the runs that may have left temporary files or scratch. emgrid removes nothing else: the
  next run that takes the lock removes the temporary files and scratch of the recorded runs,
  and a write of a sharded model or checkpoint removes the earlier writes' recorded shard
  files; a user's own ``*.tmp`` or ``model.*.shard-*.json`` files stay. A file a run reads
  (its config, model spec, data) is never written over (:func:`refuse_inputs`) nor removed
  (:meth:`Manifest.disown`).

Every OSError becomes an :class:`OutputError` (an EmgridError: one line, exit 2, when it
happens before the fit) naming the path and the reason.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from emgrid.models.errors import ConfigError
from emgrid.executors.warden import pid_alive

LOCK = ".emgrid.lock"
SCRATCH_PREFIX = ".emgrid-scratch-"
MANIFEST = ".emgrid-manifest.json"
#: this process's tag: in the names of its temporary files and scratch folders, and recorded
#: in the manifest of every folder it writes in, so that a later run can prove they are emgrid's
RUN_TAG = secrets.token_hex(4)


class OutputError(ConfigError):
    """The output folder cannot be made, written or locked (one line naming path and reason)."""


def describe_os_error(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _temporary(path: Path, attempt: int) -> Path:
    return path.parent / f".{path.name}.{RUN_TAG}-{attempt}.tmp"


def _open_temporary(path: Path, slot: list) -> int:
    """A new temporary file beside ``path`` (its name put in ``slot`` before it exists, so
    that a signal landing while it is opened still leaves the caller its name to remove)."""
    for attempt in range(100):
        slot[0] = _temporary(path, attempt)
        try:
            return os.open(slot[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:  # a stale temporary of an earlier write of this process
            continue
        except OSError as e:
            raise OutputError(f"cannot write {str(path)!r}: {describe_os_error(e)}") from None
    slot[0] = None  # pragma: no cover - a hundred stale temporaries of this very process
    raise OutputError(f"cannot write {str(path)!r}: too many leftover temporary files in {str(path.parent)!r}")


def _unlink_quietly(path) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except OSError:
            pass


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Writes ``data`` to ``path`` by a temporary file in its folder and a rename (see the module).
    The temporary file goes whatever stops the write, a signal while it is being opened included."""
    path = Path(path)
    blob = data.encode() if isinstance(data, str) else data
    slot: list = [None]
    try:
        fd = _open_temporary(path, slot)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(slot[0], path)
        _sync_folder(path.parent)
    except OSError as e:
        raise OutputError(f"cannot write {str(path)!r}: {describe_os_error(e)}") from None
    finally:
        _unlink_quietly(slot[0])
    return path


@contextlib.contextmanager
def atomic_file(path) -> Iterator[Path]:
    """A temporary file beside ``path`` for the block to write (by its path); when the block
    ends normally it is synced and renamed over ``path``, otherwise (an error, Ctrl-C,
    SIGTERM) removed, ``path`` left as it was."""
    path = Path(path)
    slot: list = [None]
    try:
        os.close(_open_temporary(path, slot))
        yield slot[0]
        try:
            fd = os.open(slot[0], os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(slot[0], path)
        except OSError as e:
            raise OutputError(f"cannot write {str(path)!r}: {describe_os_error(e)}") from None
        _sync_folder(path.parent)
    finally:
        _unlink_quietly(slot[0])


# ---------------------------------------------------------------- what emgrid wrote
class Manifest:
    """What emgrid can prove it wrote in ``folder`` (see the module): ``files`` (names in the
    folder) and ``runs`` (tags of processes whose temporary files or scratch may be there).
    A manifest that cannot be read proves nothing: it reads as empty."""

    def __init__(self, folder: Path, runs: list[str], files: list[str]):
        self.folder, self.runs, self.files = Path(folder), runs, files

    @classmethod
    def read(cls, folder) -> "Manifest":
        try:
            raw = json.loads((Path(folder) / MANIFEST).read_text())
            runs = [r for r in raw["runs"] if isinstance(r, str) and r.isalnum()]
            files = [f for f in raw["files"] if isinstance(f, str) and f and "/" not in f and f not in (".", "..")]
        except (OSError, ValueError, KeyError, TypeError):
            runs, files = [], []
        return cls(folder, runs, files)

    def save(self) -> None:
        if not self.runs and not self.files:
            _unlink_quietly(self.folder / MANIFEST)
            return
        write_atomic(self.folder / MANIFEST, json.dumps({"format": 1, "runs": self.runs, "files": self.files}))

    def record(self, names: Iterable[str] = ()) -> None:
        """This process's tag and ``names`` recorded (saved before the caller makes them)."""
        new = [n for n in dict.fromkeys(names) if n not in self.files]
        if RUN_TAG in self.runs and not new:
            return
        if RUN_TAG not in self.runs:
            self.runs.append(RUN_TAG)
        self.files.extend(new)
        self.save()

    def remove(self, names: Iterable[str]) -> None:
        """Removes the files of ``names`` that the manifest records, and forgets them."""
        gone = [n for n in names if n in self.files]
        for n in gone:
            _unlink_quietly(self.folder / n)
        if gone:
            self.files = [f for f in self.files if f not in gone]
            self.save()

    def disown(self, inputs: Iterable[Path]) -> None:
        """Forgets every recorded file that is one of ``inputs`` (a file a run reads is the
        user's now, whoever wrote it: never removed)."""
        keep = []
        for f in self.files:
            if not any(_same_file(self.folder / f, p) for p in inputs):
                keep.append(f)
        if len(keep) != len(self.files):
            self.files = keep
            self.save()

    def clear_runs(self, but: str | None = None) -> None:
        """Removes the temporary files and scratch folders of the recorded runs (but ``but``'s)
        and forgets those runs; call it only while no writer is at work in the folder."""
        for tag in [t for t in self.runs if t != but]:
            for entry in self.folder.glob(f".*.{tag}-*.tmp"):
                _unlink_quietly(entry)
            for entry in self.folder.glob(f"{SCRATCH_PREFIX}{tag}-*"):
                shutil.rmtree(entry, ignore_errors=True)
        runs = [t for t in self.runs if t == but]
        if runs != self.runs:
            self.runs = runs
            self.save()


def write_output(path, data: bytes | str) -> Path:
    """:func:`write_atomic`, the file recorded in its folder's manifest first."""
    path = Path(path)
    Manifest.read(path.parent).record([path.name])
    return write_atomic(path, data)


def record_outputs(folder, names: Iterable[str]) -> None:
    """Records ``names`` (files about to be written in ``folder``) in its manifest."""
    Manifest.read(folder).record(names)


def remove_stale_shard_files(folder, stem: str, keep: Iterable[str] = ()) -> None:
    """Removes the recorded ``<stem>.<tag>.shard-<s>.json`` files of ``folder`` but ``keep``
    (those the root just written names): earlier writes' and those of a write killed before
    its root. Shard files the manifest does not record are someone else's: left alone."""
    keep = set(keep)
    m = Manifest.read(folder)
    m.remove([f for f in m.files if f.startswith(stem + ".") and ".shard-" in f and f.endswith(".json")
              and f not in keep])


def remove_partial_writes(folder: Path) -> None:
    """Removes the temporary files and scratch that the other runs recorded in ``folder``'s
    manifest left (a killed MPI rank's; call it only while no writer is at work there)."""
    Manifest.read(folder).clear_runs(but=RUN_TAG)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_inputs(folder: Path, names: Iterable[str], inputs: Iterable[tuple[str, Path]], where: str) -> None:
    """An OutputError naming the first of ``folder``'s ``names`` (files a run writes there)
    that is one of ``inputs`` (``(what, path)``: files the run reads), compared by inode."""
    inputs = list(inputs)
    for name in names:
        target = Path(folder) / name
        for what, p in inputs:
            if _same_file(target, p):
                raise OutputError(f"{where} {str(folder)!r}: its {name} is {what} {str(p)!r}, which this run "
                                  f"reads; writing there would replace it: choose another output")


def lock_holder(folder) -> str | None:
    """Who holds ``folder``'s lock (an emgrid fit at work there), or None."""
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


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
            manifest = Manifest.read(self.path)
            manifest.clear_runs()  # what the runs before left: none is at work (this process holds the lock)
            manifest.record()
            return
        raise OutputError(f"output folder {str(self.path)!r}: its lock keeps changing hands")  # pragma: no cover

    # ------------------------------------------------------------ while running
    def scratch(self, what: str) -> Path:
        """A private folder for this run, removed by :meth:`close` (or by the next run)."""
        d = self.path / f"{SCRATCH_PREFIX}{RUN_TAG}-{what}"
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
        return write_output(self.path / name, data)

    def refuse_inputs(self, names: Iterable[str], inputs: Iterable[tuple[str, Path]]) -> None:
        """Refuses (:func:`refuse_inputs`) a run whose outputs ``names`` would replace one of
        its ``inputs``, and disowns every input the manifest records (never removed)."""
        inputs = list(inputs)
        refuse_inputs(self.path, names, inputs, "output folder")
        Manifest.read(self.path).disown([p for _, p in inputs])

    def close(self) -> None:
        for d in self._scratch:
            shutil.rmtree(d, ignore_errors=True)
        self._scratch = []
        if self._fd is not None:
            manifest = Manifest.read(self.path)
            if RUN_TAG in manifest.runs:
                manifest.runs.remove(RUN_TAG)
                try:
                    manifest.save()
                except OutputError:
                    pass
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
    alive = "" if host != socket.gethostname() or pid_alive(pid) else ", not running"
    return f"pid {pid} on {host}{since}{alive}"
