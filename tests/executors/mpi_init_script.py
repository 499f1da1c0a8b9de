"""Run under ``mpiexec -n N``: fits the template of ``template_models`` from the data on the
plan named by argv and writes what rank 0 saw.

``python mpi_init_script.py D M OUT.json``: rank 0 writes ``{"init": [...], "best": i,
"trace": [...], "same_on_all_ranks": bool}``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from mpi4py import MPI  # noqa: E402

from emgrid.executors import optimize  # noqa: E402
from emgrid.models import complete_shapes  # noqa: E402
from plans import grid_plan  # noqa: E402
from template_models import N, template, template_data  # noqa: E402

N_INIT, SEED, INIT_ITER, MAX_ITER = 2, 3, 2, 4


def main() -> int:
    d, m, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    comm = MPI.COMM_WORLD
    t, data = template(), template_data()
    plan = grid_plan(complete_shapes(t, data), N, d, m)
    warnings.simplefilter("ignore")
    res = optimize(data, t, plan=plan, executor="mpi", max_iter=MAX_ITER, tol=0.0, n_init=N_INIT, seed=SEED,
                   init_iter=INIT_ITER)
    seen = comm.gather((res.init_log_likelihoods, res.log_likelihood), root=0)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps({
            "init": res.init_log_likelihoods, "best": res.init_best, "trace": res.log_likelihood,
            "same_on_all_ranks": all(s == seen[0] for s in seen),
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
