"""The built-in heterogeneous example ``emgrid demo`` runs end to end, on any executor.

``--executor mpi`` outside ``mpiexec`` starts ``mpiexec`` itself, as ``emgrid fit`` does
(:mod:`emgrid.cli.launch`): one rank per worker of the plan for this machine; every rank
samples the same rows, rank 0 plans for the job's ranks and shares the plan, and rank 0
alone prints.
"""

from __future__ import annotations

import sys

import numpy as np

from emgrid.models import Categorical, Composite, Exponential, FullGaussian, Mixture, Poisson, Sequence

MAX_ITER = 60


def _record(probs, mean, cov, count_rate, wait_rate):
    return Composite([
        Categorical(probs),
        FullGaussian(mean, cov),
        Sequence(Poisson(count_rate), mean_length=6.0),
        Exponential(wait_rate),
    ])


def demo_truth() -> Mixture:
    """Two kinds of customer record: a category, a 3-d measurement, a run of counts, a wait."""
    cov_a = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.3], [0.0, 0.3, 1.0]])
    cov_b = np.array([[0.5, 0.0, 0.0], [0.0, 2.0, -0.4], [0.0, -0.4, 1.0]])
    return Mixture([
        _record([0.7, 0.2, 0.1], [0.0, 0.0, 0.0], cov_a, 2.0, 1.0),
        _record([0.1, 0.3, 0.6], [4.0, 3.0, 5.0], cov_b, 8.0, 5.0),
    ], [0.45, 0.55])


def demo_start() -> Mixture:
    """A deliberately rough starting point with the same structure."""
    eye = np.eye(3)
    return Mixture([
        _record([1 / 3] * 3, [1.0, 1.0, 1.0], 2 * eye, 4.0, 2.0),
        _record([1 / 3] * 3, [3.0, 2.0, 3.0], 2 * eye, 5.0, 3.0),
    ], [0.5, 0.5])


def _launch_mpi(args, start) -> int:
    """Reruns ``emgrid demo`` under ``mpiexec`` with one rank per worker of the local plan."""
    from emgrid.planner import Resources, balance_plan

    from .launch import launch, mpi_command

    resources = Resources.local().model_copy(update={"coordinator_in_grid": True})
    plan = balance_plan(start, resources, n_data=args.rows)
    argv = sys.argv[sys.argv.index("demo") + 1:] if "demo" in sys.argv else ["--rows", str(args.rows),
                                                                                "--executor", "mpi"]
    return launch(mpi_command(plan.workers_used, ["demo", *argv], debug=args.debug), plan, None, MAX_ITER)


def cmd_demo(args) -> int:
    from emgrid.executors import get, optimize
    from emgrid.planner import Resources

    from .launch import RankRecord, under_mpiexec
    from .progress import Progress
    from .report import compare_models, plan_table

    truth, start = demo_truth(), demo_start()
    if args.executor == "mpi" and not under_mpiexec():
        return _launch_mpi(args, start)
    lead = True
    executor = get(args.executor)
    if args.executor == "mpi":  # a rank of the job _launch_mpi started (or the user's mpiexec)
        record = RankRecord.here()
        if record is not None:
            record.started()
        lead = executor.comm.Get_rank() == 0
        resources = Resources.from_mpi(executor.comm)
    else:
        resources = Resources.local()
    data = truth.prepare(truth.sample(args.rows, np.random.default_rng(0)))
    plan = executor.make_plan(start, resources, args.rows)
    quiet = args.quiet or not lead
    if not quiet:
        print(f"model: {truth.describe()} of {start.children[0].describe()} "
              f"({len(start.leaves())} leaves), {args.rows} rows sampled from the truth\n")
        print(plan_table(plan))
        print()
    progress = Progress(MAX_ITER, quiet=quiet)
    result = optimize(data, start, plan=plan, executor=executor, max_iter=MAX_ITER, tol=1e-8,
                      callback=lambda i, ll, so_far: progress.update(i, ll, so_far.timings[-1]["total"]))
    progress.close()
    if not quiet:
        print(f"\n{result.iterations} iterations, converged={result.converged}, "
              f"final log-likelihood {result.log_likelihood[-1]:.6g} "
              f"(truth: {float(truth.log_density(data).sum()):.6g})\n")
        print(compare_models(result.model, truth))
    return 0
