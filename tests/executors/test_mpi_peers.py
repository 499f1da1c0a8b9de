"""A waiting MPI link looks at the processes of its host's other ranks: a dead one (gone or a
zombie) is named, a live one is not, and a short wait pays nothing for the look."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from emgrid.executors import mpi_link
from emgrid.executors.mpi_link import PEER_CHECK_S, MpiLink, PeerDied, ended, this_host


def exited_child(reap: bool) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    if reap:
        child.wait()
    else:  # a zombie: ended, unreaped (as by a process manager that missed it)
        while state(child.pid) != b"Z":
            time.sleep(0.01)
    return child


def state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rpartition(b")")[2].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a zombie's state is read from /proc")
def test_a_process_is_ended_when_gone_or_a_zombie_and_not_while_it_runs():
    assert not ended(os.getpid())
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not ended(live.pid)
    finally:
        live.kill()
        live.wait()
    assert ended(live.pid)  # reaped: gone
    zombie = exited_child(reap=False)
    try:
        assert ended(zombie.pid)
    finally:
        zombie.wait()


def test_this_host_is_the_same_for_two_processes_of_it():
    code = "from emgrid.executors.mpi_link import this_host; print(this_host())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, sys.path))))
    assert out.stdout.strip() == str(this_host())


def link_with_peer(pid: int) -> MpiLink:
    mpi = pytest.importorskip("mpi4py.MPI")
    who = ["worker 'w0' (replica 0, shard 0, rank 0, pid 1)", f"worker 'w1' (replica 0, shard 1, rank 1, pid {pid})"]
    return MpiLink(mpi.COMM_SELF, 0, who, None, peers={1: pid})  # one rank: no abort at exit


def test_a_wait_names_a_dead_peer_within_a_look_or_two():
    child = exited_child(reap=not sys.platform.startswith("linux"))
    link = link_with_peer(child.pid)
    link.when = "in iteration 2"
    try:
        t0 = time.perf_counter()
        with pytest.raises(PeerDied) as info:
            link.pump()  # nothing ever arrives: only the look ends it
        assert time.perf_counter() - t0 < 3 * PEER_CHECK_S + 0.5
        assert str(info.value) == f"worker 'w1' (replica 0, shard 1, rank 1, pid {child.pid}) died in iteration 2"
        assert info.value.__notes__ == ["found by worker 'w0' (replica 0, shard 0, rank 0, pid 1), which waits for "
                                        "the coordinator's next call (in iteration 2)"]
    finally:
        link.free()
        child.wait()


def test_a_short_wait_does_not_look_and_a_long_one_looks_at_most_every_check_interval(monkeypatch):
    link = link_with_peer(os.getpid())  # alive: never named
    looks = []
    monkeypatch.setattr(mpi_link, "ended", lambda pid: looks.append(time.perf_counter()) or False)
    try:
        link.looked = time.perf_counter() - 10 * PEER_CHECK_S  # the last look long ago
        t0 = time.perf_counter()
        polls = 0
        while time.perf_counter() - t0 < mpi_link._SPIN_S * 0.8:
            polls += 1
            link._idle(polls)
        assert looks == []  # the first part of a wait pays nothing
        assert not link.pump(until=time.perf_counter() + 2.2 * PEER_CHECK_S)
        assert 2 <= len(looks) <= 3, looks
        assert all(b - a >= PEER_CHECK_S for a, b in zip(looks, looks[1:])), looks
    finally:
        link.free()
