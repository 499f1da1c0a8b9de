"""A local fit on every executor listens on loopback only and leaves nothing behind.

Each case runs ``emgrid fit`` in a process of its own (``kind`` = multiprocessing, mpi through
emgrid's own launcher, dask, ray, spark), with a private ``TMPDIR``, and one worker hanging a few
seconds in iteration 2 (``EMGRID_FAULT``), so that every process of the fit is up while the
test looks at it. Once iteration 1's checkpoint is written, the test polls the process
tree of the fit (psutil) for its listening sockets, their files in ``/dev/shm`` and their
pids, until the fit ends by itself or, in the second case, until it kills the fit's process
(``kill -9``). Then, within a generous wait (a loaded machine is slow, never a fixed sleep):
no process the fit started is alive, the private ``TMPDIR`` is empty, none of the
``/dev/shm`` files the fit's processes mapped is left, and Ray made no session folder in
``/tmp/ray``.

The one listener allowed beyond loopback is hydra's control port under the MPI launcher
(mpiexec's own socket, which its proxy and the ranks inherit): this hydra binds it to every
interface whatever it is told (see ``emgrid.cli.launch``).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("psutil")

from .exposure_checks import EXECUTORS, available, leftovers, run_and_watch, wait_for  # noqa: E402


@pytest.fixture
def private_tmp():
    """A short private temporary folder (Ray's socket paths must stay short)."""
    d = Path(tempfile.mkdtemp(prefix="emx-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("kill", [False, True], ids=["ends", "kill-9"])
@pytest.mark.parametrize("kind", EXECUTORS)
def test_a_local_fit_listens_on_loopback_only_and_leaves_nothing(kind, kill, tmp_path, private_tmp):
    if not available(kind):
        pytest.skip(f"{kind} is not installed")
    watch, proc, err = run_and_watch(kind, tmp_path, private_tmp, kill)
    if kill:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 1, err  # not converged in 3 iterations: it ran to the end
    assert len(watch.procs) >= 3, f"too few processes seen: {watch.procs}"  # the driver and two workers
    assert watch.listening or kind == "multiprocessing", "no listener seen: the fit was not looked at"
    assert watch.exposed() == {}, f"listening beyond loopback: {watch.exposed()}"
    if kind == "mpi":
        assert len(watch.mpiexec_ports) == 1  # hydra's control port, nothing more
    assert leftovers(watch, proc.pid, private_tmp) == {"alive": [], "tmp": [], "dev_shm": [], "ray_sessions": []}


def test_a_stale_scratch_folder_and_what_holds_it_go_at_the_next_start(private_tmp):
    """A scratch folder whose owner and warden were both killed: the next scratch folder's
    start kills the process still holding a file in it and removes it."""
    from emgrid.executors.scratch import Scratch

    stale = private_tmp / "emgrid-ray-stale"
    stale.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    (stale / "owner").write_text(f"{owner.pid} \n")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'w'); time.sleep(600)",
                               str(stale / "log")])
    wait_for(lambda: (stale / "log").exists(), "the holder's file")
    owner.kill()
    owner.wait()
    with Scratch("data", private_tmp) as fresh:
        assert not stale.exists()
        assert fresh.path.exists()
        wait_for(lambda: holder.poll() is not None, "the holder's end", 30.0)
    assert not fresh.path.exists()
    assert list(private_tmp.iterdir()) == []


def test_a_live_owners_scratch_folder_is_left_alone(private_tmp):
    from emgrid.executors.scratch import Scratch, sweep

    with Scratch("dask", private_tmp) as mine:
        assert sweep(private_tmp) == []
        assert mine.path.exists()
