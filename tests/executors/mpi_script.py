"""Run under ``mpiexec -n N``: fits a small nested model on the plan named by argv, prints the trace.

``python mpi_script.py D M OUT.json [TIMEOUT_S]``: rank 0 writes ``{"trace": [...],
"same_on_all_ranks": bool, "bytes": [...]}``; a PlanError is printed as ``PLANERROR: <message>``
and exits with 3. With ``TIMEOUT_S`` the executor runs with that ``timeout_s`` (its timed
transport).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from mpi4py import MPI  # noqa: E402

from emgrid.executors import get, optimize  # noqa: E402
from emgrid.models.errors import PlanError  # noqa: E402
from sample_models import nested_model, nested_data  # noqa: E402
from plans import grid_plan  # noqa: E402


def main() -> int:
    d, m, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    executor = get("mpi", timeout_s=float(sys.argv[4])) if len(sys.argv) > 4 else "mpi"
    comm = MPI.COMM_WORLD
    model = nested_model()
    data = nested_data(model)
    plan = grid_plan(model, 600, d, m)
    try:
        res = optimize(data, model, plan=plan, executor=executor, max_iter=6, tol=0.0)
    except PlanError as e:
        print(f"PLANERROR: {e}", flush=True)
        comm.Barrier()  # every rank has printed before any exits (mpiexec ends the job at the first exit 3)
        return 3
    traces = comm.gather(res.log_likelihood, root=0)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps({
            "trace": res.log_likelihood, "same_on_all_ranks": all(t == traces[0] for t in traces),
            "bytes": res.bytes_moved, "iterations": res.iterations, "executor": res.executor,
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
