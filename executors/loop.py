"""The EM loop as the coordinator runs it, over any transport.

The starting model goes to the workers once (each shard's workers get their part of it).
Per iteration: the grid's E-step (compute and coupling on the workers), each shard's
statistics reduced over its column and its subtrees estimated by the column's head
(:mod:`executors.mstep`); then here: stop on non-finite statistics, estimate the spanning
nodes (the skeleton, all the coordinator holds of the model), send the update, record the
phase times and bytes, check convergence, call the callback. A transport implements
:class:`Grid`: how the model reaches the workers and how their shares and reports move. A
job with several starting models (a template's ``n_init`` starts) runs them all on the one
grid, its workers started once.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from time import perf_counter
from typing import Protocol

from emgrid.models import Node
from emgrid.models.errors import FitError

from .mstep import ColumnReport, Shards, join_columns, skeleton_payload, skeleton_m_step

from .protocol import FitJob
from .result import FitResult
from .step import ShardPayloads, WorkerSpec


@dataclass
class GridOutcome:
    """One E-step of the whole grid and its columns' M-steps, as the coordinator receives them."""

    columns: list[ColumnReport]  # by shard
    compute_s: float  # slowest worker's (or, run one after another, the sum)
    coupling_s: float
    reduce_s: float  # the column reduces and the reports' way to the coordinator
    coupling_bytes: int
    reduce_bytes: int  # the columns' statistics moved to their heads, plus the reports
    receive_s: float = 0.0  # slowest worker's unpickling of the broadcast model
    peak_bytes: dict[str, int] = field(default_factory=dict)  # per worker name, see executors.memory
    baseline_bytes: dict[str, int] = field(default_factory=dict)


class Grid(Protocol):
    """A transport's side of one fit, as the coordinator drives it."""

    #: ``layout[r][s]``: the spec of every worker (:func:`executors.step.grid_layout`,
    #: computed once per fit, by the transport, which also places its workers with it)
    layout: list[list[WorkerSpec]]

    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        """Makes ``model`` the model of every worker, at the start of a run: ``payloads[s]``
        is what the workers of shard ``s`` receive (:class:`executors.step.ShardPayloads`, made as they are asked for)."""

    def e_step(self, iteration: int) -> GridOutcome:
        """Runs every worker's step on its current part, reduces each shard's statistics over
        its column to its head and runs the head's M-step (:meth:`ShardPart.estimate`)."""

    def update(self, skeleton: Node, payload: bytes) -> int:
        """The next model: ``skeleton`` (pickled: ``payload``) to every worker, each head's
        pending subtrees to the other workers of its column (:meth:`ShardPart.apply`).
        Returns the bytes sent."""

    def fetch(self, shard: int) -> dict[str, Node]:
        """Shard ``shard``'s current subtrees, from its head (:meth:`ShardPart.owned`)."""


def critical_path(shares, wall_s: float) -> dict[str, float]:
    """Phase seconds of a parallel E-step that took ``wall_s`` on the coordinator.

    ``receive_s`` (unpickling the model), ``compute_s`` and ``coupling_s`` are the slowest
    worker's; ``reduce_s`` is what the coordinator waited beyond the busiest worker, plus
    its own summing.
    """
    busiest = max(s.receive_s + s.compute_s + s.coupling_s for s in shares)
    return {"receive_s": max(s.receive_s for s in shares), "compute_s": max(s.compute_s for s in shares),
            "coupling_s": max(s.coupling_s for s in shares), "reduce_s": max(0.0, wall_s - busiest)}


def run_em(grid: Grid, job: FitJob, executor: str, elastic=None) -> FitResult:
    """EM from ``job.model`` until converged or ``job.max_iter`` iterations; with
    ``job.starts``, each start first runs ``job.start_iter`` iterations and the one with the
    highest log-likelihood continues (the others reported in ``init_log_likelihoods``).
    ``elastic`` (:class:`executors.elastic.Elastic`): the grid's re-plans after a lost cell,
    which replace ``grid`` (its ``grid`` is the current one)."""
    if not job.starts:
        return _em(grid, job, job.model, job.max_iter, job.callback, executor, 0, job.previous_log_likelihood,
                   elastic=elastic)
    t0 = perf_counter()
    refined, done = [], 0
    index = job.start_index or tuple(range(len(job.starts)))
    n_init = job.n_init or len(job.starts)
    for k, start in enumerate(job.starts):  # the starts are whole models here already, and so are they refined
        grid = elastic.grid if elastic is not None else grid
        refined.append(_em(grid, job, start, job.start_iter, job.init_callback, executor, done, gather=True,
                           start=(index[k], n_init), elastic=elastic))
        done += refined[-1].iterations
    lls = [r.log_likelihood[-1] for r in refined]
    best = max(range(len(lls)), key=lls.__getitem__)
    refine_s = perf_counter() - t0
    grid = elastic.grid if elastic is not None else grid
    result = _em(grid, job, refined[best].model, job.max_iter, job.callback, executor, done, elastic=elastic)
    result.init_log_likelihoods, result.init_best, result.init_s = lls, best, refine_s
    result.init_traces, result.n_init = [list(r.log_likelihood) for r in refined], n_init
    return result


@contextmanager
def _counted_as(grid_iteration: int, it: int, start: tuple[int, int] | None):
    """A worker's failure named by the iteration the user counts: the grid counts its E-steps
    across the starts' refinements and the fit, a checkpoint and the trace count the fit's."""
    try:
        yield
    except FitError as e:
        where = f"in iteration {it}" + ("" if start is None else f" of start {start[0] + 1}/{start[1]}'s refinement")
        text = str(e).replace(f"in iteration {grid_iteration}", where)
        if text != str(e):
            e.args = (text,)
        raise


def _em(grid: Grid, job: FitJob, model: Node, max_iter: int, callback, executor: str, offset: int,
        previous: float | None = None, gather: bool | None = None,
        start: tuple[int, int] | None = None, elastic=None) -> FitResult:
    """One run of EM on the grid from ``model``; the grid counts its E-steps from ``offset``;
    ``previous`` is the log-likelihood of the iteration before ``model``, if any. The fitted
    model is gathered into ``result.model`` when ``gather`` (default ``job.gather``) says so.
    ``start``: ``(index, n_init)`` of the start this run refines, which the callback reads in
    ``result.start`` and ``result.n_init``. With an active ``elastic``, each iteration's model
    is kept here once its update is done, and a lost cell's iteration is redone from the last
    one kept on the grid re-planned without it (:mod:`executors.elastic`)."""
    gather = job.gather if gather is None else gather
    if gather is None:
        gather = fits_here(model)
    keeping = elastic is not None and elastic.active
    result = FitResult(model=model, plan=job.plan, executor=executor)
    if start is not None:
        result.start, result.n_init = start

    def begin(grid: Grid, model: Node):
        """The run's model to every cell of ``grid``: its view, skeleton, bytes and seconds."""
        t0 = perf_counter()
        layout = grid.layout
        view = layout[0][0].view
        payloads = ShardPayloads(model, layout)
        grid.broadcast(model, payloads)
        sent = len(layout) * sum(payloads.size(s) for s in range(len(payloads)))
        return view, view.skeleton(model), sent, perf_counter() - t0

    def moved(grid: Grid):
        """After a re-plan: the result names the new plan, and the kept model goes to ``grid``."""
        result.plan = elastic.job.plan
        result.replans = list(elastic.replans)
        result.growth_declined = list(elastic.declined)
        return begin(grid, kept)

    view, skeleton, sent, bcast_s = begin(grid, model)
    result.shards = Shards.held(view, model)
    kept = model if keeping else None
    del model  # the workers hold the model now; this process keeps the skeleton (and, elastic, a copy)
    result.model = None
    it = 1
    while it <= max_iter:
        t_start = perf_counter() - bcast_s
        try:
            with _counted_as(offset + it, it, start):
                out = grid.e_step(offset + it)
                spanning, ll, bad = join_columns(out.columns)
                check_finite(bad, ll, it)
                t_m = perf_counter()
                new_skeleton = skeleton_m_step(skeleton, spanning, job.regularization)
                t_u = perf_counter()
                sent += grid.update(new_skeleton, skeleton_payload(new_skeleton))
                if keeping:  # the iteration's model, kept before the iteration counts
                    kept_now = Shards(view, new_skeleton, grid.fetch).gather()
                    sent += param_bytes(kept_now)
        except FitError as e:
            if not keeping or not elastic.recover(e, it, kept):
                raise
            grid, (view, skeleton, sent, bcast_s) = elastic.grid, moved(elastic.grid)
            continue  # the same iteration, on the new grid
        skeleton = new_skeleton
        if keeping:
            kept = kept_now
        t_end = perf_counter()
        result.timings.append({
            "broadcast": bcast_s + t_end - t_u + out.receive_s, "compute": out.compute_s, "coupling": out.coupling_s,
            "reduce": out.reduce_s, "mstep": t_u - t_m + max(c.mstep_s for c in out.columns), "total": t_end - t_start,
        })
        result.bytes_moved.append({
            "broadcast": sent, "compute": 0, "coupling": out.coupling_bytes, "reduce": out.reduce_bytes, "mstep": 0,
        })
        sent, bcast_s = 0, 0.0
        for name, peak in out.peak_bytes.items():
            result.worker_peak_bytes[name] = max(peak, result.worker_peak_bytes.get(name, 0))
        result.worker_baseline_bytes.update(out.baseline_bytes)
        result.log_likelihood.append(ll)
        result.iterations = it
        result.shards = Shards(view, skeleton, grid.fetch)
        result.converged = previous is not None and abs(ll - previous) <= job.tol * abs(ll)
        if callback is not None:
            callback(it, ll, result)
        if result.converged:
            break
        previous = ll
        if keeping and it < max_iter and elastic.grow(it, kept):  # the next iteration on the grown grid
            grid, (view, skeleton, sent, bcast_s) = elastic.grid, moved(elastic.grid)
        it += 1
    if keeping:
        result.growth_declined = list(elastic.declined)
    if gather:
        result.model = kept if keeping and result.iterations else result.shards.gather()
        result.shards = Shards.held(view, result.model)
    else:  # read while the workers hold the model
        result.warnings = result.shards.warnings()
    return result


def param_bytes(model: Node) -> int:
    """The bytes of the model's parameters."""
    return sum(a.nbytes for _, node in model.nodes() for a in node.params().values())


def fits_here(model: Node) -> bool:
    """Whether the whole model takes at most a quarter of the memory this machine has free
    (``MemAvailable``; True where it cannot be read)."""
    need = param_bytes(model)
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return True
    return 4 * need <= free


def check_finite(bad: tuple[str, str] | None, loglik: float, it: int) -> None:
    """Stops the fit when some node's statistics or the log-likelihood are not finite
    (``bad``: the first such node's path and description, :func:`executors.mstep.join_columns`)."""
    if bad is not None:
        path, described = bad
        raise FitError(f"iteration {it}: the statistics of node {path or '<root>'!r} ({described}) "
                       f"are not finite; the model's parameters or the data make its E-step overflow")
    if not math.isfinite(loglik):
        raise FitError(f"iteration {it}: the log-likelihood is {loglik}; some row has zero density "
                       f"under the current model")
