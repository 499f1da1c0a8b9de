"""What a fit returns: the fitted model, its log-likelihood trace, and where the time went."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emgrid.models import Node
from emgrid.planner.plan import BalancePlan

if TYPE_CHECKING:
    from .mstep import Shards

#: Phases of one EM iteration, in the order they run.
PHASES = ("broadcast", "compute", "coupling", "reduce", "mstep")


@dataclass
class FitResult:
    """The outcome of :func:`executors.optimize`.

    - ``model``: the model after the last M-step, gathered from the shards' heads when it
      fits in this process (``FitJob.gather``; else None).
    - ``shards``: the same model as it sits on the grid (:class:`executors.mstep.Shards`):
      the spanning nodes here, each shard's subtrees fetched from its head one at a time
      (``shards.gather()``, or ``for s, subtrees in shards``). Valid while the executor's
      workers are alive (inside a callback) and, once ``model`` is gathered, after.
    - ``log_likelihood``: one total per iteration, each the log-likelihood of the data under
      the model that iteration's E-step used (so it is non-decreasing for exact EM).
    - ``iterations``: number of E-steps run (``len(log_likelihood)``).
    - ``converged``: whether ``|ll_t - ll_{t-1}| <= tol * |ll_t|`` stopped the loop.
    - ``timings``: per iteration, seconds per phase on the critical path (``PHASES``) plus
      ``total``, the coordinator's wall time of the iteration. ``compute`` and ``coupling``
      are the slowest worker's (the sum over workers for the in-process executor, which
      runs them one after another); ``reduce`` is the coordinator's wait beyond the slowest
      worker's E-step plus the summing.
    - ``bytes_moved``: per iteration, the payload of each phase, defined alike on every
      executor: ``coupling`` = per-row log densities each shard ships to its replica (each
      counted once; ``rows * models.coupling_bytes_per_row`` per replica), ``reduce`` = the
      pickled statistics of every worker, ``broadcast`` = the pickled model (once),
      ``compute`` and ``mstep`` = 0. Pickled sizes can differ between executors by a few
      bytes per array (pickle memoizes objects shared within one payload).
    - ``plan``: the plan that ran; ``executor``: the executor's registry name.
    - ``worker_peak_bytes``: per worker name, its peak resident memory during the fit
      *above its baseline* (the RSS it had after its imports, before it opened its rows),
      comparable with the plan's ``per_worker[i].memory_bytes``; ``worker_baseline_bytes``:
      that baseline. The ``local`` executor reports its own process under ``"local"``.
      :mod:`executors.memory` says exactly what each executor's baseline holds.
    - For a fit from a template: ``init_log_likelihoods``, per start, its log-likelihood
      after the refining iterations (the last E-step's); ``init_best``, the start that
      continued (the highest); ``init_s``, seconds from the first start's seeding to the
      last start's refinement; ``init_seeding_s``, the part of it spent seeding (sampling
      rows, k-means, the leaves' first M-steps). Empty, None and 0 for a warm start.
      ``init_traces``: per start, the log-likelihood of each of its refining iterations (in
      start order; its last entry is ``init_log_likelihoods``' one; a start equal to an
      earlier one, refined once, repeats that one's trace). ``n_init``: the number of starts.
    - ``replans``: each re-plan of an elastic fit (``on_worker_loss="replan"``,
      ``executors.elastic``), its ``kind``: ``"loss"`` (the iteration redone, the lost
      worker, why, the old and new grid, the seconds from the loss to the new grid's start)
      or ``"growth"`` (the iteration after which the fit moved onto new workers, which, the
      grids, both plans' predicted seconds per iteration, the seconds the move took); empty
      otherwise. ``plan`` is then the last grid's. ``growth_declined``: new workers an
      elastic fit did not take, as a growth entry (its plan did not beat ``grow_threshold``).
    - ``start``: inside ``optimize``'s ``init_callback``, the index of the start being
      refined (0-based, of ``n_init``); None in the final run and in the returned result.
    """

    model: Node | None
    log_likelihood: list[float] = field(default_factory=list)
    iterations: int = 0
    converged: bool = False
    timings: list[dict[str, float]] = field(default_factory=list)
    bytes_moved: list[dict[str, int]] = field(default_factory=list)
    plan: BalancePlan | None = None
    executor: str = ""
    worker_peak_bytes: dict[str, int] = field(default_factory=dict)
    worker_baseline_bytes: dict[str, int] = field(default_factory=dict)
    init_log_likelihoods: list[float] = field(default_factory=list)
    init_best: int | None = None
    init_s: float = 0.0
    init_seeding_s: float = 0.0
    init_traces: list[list[float]] = field(default_factory=list)
    n_init: int = 0
    start: int | None = None
    replans: list[dict] = field(default_factory=list)
    growth_declined: list[dict] = field(default_factory=list)
    shards: "Shards | None" = field(default=None, repr=False)
    #: ``models.diagnose.fit_warnings`` of a model left on the grid (read before its workers stopped)
    warnings: list[str] = field(default_factory=list)

    def mean_timings(self, skip_first: bool = True) -> dict[str, float]:
        """Mean seconds per phase over the iterations (the first left out when there are others)."""
        rows = self.timings[1:] if skip_first and len(self.timings) > 1 else self.timings
        if not rows:
            return {}
        return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}

    def __repr__(self) -> str:
        last = f"{self.log_likelihood[-1]:.6g}" if self.log_likelihood else "none"
        grid = f"{self.plan.data_parallel}x{self.plan.model_parallel}" if self.plan else "?"
        return (f"FitResult(executor={self.executor!r}, grid={grid}, iterations={self.iterations}, "
                f"converged={self.converged}, log_likelihood[-1]={last})")
