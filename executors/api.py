"""``optimize``: plan when needed, check the plan, and run EM on the chosen executor."""

from __future__ import annotations

from emgrid.models import Node, n_rows
from emgrid.models.errors import ConfigError
from emgrid.planner.check import check_plan_structure
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources
from emgrid.planner.validate import validate_plan

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
        validate_plan(plan, model, resources, n)
    check_plan_structure(plan, model, n, strict=False)
    ex.check_plan(plan)
    return ex.run(FitJob(model=model, data=prepared, plan=plan, max_iter=max_iter, tol=float(tol), callback=callback))
