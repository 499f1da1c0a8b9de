"""Run under ``mpiexec -n N`` with ``EMGRID_FAULT`` set: a fit in which one rank misbehaves.

``python mpi_fault_script.py D M [TIMEOUT_S]``: every rank prints ``RANK <r> PID <pid>`` first
(so a test can map the process manager's PID back to a rank), then fits a model of three row
blocks on the ``D x M`` grid for 4 iterations (with the executor's ``timeout_s`` when given);
a FitError is printed as ``FITERROR <rank>: <message>`` and exits with 3; success prints
``DONE <rank>``.

With ``HIDE_DEATH_OF=<rank>`` set, that rank first forks a child that holds its file
descriptors open (the process manager's PMI socket among them), so that hydra's proxy neither
sees the rank die nor reaps it: only the other ranks' look at their peers can end the job.
The child ends with the proxy (the rank's parent), within 60 s at most.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from mpi4py import MPI  # noqa: E402

from emgrid.executors import get, optimize  # noqa: E402
from fault_models import ROWS, blocky_data, blocky_model  # noqa: E402
from emgrid.executors.warden import pid_alive  # noqa: E402
from emgrid.models.errors import FitError  # noqa: E402
from plans import grid_plan  # noqa: E402


def say(line: str) -> None:
    """One write per line: mpiexec interleaves the ranks' output by write, not by line."""
    os.write(1, (line + "\n").encode())


def hide_death() -> None:
    """A child holding this process's descriptors until the proxy ends (see the module)."""
    proxy = os.getppid()
    if os.fork() == 0:
        end = time.monotonic() + 60
        while time.monotonic() < end and pid_alive(proxy):
            time.sleep(0.1)
        os._exit(0)


def main() -> int:
    d, m = int(sys.argv[1]), int(sys.argv[2])
    executor = get("mpi", timeout_s=float(sys.argv[3])) if len(sys.argv) > 3 else "mpi"
    rank = MPI.COMM_WORLD.Get_rank()
    say(f"RANK {rank} PID {os.getpid()}")
    if os.environ.get("HIDE_DEATH_OF") == str(rank):
        hide_death()
    model = blocky_model()
    data = blocky_data(model)
    try:
        optimize(data, model, plan=grid_plan(model, ROWS, d, m), executor=executor, max_iter=4, tol=0.0)
    except FitError as e:
        say(f"FITERROR {rank}: {e}")
        return 3
    say(f"DONE {rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
