"""Run under ``mpiexec -n 2``: every rank maps ``X.npy`` copy-on-write, shifts the mapping in its
own memory (the file keeps the old values) and fits a diagonal Gaussian on a 2 x 1 grid.

``python mpi_mapped_script.py X.npy OUT.json``: rank 0 writes ``{"trace": [...], "mean": [...],
"same_on_all_ranks": bool}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from emgrid.executors import optimize  # noqa: E402
from emgrid.models import DiagGaussian  # noqa: E402
from plans import grid_plan  # noqa: E402

SHIFT = 100.0


def main() -> int:
    path, out = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    x = np.load(path, mmap_mode="c")
    x += SHIFT
    model = DiagGaussian(np.zeros(x.shape[1]), np.ones(x.shape[1]))
    res = optimize(x, model, plan=grid_plan(model, len(x), 2, 1), executor="mpi", max_iter=3, tol=0.0)
    traces = comm.gather(res.log_likelihood, root=0)
    if comm.Get_rank() == 0:
        Path(out).write_text(json.dumps({"trace": res.log_likelihood, "mean": res.model.mean.tolist(),
                                         "same_on_all_ranks": all(t == traces[0] for t in traces)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
