"""Run under ``mpiexec -n N``: a fit with the MPI executor, its BLAS limit probed on every rank.

``python mpi_threads_script.py OUT.json BLAS_THREADS``: ``BLAS_THREADS`` is a number or
``inherit`` (the executor's ``blas_threads=None``). ``EMGRID_THREAD_PROBE`` (set by the test)
makes every worker write its pools inside the fit; rank 0 writes ``{"before": [...],
"after": [...]}`` per rank: each rank's BLAS threads before and after the fit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from mpi4py import MPI  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

from emgrid.executors import get, optimize  # noqa: E402
from plans import grid_plan  # noqa: E402
from sample_models import nested_data, nested_model  # noqa: E402


def blas_threads() -> list[int]:
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def main() -> int:
    out, limit = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    model = nested_model()
    data = nested_data(model)
    plan = grid_plan(model, 600, comm.Get_size(), 1)
    before = blas_threads()
    executor = get("mpi", blas_threads=None if limit == "inherit" else int(limit))
    optimize(data, model, plan=plan, executor=executor, max_iter=3, tol=0.0)
    facts = comm.gather({"before": before, "after": blas_threads()}, root=0)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
