"""Run under ``mpiexec -n 2``: fits the table model from a ``.parquet`` or ``.csv`` file on a
2 x 1 grid; ``python mpi_table_script.py FILE OUT.json``: rank 0 writes ``{"trace": [...],
"same_on_all_ranks": bool}``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from mpi4py import MPI  # noqa: E402

from emgrid.executors import optimize  # noqa: E402
from plans import grid_plan  # noqa: E402
from table_models import N, table_model  # noqa: E402


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    model = table_model()
    res = optimize(path, model, plan=grid_plan(model, N, 2, 1), executor="mpi", max_iter=6, tol=0.0)
    traces = comm.gather(res.log_likelihood, root=0)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps({"trace": res.log_likelihood,
                                         "same_on_all_ranks": all(t == traces[0] for t in traces)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
