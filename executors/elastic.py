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
  head included, loses nothing. A model larger than a quarter of the coordinator's free
  memory is refused before the fit starts. The iteration in flight is redone from that model, never
  counted twice: an iteration enters the trace only once its update reached every cell and
  its model was kept.
- **Where it goes on**: ``balance_plan`` (the same exact program, the old plan its hint) on the resources the fit
  was planned for, without the lost cell's worker; the grid the executor makes for that plan
  starts, receives the kept model and runs the iteration again. ``FitResult.replans`` records
  each re-plan (iteration, worker, old and new grid, seconds lost).
- After ``max_replans`` re-plans, or when no plan fits the survivors, the loss ends the fit as
  with ``"fail"`` (a note says why).

Growth: at an iteration's end (at most every :data:`GROW_CHECK_S`), an elastic fit asks the
engine for its workers (:meth:`executors.cellgrid.CellGrid.resources_now`: Dask and Ray
report theirs). When some are new, ``balance_plan`` plans the fit on the old resources plus
them; when that plan's predicted iteration time beats the running plan's by more than
``grow_threshold`` (a share, default 0.2), the fit goes on from the iteration's model on the
new grid (a ``"growth"`` entry of ``FitResult.replans``), else the offer is recorded in
``FitResult.growth_declined`` and not made again for the same workers. Growth is not a
re-plan after a loss: ``max_replans`` does not count it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from time import perf_counter

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError, InfeasiblePlanError
from emgrid.planner.resources import Resources

from . import loop
from .cellgrid import WorkerLost
from .protocol import FitJob

#: ``on_worker_loss`` values.
ON_WORKER_LOSS = ("fail", "replan")
#: Least seconds between two looks for new workers (each asks the engine's scheduler).
GROW_CHECK_S = 1.0


def check_on_worker_loss(on_worker_loss, grow_threshold=0.2) -> None:
    if on_worker_loss not in ON_WORKER_LOSS:
        raise ConfigError(f"on_worker_loss must be one of {', '.join(ON_WORKER_LOSS)}, got {on_worker_loss!r}")
    if grow_threshold is not None and (isinstance(grow_threshold, bool) or not isinstance(grow_threshold, (int, float))
                                       or not 0 <= grow_threshold < 1):
        raise ConfigError(f"grow_threshold must be a number in [0, 1) or None, got {grow_threshold!r}")


class Elastic:
    """The grid of one fit and, when the job asks for it, its re-plans (see the module)."""

    def __init__(self, executor, make_grid: Callable[[FitJob], object], job: FitJob):
        self.executor, self.make_grid, self.job = executor, make_grid, job
        self.active = job.on_worker_loss == "replan"
        if self.active and not loop.fits_here(job.model):
            raise ConfigError(f"on_worker_loss='replan' keeps each iteration's model on the coordinator "
                              f"({loop.param_bytes(job.model)} bytes of parameters), more than a quarter of the "
                              f"memory this machine has free; fit with on_worker_loss='fail' (a checkpoint resumes "
                              f"a lost fit)")
        self.grid = None
        self.replans: list[dict] = []
        self.declined: list[dict] = []
        self._looked = -GROW_CHECK_S  # the first iteration's end looks
        self._offered: frozenset[str] = frozenset()

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

            plan = balance_plan(model, survivors, n_data=old.n_data, previous=old, dtype=old.dtype)
        except (ConfigError, InfeasiblePlanError) as e:
            error.add_note(f"not re-planned: no plan fits the workers left ({e})")
            return False
        self._move(plan, model, survivors, failed=True)
        self.replans.append({"kind": "loss", "iteration": iteration, "worker": error.worker, "reason": str(error),
                             "old_grid": [old.data_parallel, old.model_parallel],
                             "new_grid": [plan.data_parallel, plan.model_parallel],
                             "seconds_lost": perf_counter() - t0})
        return True

    def grow(self, iteration: int, model: Node) -> bool:
        """At the end of ``iteration`` (its model: ``model``): True when the fit moved to a
        grid with workers the engine gained (``self.grid``, started, not yet given a model)."""
        threshold = self.job.grow_threshold
        if not self.active or threshold is None or perf_counter() - self._looked < GROW_CHECK_S:
            return False
        found = self.grid.resources_now()
        self._looked = perf_counter()
        if found is None:
            return False
        old = self.job.plan
        base = self.job.resources
        known = {w.name for w in base.workers} if base is not None else {w for row in old.worker_grid() for w in row}
        new = tuple(w for w in found.workers if w.name not in known)
        names = frozenset(w.name for w in new)
        if not new or names == self._offered:
            return False
        self._offered = names
        t0 = perf_counter()
        grown = found if base is None else base.model_copy(update={"workers": base.workers + new})
        from emgrid.planner import balance_plan

        try:
            plan = balance_plan(model, grown, n_data=old.n_data, previous=old, dtype=old.dtype)
        except (ConfigError, InfeasiblePlanError):
            return False
        said = {"iteration": iteration, "workers": sorted(names), "old_grid": [old.data_parallel, old.model_parallel],
                "new_grid": [plan.data_parallel, plan.model_parallel],
                "predicted_s": plan.predicted_iteration_s, "was_predicted_s": old.predicted_iteration_s}
        if not plan.predicted_iteration_s < (1 - threshold) * old.predicted_iteration_s:
            self.declined.append(said)
            return False
        self._move(plan, model, grown, failed=False)
        self.replans.append({"kind": "growth", **said, "worker": None,
                             "reason": f"{len(new)} new worker(s) ({', '.join(sorted(names))}), predicted "
                                       f"{plan.predicted_iteration_s:.3g} s per iteration instead of "
                                       f"{old.predicted_iteration_s:.3g}",
                             "seconds_lost": perf_counter() - t0})
        return True

    def _move(self, plan, model: Node, resources: Resources, failed: bool) -> None:
        """The fit onto ``plan``'s grid: the old one closed (``failed``: it may be stuck), the
        new one started."""
        self.grid.close(failed)
        self.grid = None
        self.job = replace(self.job, plan=plan, model=model, resources=resources)
        self.start()

    def _survivors(self, lost: str) -> Resources:
        """The resources the fit was planned for, without ``lost``'s worker (the executor's
        own when the plan was given without them)."""
        base = self.job.resources or self.executor.default_resources()
        workers = tuple(w for w in base.workers if w.name != lost)
        if not workers:
            raise ConfigError(f"worker {lost!r} was the only one")
        return base.model_copy(update={"workers": workers})
