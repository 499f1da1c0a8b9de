"""Watching a fit's processes: what they listen on, what they map in ``/dev/shm``, which are
still alive (:mod:`tests.executors.test_exposure`, and ``bench/soak.py``'s exposure rounds).

:func:`run_and_watch` runs ``emgrid fit`` in a process of its own with a private ``TMPDIR``
and one worker hanging in iteration 2 (``EMGRID_FAULT``), looks at its process tree once
iteration 1's checkpoint is written, and lets it end or kills it (``kill -9``);
:func:`leftovers` then says, within generous waits, what the fit left.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

EXECUTORS = ["multiprocessing", "mpi", "dask", "ray", "spark"]
MIX = ('{ family = "Mixture", weights = [0.5, 0.5], components = [ { family = "Gaussian", mean = -1.0, var = 1.0 }, '
       '{ family = "Gaussian", mean = 1.0, var = 1.0 } ] }')
#: Seconds worker w1 sleeps in iteration 2 (the fit's processes are looked at meanwhile).
HANG_S = 4
#: The longest wait for any one condition (a slow, loaded machine).
WAIT_S = 120.0
#: The longest wait for the fit's processes to end after it did: Ray's agents, left alone,
#: live 60 s after a ``kill -9`` of the driver.
GONE_S = 30.0


def available(kind: str) -> bool:
    if kind == "mpi":
        return Path(sys.executable).with_name("mpiexec").exists()
    if kind == "spark" and shutil.which("java") is None:
        return False
    module = {"dask": "distributed", "ray": "ray", "spark": "pyspark"}.get(kind)
    if module is None:
        return True
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def config(kind: str, max_iter: int) -> str:
    return f"""
[model]
inline = {MIX}
[data]
synthetic = 4000
seed = 0
[resources]
workers = 2
# slow workers and a fast network, so that every machine's plan is 2x1 (worker w1 hangs)
flops_per_s = 1e6
latency_s = 1e-6
bytes_per_s = 1e10
[executor]
kind = "{kind}"
[fit]
max_iter = {max_iter}
tol = 0.0
checkpoint_every = 1
output = "out"
"""


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


class Watch:
    """What the fit's process tree held while it was looked at."""

    def __init__(self, root: int):
        self.root = root
        self.procs: dict[tuple[int, float], str] = {}  # (pid, start time) -> name
        self.listening: dict[tuple[str, int], set[str]] = {}  # (address, port) -> the names of its holders
        self.shm: set[str] = set()
        self.mpiexec_ports: set[int] = set()

    def tree(self) -> list:
        try:
            top = psutil.Process(self.root)
            return [top] + top.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def look(self) -> None:
        procs = self.tree()
        pids = {}
        for p in procs:
            try:
                pids[p.pid] = p
                self.procs[(p.pid, p.create_time())] = p.name()
                cmd = p.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "--control-port" in cmd:  # hydra's proxy, which connects back to mpiexec's port
                self.mpiexec_ports.add(int(cmd[cmd.index("--control-port") + 1].rsplit(":", 1)[1]))
            try:
                with open(f"/proc/{p.pid}/maps") as f:
                    self.shm |= {ln.split("/dev/shm/", 1)[1].split()[0] for ln in f
                                 if "/dev/shm/" in ln and "(deleted)" not in ln}
            except OSError:
                pass
        for c in psutil.net_connections("inet"):
            if c.status == psutil.CONN_LISTEN and c.pid in pids:
                try:
                    name = pids[c.pid].name()
                except psutil.NoSuchProcess:
                    continue
                self.listening.setdefault((c.laddr.ip, c.laddr.port), set()).add(name)

    def exposed(self) -> dict:
        """Listeners beyond loopback, but hydra's control port (mpiexec's own socket, named
        on its proxy's command line)."""
        return {a: names for a, names in self.listening.items()
                if not loopback(a[0]) and a[1] not in self.mpiexec_ports}

    def alive(self) -> list[str]:
        out = []
        for (pid, started), name in self.procs.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{name} (pid {pid})")
            except psutil.NoSuchProcess:
                continue
        return out


def wait_for(condition, what, within_s: float = WAIT_S):
    """``condition()`` once it is true; AssertionError with ``what`` (a string, or a
    callable giving it at the time of the failure) after ``within_s`` seconds."""
    end = time.monotonic() + within_s
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"{what() if callable(what) else what}: not within {within_s:g} s")
        time.sleep(0.05)


def ray_sessions(pid: int) -> list[str]:
    try:
        return [n for n in os.listdir("/tmp/ray") if n.startswith("session_") and n.endswith(f"_{pid}")]
    except OSError:
        return []


def run_and_watch(kind: str, folder: Path, tmp: Path, kill: bool) -> tuple[Watch, subprocess.Popen, str]:
    """``emgrid fit`` on ``kind`` in ``folder/run``, ``TMPDIR=tmp``, watched while its worker
    w1 hangs in iteration 2; ``kill``: then killed (SIGKILL), else left to end after 3
    iterations. Returns what was watched, the ended process and its stderr."""
    work = folder / "run"
    work.mkdir()
    (work / "run.toml").write_text(config(kind, max_iter=1000 if kill else 3))
    env = dict(os.environ, TMPDIR=str(tmp), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               EMGRID_FAULT=f"hang:worker=w1:iteration=2:seconds={600 if kill else HANG_S}")
    proc = subprocess.Popen([sys.executable, "-m", "emgrid.cli.main", "fit", "run.toml", "--quiet"], cwd=work,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    watch = Watch(proc.pid)
    checkpoint = work / "out" / "checkpoint.json"
    try:
        wait_for(lambda: checkpoint.exists() or proc.poll() is not None, "iteration 1's checkpoint")
        assert proc.poll() is None, f"the fit ended before iteration 2: {proc.communicate()}"
        # every process is up (iteration 1 ran on all of them); look until iteration 2's hang ends
        looked_until = time.monotonic() + min(HANG_S / 2, 3.0)
        while proc.poll() is None and time.monotonic() < looked_until:
            watch.look()
            time.sleep(0.1)
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return watch, proc, err


def leftovers(watch: Watch, pid: int, tmp: Path) -> dict:
    """What a fit that ended (or was killed) left: its processes still alive after
    :data:`GONE_S`, entries of its private temporary folder after :data:`WAIT_S`, the files
    of ``/dev/shm`` its processes mapped, and Ray session folders of its pid in ``/tmp/ray``."""
    alive = watch.alive()
    end = time.monotonic() + GONE_S
    while alive and time.monotonic() < end:
        time.sleep(0.05)
        alive = watch.alive()
    tmp_left = sorted(p.name for p in tmp.iterdir())
    end = time.monotonic() + WAIT_S
    while tmp_left and time.monotonic() < end:
        time.sleep(0.05)
        tmp_left = sorted(p.name for p in tmp.iterdir())
    return {"alive": alive, "tmp": tmp_left, "dev_shm": sorted(n for n in watch.shm if os.path.exists(f"/dev/shm/{n}")),
            "ray_sessions": ray_sessions(pid)}
