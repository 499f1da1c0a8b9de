"""The EM loop as the coordinator runs it, over any transport.

Per iteration: broadcast the model (each shard's workers get their part of it), run the
grid's E-step (compute and coupling on the workers, reduce to the coordinator), stop on
non-finite statistics, run the M-step once, record the phase times and bytes, check
convergence, call the callback. A transport implements :class:`Grid`: how the model
reaches the workers and how their shares come back. A job with several starting models
(a template's ``n_init`` starts) runs them all on the one grid, its workers started once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from time import perf_counter
from typing import Protocol

from emgrid.models import Node, Stats
from emgrid.models.errors import FitError
from emgrid.models.regularize import regularize

from .protocol import FitJob
from .result import FitResult
from .step import WorkerSpec, shard_payloads


@dataclass
class GridOutcome:
    """One E-step of the whole grid, as the coordinator receives it."""

    stats: Stats
    loglik: float
    compute_s: float  # slowest worker's (or, run one after another, the sum)
    coupling_s: float
    reduce_s: float
    coupling_bytes: int
    reduce_bytes: int
    receive_s: float = 0.0  # slowest worker's unpickling of the broadcast model
    peak_bytes: dict[str, int] = field(default_factory=dict)  # per worker name, see executors.memory
    baseline_bytes: dict[str, int] = field(default_factory=dict)


class Grid(Protocol):
    """A transport's side of one fit, as the coordinator drives it."""

    #: ``layout[r][s]``: the spec of every worker (:func:`executors.step.grid_layout`,
    #: computed once per fit, by the transport, which also places its workers with it)
    layout: list[list[WorkerSpec]]

    def broadcast(self, model: Node, payloads: list[bytes]) -> None:
        """Makes ``model`` the model of every worker: ``payloads[s]`` is what the workers of
        shard ``s`` receive (:func:`executors.step.shard_payloads`)."""

    def e_step(self, iteration: int) -> GridOutcome:
        """Runs every worker's step on the current model and reduces their shares."""


def critical_path(shares, wall_s: float) -> dict[str, float]:
    """Phase seconds of a parallel E-step that took ``wall_s`` on the coordinator.

    ``receive_s`` (unpickling the model), ``compute_s`` and ``coupling_s`` are the slowest
    worker's; ``reduce_s`` is what the coordinator waited beyond the busiest worker, plus
    its own summing.
    """
    busiest = max(s.receive_s + s.compute_s + s.coupling_s for s in shares)
    return {"receive_s": max(s.receive_s for s in shares), "compute_s": max(s.compute_s for s in shares),
            "coupling_s": max(s.coupling_s for s in shares), "reduce_s": max(0.0, wall_s - busiest)}


def run_em(grid: Grid, job: FitJob, executor: str) -> FitResult:
    """EM from ``job.model`` until converged or ``job.max_iter`` iterations; with
    ``job.starts``, each start first runs ``job.start_iter`` iterations and the one with the
    highest log-likelihood continues (the others reported in ``init_log_likelihoods``)."""
    if not job.starts:
        return _em(grid, job, job.model, job.max_iter, job.callback, executor, 0, job.previous_log_likelihood)
    t0 = perf_counter()
    refined, done = [], 0
    for start in job.starts:
        refined.append(_em(grid, job, start, job.start_iter, None, executor, done))
        done += refined[-1].iterations
    lls = [r.log_likelihood[-1] for r in refined]
    best = max(range(len(lls)), key=lls.__getitem__)
    refine_s = perf_counter() - t0
    result = _em(grid, job, refined[best].model, job.max_iter, job.callback, executor, done)
    result.init_log_likelihoods, result.init_best, result.init_s = lls, best, refine_s
    return result


def _em(grid: Grid, job: FitJob, model: Node, max_iter: int, callback, executor: str, offset: int,
        previous: float | None = None) -> FitResult:
    """One run of EM on the grid from ``model``; the grid counts its E-steps from ``offset``;
    ``previous`` is the log-likelihood of the iteration before ``model``, if any."""
    result = FitResult(model=model, plan=job.plan, executor=executor)
    layout = grid.layout
    for it in range(1, max_iter + 1):
        t_start = perf_counter()
        payloads = shard_payloads(model, layout)
        grid.broadcast(model, payloads)
        broadcast_bytes = len(layout) * sum(len(p) for p in payloads)
        del payloads  # not held through the E-step
        t_bcast = perf_counter()
        out = grid.e_step(offset + it)
        check_finite(model, out, it)
        t_m = perf_counter()
        new_model = model.estimate(regularize(model, out.stats, job.regularization))
        t_end = perf_counter()
        result.timings.append({
            "broadcast": t_bcast - t_start + out.receive_s, "compute": out.compute_s, "coupling": out.coupling_s,
            "reduce": out.reduce_s, "mstep": t_end - t_m, "total": t_end - t_start,
        })
        result.bytes_moved.append({
            "broadcast": broadcast_bytes, "compute": 0, "coupling": out.coupling_bytes,
            "reduce": out.reduce_bytes, "mstep": 0,
        })
        for name, peak in out.peak_bytes.items():
            result.worker_peak_bytes[name] = max(peak, result.worker_peak_bytes.get(name, 0))
        result.worker_baseline_bytes.update(out.baseline_bytes)
        ll = out.loglik
        result.log_likelihood.append(ll)
        result.iterations = it
        result.model = model = new_model
        result.converged = previous is not None and abs(ll - previous) <= job.tol * abs(ll)
        if callback is not None:
            callback(it, ll, result)
        if result.converged:
            break
        previous = ll
    return result


def check_finite(model: Node, out: GridOutcome, it: int) -> None:
    """Stops the fit when the log-likelihood or some node's statistics are not finite."""
    path = out.stats.first_nonfinite()
    if path is not None:
        node = model.node_at(path)
        raise FitError(f"iteration {it}: the statistics of node {path or '<root>'!r} ({node.describe()}) "
                       f"are not finite; the model's parameters or the data make its E-step overflow")
    if not math.isfinite(out.loglik):
        raise FitError(f"iteration {it}: the log-likelihood is {out.loglik}; some row has zero density "
                       f"under the current model")
