"""``emgrid fit`` with ``kind = "mpi"`` (and ``emgrid demo --executor mpi``): the parent that
starts ``mpiexec``, and what it reports.

The parent reruns the command under ``mpiexec`` (one rank per worker of the plan) and exits
with the command's own code (0 done, 1 not converged, 2 bad input, 3 the fit failed, 130
interrupted) as rank 0 reports it. ``mpiexec``'s own status cannot be passed on: a rank that
dies outright (killed, ``os._exit``) takes the job down, ``mpiexec`` kills the other ranks,
rank 0 included, and exits with a status of its own (the dead rank's code or signal, or
that of a rank it killed: 9 and 13 are both seen, and 1, which would read as "not
converged"). When rank 0 did not report, the fit failed: the parent prints one line naming
the rank that died first, the iteration, and the checkpoint to resume from, and exits 3.

What the parent knows comes from a folder it passes to the ranks in ``EMGRID_MPI_RECORD``
(:class:`RankRecord`): every rank writes its pid when it starts; rank 0 the number of
iterations finished, after each (one ``pwrite``), and its exit code, last; a rank other
than 0 that stops on a FitError (it found a rank that hangs, say) writes its message. While
``mpiexec`` runs, the parent watches the ranks' pids (Linux ``pidfd``, which works for
processes that are not its children): the first rank to exit, in a job rank 0 did not finish,
is the one that died. Without ``pidfd`` the line says that a rank died, not which.

Addresses and scratch (:func:`job_env`): the job runs on this machine alone, so its ranks'
UCX transport is held to the loopback device (``UCX_NET_DEVICES=lo``, unless the environment
names devices or a host file); hydra's own control port, which the ranks' proxy connects
back to, listens on every interface whatever this hydra is told (``-iface``,
``HYDRA_IFACE``, ``HYDRA_USE_LOCALHOST``, ``-localhost`` leave it on 0.0.0.0), for the job's
lifetime. The job's ``TMPDIR`` is a run-tagged scratch folder
(:class:`emgrid.executors.scratch.Scratch`), which also holds the record: hydra's
``hydra_hwloc_xmlfile_*`` and the ranks' temporary files go there and go with it, however
the launcher ends (its warden removes it after a ``kill -9``).

Signals and orphans (:func:`launch`): ``mpiexec`` runs in a session of its own and gets
SIGKILL when the parent dies (``PR_SET_PDEATHSIG``), every rank when its parent (hydra's
proxy) dies; Ctrl-C or SIGTERM at the parent asks rank 0 to stop after its iteration (a
``stop`` file in the record), and a job that does not stop within :data:`STOP_GRACE_S` or at
a second signal is killed with its process group.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from emgrid.executors.scratch import Scratch, set_parent_death_signal

from .outdir import remove_partial_writes

ENV = "EMGRID_MPI_RECORD"
#: The command's exit code for a fit that failed while running (as emgrid.cli.main's EXIT_FAILED).
EXIT_FAILED = 3
_RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def under_mpiexec() -> bool:
    """Whether this process is a rank of an ``mpiexec`` job (its process manager's variables)."""
    return any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"))


def mpi_command(ranks: int, argv: list[str], *, debug: bool = False) -> list[str]:
    """``mpiexec -n RANKS python -m emgrid.cli.main [--debug] ARGV...`` (the ``mpiexec`` next to
    this interpreter when there is one, as the ``mpich`` wheel installs it)."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    return ([str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(ranks), sys.executable, "-m",
             "emgrid.cli.main"] + (["--debug"] if debug else []) + list(argv))


def job_env(scratch: Path, record: Path, environ=None) -> dict[str, str]:
    """The environment of an ``mpiexec`` job of this launcher: ``environ`` (default this
    process's), the record folder, ``TMPDIR`` in the job's scratch folder, and the ranks'
    UCX transport on the loopback device unless ``UCX_NET_DEVICES`` or a hydra host file is
    named (a job across hosts needs their interface: see the README)."""
    env = dict(os.environ if environ is None else environ)
    env[ENV] = str(record)
    env["TMPDIR"] = str(scratch)
    if "UCX_NET_DEVICES" not in env and "HYDRA_HOST_FILE" not in env:
        env["UCX_NET_DEVICES"] = "lo"
    return env


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class RankRecord:
    """One rank's side of the record folder (see the module's docstring)."""

    def __init__(self, folder: Path, rank: int):
        self.folder, self.rank = folder, rank
        self._progress_fd: int | None = None

    @classmethod
    def here(cls) -> "RankRecord | None":
        """This rank's record when the parent asked for one; None otherwise."""
        folder = os.environ.get(ENV)
        if not folder:
            return None
        rank = next((int(os.environ[k]) for k in _RANK_ENV if os.environ.get(k, "").isdigit()), None)
        if rank is None:
            from mpi4py import MPI

            rank = MPI.COMM_WORLD.Get_rank()
        return cls(Path(folder), rank)

    def _write(self, name: str, text: str) -> None:
        try:
            tmp = self.folder / f".{name}.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.folder / name)
        except OSError:
            pass  # the parent is gone or the folder with it: nothing to report to

    def started(self) -> None:
        """Writes this rank's pid; the rank dies with its parent (hydra's proxy), so that no rank
        outlives a job whose launcher or ``mpiexec`` was killed."""
        set_parent_death_signal(signal.SIGKILL, os.getppid())
        self._write(f"pid.{self.rank}", str(os.getpid()))

    def stop_requested(self) -> int | None:
        """Rank 0, after each iteration: the signal the launcher was stopped with, if it was."""
        return _read_int(self.folder / "stop")

    def progress(self, iteration: int) -> None:
        """Rank 0, after each iteration: how many are finished (counting a resumed run's)."""
        try:
            if self._progress_fd is None:
                self._progress_fd = os.open(self.folder / "progress", os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._progress_fd, b"%20d\n" % iteration, 0)
        except OSError:
            pass

    def finished(self, code: int) -> None:
        """Rank 0, last: the command's exit code."""
        self._write("exit", str(code))

    def failed(self, message: str) -> None:
        """A rank other than 0 that stopped on a FitError."""
        self._write(f"error.{self.rank}", message)


#: Seconds the parent waits, after it asked the job to stop (Ctrl-C or SIGTERM), for rank 0
#: to finish its iteration, write its checkpoint and report; then it kills the job.
STOP_GRACE_S = float(os.environ.get("EMGRID_STOP_GRACE_S", "30"))


def launch(cmd: list[str], plan, out: Path | None, max_iter: int, record_dir: Path | None = None) -> int:
    """Runs ``cmd`` (``mpiexec ...``) and returns the command's exit code (see the module);
    ``out``: the fit's output folder, where a failure's line looks for a checkpoint;
    ``record_dir``: the folder of the ranks' record (default: one in the job's scratch folder).

    ``mpiexec`` runs in a session of its own, so a terminal's Ctrl-C reaches this process
    alone, and dies with it (``PR_SET_PDEATHSIG``; its ranks with their parents, see
    :meth:`RankRecord.started`). Ctrl-C or SIGTERM here asks rank 0 to stop after its current
    iteration (a ``stop`` file in the record, which it reads after each one): it writes its
    checkpoint, every rank stops, and the command exits 130 or 143 as rank 0 reports. A job
    that has not ended :data:`STOP_GRACE_S` seconds later, or at a second signal, is killed
    (its process group), and the line says so.
    """
    scratch = Scratch("mpi")
    folder = Path(record_dir) if record_dir is not None else scratch.path / "record"
    folder.mkdir(exist_ok=True)
    shm_before = _mpich_shm()
    stop: dict = {"signum": None, "at": None}
    proc = None

    def on_signal(signum, frame):
        if stop["signum"] is None:
            stop["signum"], stop["at"] = signum, time.monotonic()
            try:
                (folder / "stop").write_text(str(signum))
            except OSError:
                pass
        elif proc is not None:
            _kill_job(proc)

    handlers = {}
    try:
        if threading.current_thread() is threading.main_thread():
            handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        proc = subprocess.Popen(cmd, env=job_env(scratch.path, folder), start_new_session=True,
                                preexec_fn=_die_with_parent(os.getpid()))
        first = _first_to_exit(proc, folder, plan.workers_used, stop)
        while True:
            try:
                status = proc.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                if stop["at"] is not None and time.monotonic() - stop["at"] > STOP_GRACE_S:
                    _kill_job(proc)
        code = _read_int(folder / "exit")
        if code is not None:
            return code
        if stop["signum"] is not None:
            print(f"emgrid: interrupted: the MPI job did not stop in time and was killed"
                  f"{_checkpoint_note(out) if out is not None else ''}", file=sys.stderr)
            return 128 + int(stop["signum"])
        if status == 0:
            return 0  # nothing recorded, nothing failed: an mpiexec that keeps the environment to itself
        errors = sorted(folder.glob("error.*"), key=lambda p: int(p.suffix[1:]))
        if errors:
            message = errors[0].read_text().strip()
        else:
            message = _death(first, plan, status, _read_int(folder / "progress"), max_iter)
        print(f"emgrid: fit failed: {message}{_checkpoint_note(out) if out is not None else ''}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if proc is not None and proc.poll() is None:  # this process is being torn down: so is the job
            _kill_job(proc)
        if out is not None and proc is not None and proc.poll() is not None:
            remove_partial_writes(out)  # a rank killed mid-write leaves its temporary file
        for s, h in handlers.items():
            signal.signal(s, h)
        if record_dir is not None:
            shutil.rmtree(folder, ignore_errors=True)
        scratch.close()
        _remove_leaked_shm(shm_before)


def _kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL to ``mpiexec``'s process group (its proxies and ranks with it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _die_with_parent(parent: int):
    def preexec():
        set_parent_death_signal(signal.SIGKILL, parent)

    return preexec


def _mpich_shm() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("mpich_shm_")}
    except OSError:
        return set()


def _remove_leaked_shm(before: set[str]) -> None:
    """MPICH's shared-memory segments the job made and left (ranks killed before they could
    unlink them): those new since the job started that no live process maps."""
    new = _mpich_shm() - before
    if not new:
        return
    in_use = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if "/dev/shm/mpich_shm_" in line:
                        in_use.add(line.rsplit("/", 1)[-1].split()[0])
        except OSError:
            continue
    for name in new - in_use:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass


def _first_to_exit(proc: subprocess.Popen, folder: Path, n_ranks: int, stop: dict | None = None) -> list[int] | None:
    """Waits for ``mpiexec`` to exit; returns the rank(s) that exited first, or None.

    Several ranks when they exit between two looks (``mpiexec`` kills the others within
    milliseconds of the first death, so the look after a wake-up is what counts).
    """
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        job = pidfd_open(proc.pid)
    except OSError:
        return None
    poller = select.poll()
    poller.register(job, select.POLLIN)
    watched: dict[int, int] = {}  # pidfd -> rank
    seen: set[int] = set()
    first: list[int] | None = None
    try:
        while True:
            gone = []
            if len(seen) < n_ranks:
                for path in folder.glob("pid.*"):
                    rank = int(path.suffix[1:])
                    pid = _read_int(path)
                    if rank in seen or pid is None:
                        continue
                    seen.add(rank)
                    try:
                        fd = pidfd_open(pid)
                    except OSError:  # exited (and reaped) before we looked
                        gone.append(rank)
                        continue
                    watched[fd] = rank
                    poller.register(fd, select.POLLIN)
            events = poller.poll(50)
            if stop is not None and stop["at"] is not None and time.monotonic() - stop["at"] > STOP_GRACE_S:
                _kill_job(proc)
            done = False
            for fd, _ in events:
                if fd == job:
                    done = True
                elif fd in watched:
                    gone.append(watched[fd])
                    poller.unregister(fd)
            if gone and first is None:
                first = sorted(gone)
            if done:
                return first
    finally:
        for fd in [job, *watched]:
            os.close(fd)


def _rank_names(plan) -> dict[int, str]:
    from emgrid.executors.mpi import rank_map

    grid = plan.worker_grid()
    return {rank: f"worker {grid[r][s]!r} (replica {r}, shard {s}, rank {rank})"
            for (r, s), rank in rank_map(plan, plan.workers_used).items()}


def _death(first: list[int] | None, plan, status: int, finished: int | None, max_iter: int) -> str:
    names = _rank_names(plan)
    if first:
        who = " or ".join(names.get(r, f"rank {r}") for r in first)
    else:
        who = "an MPI rank"
    if finished is None:
        when = "before the fit started"
    elif finished >= max_iter:
        when = f"after iteration {finished}"
    else:
        when = f"in iteration {finished + 1}"
    how = f"signal {-status}" if status < 0 else f"status {status}"
    return f"{who} died {when} (killed, or exited without reporting); mpiexec ended the job with {how}"


def _checkpoint_note(out: Path) -> str:
    from emgrid.models.errors import ConfigError

    from .checkpoint import CHECKPOINT, read_checkpoint

    if not (out / CHECKPOINT).exists():
        return ""
    try:
        iteration, _, _ = read_checkpoint(out)
    except (ConfigError, KeyError, ValueError, TypeError):
        return f"; the checkpoint in {out} is damaged"
    return f"; the checkpoint of iteration {iteration} is in {out}: continue with --resume"
