"""Elastic fits: a lost cell is re-planned around, not fatal (``on_worker_loss = "replan"``).

The rule, for every executor whose workers are the cells of a :class:`executors.cellgrid.CellGrid`
(multiprocessing, Dask, Ray, Spark):

- **What counts as a loss**: a cell whose process or actor is gone
  (:class:`executors.cellgrid.WorkerLost`: a death, or a peer's report that its link to the
  cell broke). A cell's own error (bad data, a bug) would recur on any grid and ends the fit;
  so does a timeout.
- **What the fit restarts from**: the model of the last completed iteration, which the
  coordinator keeps while it runs elastic: after each iteration's update it gathers the
  shards' new subtrees from the heads (the bytes of the model once per iteration, counted in
  ``bytes_moved["broadcast"]``), so a loss at any moment of the next iteration, a column's
  head included, loses nothing. The iteration in flight is redone from that model, never
  counted twice: an iteration enters the trace only once its update reached every cell and
  its model was kept.
- **Where it goes on**: ``balance_plan`` (the same exact program, the old plan its hint) on the resources the fit
  was planned for, without the lost cell's worker; the grid the executor makes for that plan
  starts, receives the kept model and runs the iteration again. ``FitResult.replans`` records
  each re-plan (iteration, worker, old and new grid, seconds lost).
- After ``max_replans`` re-plans, or when no plan fits the survivors, the loss ends the fit as
  with ``"fail"`` (a note says why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from time import perf_counter

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError, InfeasiblePlanError
from emgrid.planner.resources import Resources

from .cellgrid import WorkerLost
from .protocol import FitJob

#: ``on_worker_loss`` values.
ON_WORKER_LOSS = ("fail", "replan")


def check_on_worker_loss(on_worker_loss, max_replans) -> None:
    if on_worker_loss not in ON_WORKER_LOSS:
        raise ConfigError(f"on_worker_loss must be one of {', '.join(ON_WORKER_LOSS)}, got {on_worker_loss!r}")
    if isinstance(max_replans, bool) or not isinstance(max_replans, int) or max_replans < 0:
        raise ConfigError(f"max_replans must be an integer >= 0, got {max_replans!r}")


class Elastic:
    """The grid of one fit and, when the job asks for it, its re-plans (see the module)."""

    def __init__(self, executor, make_grid: Callable[[FitJob], object], job: FitJob):
        self.executor, self.make_grid, self.job = executor, make_grid, job
        self.active = job.on_worker_loss == "replan"
        self.grid = None
        self.replans: list[dict] = []

    def start(self) -> None:
        self.grid = self.make_grid(self.job)
        self.grid.start()
        self.executor.worker_pids = self.grid.pids

    def close(self, failed: bool) -> None:
        if self.grid is not None:
            self.grid.close(failed)

    def recover(self, error: FitError, iteration: int, model: Node) -> bool:
        """After ``error`` in ``iteration`` (the model it started from: ``model``): True when
        the fit goes on, on a new grid (``self.grid``, started, not yet given a model); False
        when the error ends the fit (a note on it says why, when it was a loss)."""
        if not self.active or not isinstance(error, WorkerLost):
            return False
        if len(self.replans) >= self.job.max_replans:
            error.add_note(f"not re-planned: the fit re-planned max_replans={self.job.max_replans} time(s) already")
            return False
        t0 = perf_counter()
        old = self.job.plan
        try:
            survivors = self._survivors(error.worker)
            from emgrid.planner import balance_plan

            plan = balance_plan(model, survivors, n_data=old.n_data, previous=old)
        except (ConfigError, InfeasiblePlanError) as e:
            error.add_note(f"not re-planned: no plan fits the workers left ({e})")
            return False
        self.grid.close(True)
        self.grid = None
        self.job = replace(self.job, plan=plan, model=model, resources=survivors)
        self.start()
        self.replans.append({"iteration": iteration, "worker": error.worker, "reason": str(error),
                             "old_grid": [old.data_parallel, old.model_parallel],
                             "new_grid": [plan.data_parallel, plan.model_parallel],
                             "seconds_lost": perf_counter() - t0})
        return True

    def _survivors(self, lost: str) -> Resources:
        """The resources the fit was planned for, without ``lost``'s worker (the executor's
        own when the plan was given without them)."""
        base = self.job.resources or self.executor.default_resources()
        workers = tuple(w for w in base.workers if w.name != lost)
        if not workers:
            raise ConfigError(f"worker {lost!r} was the only one")
        return base.model_copy(update={"workers": workers})
