"""``optimize``: complete a template's shapes, plan when needed, check the plan, start from
the data (a template) or the given model, and run EM on the chosen executor."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from pathlib import Path
from time import perf_counter

from emgrid.models import Node, n_rows
from emgrid.models.data import check_dtype, with_dtype
from emgrid.models.diagnose import fit_warnings
from emgrid.models.errors import ConfigError, ConvergenceWarning
from emgrid.models.init import INIT_METHODS, check_init, complete_shapes, initialize
from emgrid.models.regularize import Regularization
from emgrid.models.starts import distinct_starts, per_start
from emgrid.models.tables import as_table, bind, is_table
from emgrid.planner.check import check_plan_figures, check_plan_structure
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources
from emgrid.planner.validate import validate_plan

from .datafiles import NpyDataset, table_scratch
from .elastic import check_on_worker_loss
from .spark_data import SparkFrame, is_spark_frame
from .protocol import Callback, Executor, FitJob
from .registry import get
from .result import FitResult

DEFAULT_MAX_ITER = 100
DEFAULT_TOL = 1e-6
#: EM iterations that refine each start of a template before the best one continues.
DEFAULT_INIT_ITER = 10


def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def optimize(data, model: Node, *, plan: BalancePlan | None = None, resources: Resources | None = None,
             executor: str | Executor = "local", max_iter: int = DEFAULT_MAX_ITER, tol: float = DEFAULT_TOL,
             callback: Callback | None = None, n_init: int = 1, seed: int = 0, init: str = "auto",
             init_iter: int = DEFAULT_INIT_ITER, reg_covar: float = 0.0, pseudo_count: float = 0.0,
             previous_log_likelihood: float | None = None, gather: bool | None = None,
             init_callback: Callback | None = None, on_worker_loss: str = "fail",
             max_replans: int = 3, grow_threshold: float | None = 0.2, dtype: str = "float64") -> FitResult:
    """Fits ``model`` to ``data`` by EM on a ``D x M`` grid of workers.

    - ``model``: a complete model is the starting point (a warm start). A template (some
      parameter unset, see ``Node.is_template``) is completed from the data: its shapes
      first (``models.complete_shapes``, before planning), then ``n_init`` starts, each
      seeded from ``(seed, start)`` on a bounded sample of rows (``models.initialize``;
      ``init`` = ``"auto"``, ``"kmeans"`` or ``"random"``) and refined by ``init_iter`` EM
      iterations on the same executor and plan (a start equal to an earlier one, up to the
      order of mixture components, is refined once: ``models.starts``); the start with the
      highest log-likelihood continues for ``max_iter`` iterations
      (``FitResult.init_log_likelihoods`` reports every start, ``FitResult.init_traces``
      each start's trace).

    - ``data``: anything ``model.prepare`` accepts, or an :class:`NpyDataset` on disk (then
      every worker maps only its own rows). A table (``models.tables``) is read by column
      name; its categorical columns give the model's value lists (``models.tables.bind``),
      and a ``.parquet`` or ``.csv`` file becomes a dataset whose workers read only their
      rows (``NpyDataset.from_table``), unless ``drop_missing`` asks to read it whole.
    - ``plan``: the grid and placement to run; without one, the executor plans for
      ``resources`` (default: what the executor has at hand, e.g. this machine's cores).
      A given plan is checked against the model and data, and against ``resources`` when
      they are given too; the executor refuses one it cannot realize before any work.
    - ``executor``: ``"local"``, ``"multiprocessing"``, ``"mpi"``, ``"dask"``, ``"ray"``,
      ``"spark"`` or an executor instance. A Spark DataFrame (or a ``.parquet`` path with
      ``"spark"``) is read where it lives by the Spark executor (``executors.spark_data``).
      Under ``mpiexec`` every rank calls ``optimize`` with the same arguments.
    - Stops when ``|ll_t - ll_{t-1}| <= tol * |ll_t|`` or after ``max_iter`` iterations;
      ``callback(iteration, log_likelihood, result_so_far)`` runs after each iteration of
      the final run (not the refinement of the starts); ``init_callback``, with the same
      arguments, after each refining iteration of each start, its ``result_so_far.start``
      the start's index (0-based) of ``result_so_far.n_init`` and ``iteration`` counted
      within the start (a start equal to an earlier one is not refined again: its index is
      skipped).
    - ``previous_log_likelihood``: the log-likelihood of the iteration before ``model`` (a
      resumed fit's last), so the first iteration's convergence test compares against it.
    - ``on_worker_loss``: ``"fail"`` (default) ends the fit when a worker is lost;
      ``"replan"`` re-plans on the workers left and goes on from the last completed
      iteration, up to ``max_replans`` times (``executors.elastic``; multiprocessing, Dask,
      Ray and Spark: an MPI job ends with any of its ranks). ``FitResult.replans`` lists them.
      An elastic fit also moves onto workers a Dask or Ray cluster gains, at an iteration's
      end, when their plan's predicted iteration time is more than ``grow_threshold`` (a
      share, default 0.2; None: never) below the running plan's.
    - ``dtype``: ``"float64"`` (default) or ``"float32"``, the float type of the data the
      workers hold and of the E-step's products (the Gaussian families' kernels run in
      float32; the others promote to float64 where a float64 parameter enters). Every sum
      that makes a statistic or the log-likelihood is float64 (a float32 product sums at
      most ``models.kernels.MAX_GEMM_COLS`` rows before it is added in float64), and the
      starts are seeded from the float64 data. Executors and plans agree exactly as in
      float64 on one grid; different grids agree to float32's rounding.
    - ``gather``: whether the fitted model is gathered into ``FitResult.model`` (None: when it
      fits in memory, ``executors.loop.fits_here``); it is always in ``FitResult.shards``.
    - ``reg_covar`` (added to every fitted variance and covariance diagonal) and
      ``pseudo_count`` (added to every count behind a probability) regularize each M-step
      (``models.regularize``); 0, the default, leaves the fit as the floors make it.
    - Warns (``models.errors.ConvergenceWarning``) when ``max_iter`` ends the fit unconverged
      (with ``tol > 0``) and for each collapsed component or variance at its floor (``models.diagnose``).
    """
    ex = get(executor) if isinstance(executor, str) else executor
    if not isinstance(ex, Executor):
        raise ConfigError(f"executor must be a name or an Executor, got {type(executor).__name__}")
    if not isinstance(model, Node):
        raise ConfigError(f"model must be a model node (see models.from_spec), got {type(model).__name__}")
    _check_count(max_iter, "max_iter", 1)
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not tol >= 0:
        raise ConfigError(f"tol must be a number >= 0, got {tol!r}")
    _check_count(n_init, "n_init", 1)
    _check_count(seed, "seed", 0)
    _check_count(init_iter, "init_iter", 1)
    if init not in INIT_METHODS:
        raise ConfigError(f"init must be one of {', '.join(INIT_METHODS)}, got {init!r}")
    check_on_worker_loss(on_worker_loss, grow_threshold)
    _check_count(max_replans, "max_replans", 0)
    dtype = check_dtype(dtype)
    if on_worker_loss == "replan" and ex.name in ("local", "mpi"):
        raise ConfigError(f"on_worker_loss='replan' needs an executor whose workers can be lost and replaced "
                          f"(multiprocessing, dask, ray, spark), not {ex.name!r}"
                          + (": an MPI job ends with any of its ranks" if ex.name == "mpi" else ""))
    elastic = {"on_worker_loss": on_worker_loss, "max_replans": max_replans, "grow_threshold": grow_threshold}
    reg = Regularization(reg_covar=reg_covar, pseudo_count=pseudo_count)
    reg = reg if reg.active else None
    with ex.opened() if hasattr(ex, "opened") else nullcontext():
        if hasattr(ex, "adopt"):  # data the executor reads in its own form (a Spark DataFrame)
            data, model = ex.adopt(data, model)
        elif is_spark_frame(data):
            raise ConfigError(f"a Spark DataFrame is fitted where it lives with executor='spark' (this executor is "
                              f"{ex.name!r}); or bring it here first with df.toPandas()")
        table = as_table(data) if is_table(data) else None
        if table is not None:
            model = bind(model, data)
        on_disk = table is not None and isinstance(table.source, (str, Path)) and not table.drop_missing
        # a file table: each worker reads its rows; its folder is named for this process (a run after a kill removes it)
        with table_scratch() if on_disk else nullcontext() as scratch:
            if scratch is not None:
                data = NpyDataset.from_table(table, model, scratch)
            result = _optimize(data, model, plan, resources, ex, max_iter, tol, callback, n_init, seed, init, init_iter,
                               reg, previous_log_likelihood, gather, init_callback, elastic, dtype)
    warn_about(result, max_iter, tol)
    return result


def _optimize(data, model, plan, resources, ex, max_iter, tol, callback, n_init, seed, init, init_iter, reg,
              previous_log_likelihood, gather=None, init_callback=None, elastic=None, dtype="float64"):
    if isinstance(data, (NpyDataset, SparkFrame)):
        prepared, n = data, data.n_rows
    else:
        prepared = model.prepare(data)
        n = n_rows(prepared)
    opened = None
    if model.is_template:  # a complete model's rows are opened by its workers only
        opened = prepared.open(lazy=True) if isinstance(prepared, NpyDataset) else prepared
        if not isinstance(prepared, SparkFrame):  # its shapes were completed when it was bound
            model = complete_shapes(model, opened)
    check_init(model, init)
    if plan is None:
        resources = resources if resources is not None else ex.default_resources()
        plan = ex.make_plan(model, resources, n, dtype)
    else:
        if plan.dtype != dtype:
            raise ConfigError(f"the plan was made for dtype={plan.dtype!r}, but this fit asks for dtype={dtype!r}; "
                              f"plan with balance_plan(..., dtype={dtype!r}) or fit with dtype={plan.dtype!r}")
        if resources is not None:
            validate_plan(plan, model, resources, n)
    check_plan_structure(plan, model, n, strict=False)
    if resources is None:
        check_plan_figures(plan)
    ex.check_plan(plan)
    starts: tuple[Node, ...] = ()
    repeats: list[int] = []
    t0 = perf_counter()
    if model.is_template:  # every rank seeds alike; the coordinator's starts run, each distinct one once
        kept, repeats = distinct_starts(initialize(model, opened, n, seed=seed, start=s, init=init)
                                        for s in range(n_init))
        starts, model = tuple(kept), kept[0]
    seeding_s = perf_counter() - t0
    if not isinstance(prepared, (NpyDataset, SparkFrame)):  # those are cast block by block
        prepared = with_dtype(prepared, dtype)
    result = ex.run(FitJob(model=model, data=prepared, plan=plan, max_iter=max_iter, tol=float(tol), callback=callback,
                           regularization=reg, starts=starts, start_iter=init_iter, init_callback=init_callback,
                           start_index=tuple(repeats.index(k) for k in range(len(starts))),
                           n_init=n_init if starts else 0,
                           previous_log_likelihood=previous_log_likelihood, gather=gather, resources=resources,
                           dtype=dtype,
                           **(elastic or {})))
    if starts:
        result.init_log_likelihoods, result.init_best = per_start(result.init_log_likelihoods, result.init_best,
                                                                  repeats)
        result.init_traces = per_start(result.init_traces, None, repeats)[0]
        result.init_seeding_s = seeding_s
        result.init_s += seeding_s
    return result


def warn_about(result: FitResult, max_iter: int, tol: float) -> None:
    """Emits a ConvergenceWarning per finding of a finished fit (one line each); ``tol=0``
    asks for exactly ``max_iter`` iterations, so it ends no fit unconverged."""
    if not result.converged and tol > 0:
        trace = result.log_likelihood
        change = f"; the last change was {abs(trace[-1] - trace[-2]):.3g}" if len(trace) > 1 else ""
        warnings.warn(f"not converged after max_iter={max_iter} iterations (tol={tol:g}{change}); continue it "
                      "with optimize(data, result.model, previous_log_likelihood=result.log_likelihood[-1]) "
                      "or raise max_iter", ConvergenceWarning, stacklevel=3)
    for line in fit_warnings(result.model) if result.model is not None else result.warnings:
        warnings.warn(line, ConvergenceWarning, stacklevel=3)
