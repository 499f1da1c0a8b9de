"""The warden of a scratch folder (:mod:`executors.scratch`): ``python -I -S warden.py FOLDER OWNER``.

It blocks reading its standard input, a pipe whose other end only the fit's process holds;
the read returns when that process closes it (the fit ended) or dies (the kernel closes
it). Unless the owner said :data:`DONE` first (it cleared the folder itself), the warden
then kills every process that still uses the folder (:func:`users`) and removes the folder
(:func:`clear`). Standard library only, and Linux's ``/proc``: it starts in a few
tens of milliseconds and imports nothing of emgrid's.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from contextlib import suppress

#: The file of a scratch folder naming its owner: ``"PID START_TIME"``.
OWNER = "owner"
#: What the owner writes before it closes the pipe when it clears the folder itself.
DONE = b"done"
#: Environment variables that tie a process to a scratch folder.
_ENV_KEYS = (b"EMGRID_SCRATCH=", b"TMPDIR=")


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of ``/proc/PID/stat``, clock ticks since boot),
    which tells a live owner from a later process that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:].split()[19].decode()
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is the live process that started at ``started`` (any start when None)."""
    if not pid_alive(pid):
        return False
    now = start_time(pid)
    if now is None:
        return sys.platform != "linux"
    return started is None or now == started


def _uses(pid: str, folder: str) -> bool:
    inside = folder + os.sep
    base = f"/proc/{pid}"
    with suppress(OSError):
        cwd = os.readlink(f"{base}/cwd")
        if cwd == folder or cwd.startswith(inside):
            return True
    with suppress(OSError):
        with open(f"{base}/environ", "rb") as f:
            env = f.read().split(b"\0")
        tagged = {k + folder.encode() for k in _ENV_KEYS}
        if any(e in tagged or (e.startswith(_ENV_KEYS) and e.partition(b"=")[2].startswith(inside.encode()))
               for e in env):
            return True
    with suppress(OSError):
        for fd in os.listdir(f"{base}/fd"):
            with suppress(OSError):
                if os.readlink(f"{base}/fd/{fd}").startswith(inside):
                    return True
    return False


def users(folder: str, spare: set[int]) -> list[int]:
    """Pids of the processes (but ``spare``) whose working directory, an open file, or
    ``EMGRID_SCRATCH``/``TMPDIR`` is in ``folder``."""
    folder = os.path.realpath(folder)
    out = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if int(pid) in spare:
            continue
        if _uses(pid, folder):
            out.append(int(pid))
    return out


def clear(folder, owner: int | None, within_s: float = 10.0, kill: bool = True) -> None:
    """Kills (SIGKILL) every process that uses ``folder`` but this one and ``owner``, until
    none is left or ``within_s`` passed (``kill=False``: none), then removes the folder."""
    folder = str(folder)
    spare = {os.getpid()} | ({owner} if owner is not None else set())
    if kill and sys.platform.startswith("linux") and os.path.isdir(folder):
        end = time.monotonic() + within_s
        while True:
            left = users(folder, spare)
            if not left or time.monotonic() > end:
                break
            for pid in left:
                with suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    folder, owner = argv[0], int(argv[1])
    said = b""
    with suppress(OSError):
        while chunk := os.read(0, 4096):
            said += chunk
    if said != DONE:  # the owner died, or ended without clearing the folder itself
        clear(folder, owner if alive(owner, None) else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
