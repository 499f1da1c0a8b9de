"""Run under ``mpiexec -n N``: the sharded M-step across ranks, several fits in one job.

``python mpi_shard_script.py grids OUT.pkl``: a mixture of composites and an HMM, each fitted
on the 1x2, 2x2, 1x4 and 4x1 grids (``GRIDS``), and the HMM once more on 2x2 without gathering
the model, which the coordinator's callback gathers from the shards' heads instead (key
``("fetched", 2, 2)``; after the fit, ``result.shards`` refuses). ``python mpi_shard_script.py memory OUT.pkl PLAN.pkl``: a
composite of large categoricals (``big_model``) fitted on the pickled plan, made for
``MEMORY_WORKERS`` workers of ``memory_limit()`` bytes each, less than the model's
parameters (by the test: the planner's import costs seconds on every rank). Rank 0 pickles ``{key: {"trace", "model", "bytes", "peaks", "plan",
"same_on_all_ranks"}}`` to OUT.pkl; ``same_on_all_ranks`` compares every rank's trace and
pickled model.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from emgrid.models import HMM, Categorical, Composite, DiagGaussian, Gaussian, Mixture, Poisson  # noqa: E402

GRIDS = [(1, 2), (2, 2), (1, 4), (4, 1)]
ITERATIONS = 5
N = 300
#: the memory fit: a composite of ``BIG_LEAVES`` categoricals of ``BIG_VALUES`` values,
#: planned for ``MEMORY_WORKERS`` workers
BIG_LEAVES, BIG_VALUES, MEMORY_WORKERS, MEMORY_N = 32, 250_000, 4, 200


def mixture_of_composites(shift: float = 0.0) -> Mixture:
    """Three components, each a composite of a Gaussian, a categorical and a Poisson."""
    return Mixture([
        Composite([Gaussian(-2.0 + shift, 1.0), Categorical([0.6, 0.2, 0.2]), Poisson(1.0 + shift)]),
        Composite([Gaussian(0.0, 1.5), Categorical([0.2, 0.6, 0.2]), Poisson(4.0)]),
        Composite([Gaussian(3.0 - shift, 0.7), Categorical([0.2, 0.2, 0.6]), Poisson(8.0 - shift)]),
    ], [0.3, 0.3, 0.4])


def hmm(shift: float = 0.0) -> HMM:
    """Four states of two-dimensional diagonal Gaussians (four leaves: one per shard of 1x4)."""
    means = [[0.0, 0.0], [2.0 + shift, 0.0], [0.0, 2.0], [2.0, 2.0 - shift]]
    trans = np.full((4, 4), 0.1) + 0.6 * np.eye(4)
    return HMM([DiagGaussian(m, [1.0, 1.0]) for m in means], trans, [0.25, 0.25, 0.25, 0.25], 6.0)


def big_model(seed: int = 0) -> Composite:
    rng = np.random.default_rng(seed)
    return Composite([Categorical(rng.dirichlet(np.ones(BIG_VALUES))) for _ in range(BIG_LEAVES)])


def param_bytes(model) -> int:
    return sum(a.nbytes for _, node in model.nodes() for a in node.params().values())


def memory_limit() -> int:
    """Below the big model's parameters (so no worker could hold it) and above a shard's needs."""
    return int(0.97 * param_bytes(big_model()))


def grid_cases():
    """``(name, model, data)``: the starting model and rows drawn from a shifted one."""
    for name, make in (("mixture_of_composites", mixture_of_composites), ("hmm", hmm)):
        yield name, make(), make(0.5).sample(N, np.random.default_rng(3))


def memory_case():
    model = big_model()
    return model, big_model(1).sample(MEMORY_N, np.random.default_rng(4))


def coupling_case():
    """A mixture of 8 diagonal Gaussians (d=16) and 60,000 rows: 4 blocks per iteration, each
    shard of a 1x2 grid sending 4 components' densities per row and block."""
    rng = np.random.default_rng(6)
    model = Mixture([DiagGaussian(rng.normal(size=16), np.ones(16)) for _ in range(8)], np.full(8, 1 / 8))
    return model, model.sample(60_000, rng)


def memory_resources():
    from emgrid.planner import Resources

    return Resources.uniform(MEMORY_WORKERS, memory_bytes=memory_limit()).model_copy(update={"coordinator_in_grid": True})


def main() -> int:
    from mpi4py import MPI

    from emgrid.executors import optimize
    from emgrid.models import n_rows
    from plans import grid_plan

    what, out = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    results = {}
    if what == "grids":
        for name, model, data in grid_cases():
            n = n_rows(model.prepare(data))
            for d, m in GRIDS:
                res = optimize(data, model, plan=grid_plan(model, n, d, m), executor="mpi", max_iter=ITERATIONS, tol=0.0)
                results[name, d, m] = res
        # the last case again, its model left on the grid: the callback gathers it from the heads
        fetched = []
        res = optimize(data, model, plan=grid_plan(model, n, 2, 2), executor="mpi", max_iter=ITERATIONS, tol=0.0,
                       gather=False, callback=lambda it, ll, r: fetched.append(r.shards.gather()))
        try:
            res.shards.gather()
        except RuntimeError:  # the ranks have left the fit: the model went with them
            res.model = fetched[-1] if fetched else None  # the coordinator's (only it calls back)
        results["fetched", 2, 2] = res
    elif what == "coupling":
        # a data-heavy model-parallel fit: many blocks' coupling messages per iteration
        from emgrid.executors import NpyDataset

        model, _ = coupling_case()
        plan = pickle.loads(Path(sys.argv[3]).read_bytes())
        # rows mapped from disk by each rank, so that its measured peak holds them as its plan does
        results["coupling"] = optimize(NpyDataset(sys.argv[4]), model, plan=plan, executor="mpi", max_iter=4, tol=0.0)
    else:
        model, data = memory_case()
        plan = pickle.loads(Path(sys.argv[3]).read_bytes())
        # too big to gather on every rank (the default leaves it on the grid); the
        # coordinator's callback reads it from the heads after the last iteration, to compare
        kept = []
        res = optimize(data, model, plan=plan, executor="mpi", max_iter=3, tol=0.0,
                       callback=lambda it, ll, r: kept.append(r.shards.gather()) if it == 3 else None)
        res.left_on_the_grid = res.model is None
        res.model = kept[-1] if kept else None
        results["memory"] = res
    gathered_here = {("fetched", 2, 2), "memory"}  # models only the coordinator holds
    mine = {k: (r.log_likelihood, pickle.dumps(r.model) if k not in gathered_here else None)
            for k, r in results.items()}
    every = comm.gather(mine, root=0)
    if comm.Get_rank() == 0:
        Path(out).write_bytes(pickle.dumps({
            k: {"trace": r.log_likelihood, "model": r.model, "bytes": r.bytes_moved, "peaks": r.worker_peak_bytes,
                "plan": r.plan, "same_on_all_ranks": all(e[k] == mine[k] for e in every),
                "left_on_the_grid": getattr(r, "left_on_the_grid", None)}
            for k, r in results.items()
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
