"""``optimize``: plan when needed, check the plan, and run EM on the chosen executor."""

from __future__ import annotations

from collections import Counter

from emgrid.models import Node, n_rows
from emgrid.models.errors import ConfigError, PlanError
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources

from .datafiles import NpyDataset
from .protocol import Callback, Executor, FitJob
from .registry import get
from .result import FitResult

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-6


def optimize(data, model: Node, *, plan: BalancePlan | None = None, resources: Resources | None = None,
             executor: str | Executor = "local", max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL,
             callback: Callback | None = None) -> FitResult:
    """Fits ``model`` (the starting point) to ``data`` by EM on a ``D x M`` grid of workers.

    - ``data``: anything ``model.prepare`` accepts, or an :class:`NpyDataset` on disk (then
      every worker maps only its own rows).
    - ``plan``: the grid and placement to run; without one, the executor plans for
      ``resources`` (default: what the executor has at hand, e.g. this machine's cores).
      A given plan is checked against the model and data, and against ``resources`` when
      they are given too; the executor refuses one it cannot realize before any work.
    - ``executor``: ``"local"``, ``"multiprocessing"``, ``"mpi"`` or an executor instance.
      Under ``mpiexec`` every rank calls ``optimize`` with the same arguments.
    - Stops when ``|ll_t - ll_{t-1}| <= tol * |ll_t|`` or after ``max_iter`` iterations;
      ``callback(iteration, log_likelihood, result_so_far)`` runs after each iteration.
    """
    ex = get(executor) if isinstance(executor, str) else executor
    if not isinstance(ex, Executor):
        raise ConfigError(f"executor must be a name or an Executor, got {type(executor).__name__}")
    if not isinstance(model, Node):
        raise ConfigError(f"model must be a model node (see models.from_spec), got {type(model).__name__}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ConfigError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not tol >= 0:
        raise ConfigError(f"tol must be a number >= 0, got {tol!r}")
    if isinstance(data, NpyDataset):
        prepared, n = data, data.n_rows
    else:
        prepared = model.prepare(data)
        n = n_rows(prepared)
    if plan is None:
        plan = ex.make_plan(model, resources if resources is not None else ex.default_resources(), n)
    elif resources is not None:
        from emgrid.planner import validate_plan

        validate_plan(plan, model, resources, n)
    check_plan_matches(plan, model, n)
    ex.check_plan(plan)
    return ex.run(FitJob(model=model, data=prepared, plan=plan, max_iter=max_iter, tol=float(tol), callback=callback))


def check_plan_matches(plan: BalancePlan, model: Node, n_data: int) -> None:
    """Raises PlanError unless ``plan`` is a complete grid for this model and these rows."""
    if not isinstance(plan, BalancePlan):
        raise PlanError(f"plan must be a BalancePlan, got {type(plan).__name__}")
    d, m = plan.data_parallel, plan.model_parallel
    if len(plan.model_cuts) != m:
        raise PlanError(f"plan has model_parallel={m} but {len(plan.model_cuts)} model cuts")
    for i, cut in enumerate(plan.model_cuts):
        if cut.shard != i:
            raise PlanError(f"plan's model cut {i} is labelled shard {cut.shard}; cuts must be in shard order")
        if len(cut.workers) != d:
            raise PlanError(f"plan's shard {i} names {len(cut.workers)} workers, one per replica needs {d}")
    names = [w for row in plan.worker_grid() for w in row]
    if len(set(names)) != len(names):
        dup = next(w for w, c in Counter(names).items() if c > 1)
        raise PlanError(f"plan runs two grid cells on worker {dup!r}")
    if plan.workers_used != d * m:
        raise PlanError(f"plan says workers_used={plan.workers_used} but its grid is {d}x{m} = {d * m}")
    held = Counter(leaf for cut in plan.model_cuts for leaf in cut.leaves)
    paths = [p for p, _ in model.leaves()]
    missing = [p for p in paths if held[p] == 0]
    twice = [p for p, c in held.items() if c > 1]
    extra = sorted(set(held) - set(paths))
    if missing or twice or extra:
        what = "; ".join(s for s in (missing and f"leaves on no shard: {missing}",
                                     twice and f"leaves on several shards: {twice}",
                                     extra and f"paths that are not leaves of this model: {extra}") if s)
        raise PlanError(f"plan does not place this model's leaves: {what}")
    if plan.n_data != n_data:
        raise PlanError(f"plan was made for n_data={plan.n_data} rows but the data has {n_data}")
    if len(plan.replica_rows) != d or sum(plan.replica_rows) != n_data or min(plan.replica_rows) < 1:
        raise PlanError(f"plan's replica_rows {list(plan.replica_rows)} must be {d} counts >= 1 summing to {n_data}")
