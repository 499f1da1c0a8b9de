"""The contract every executor keeps, and the one fit request they all receive."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, Union, runtime_checkable

from emgrid.models import Node, take_rows
from emgrid.models.data import Data
from emgrid.models.errors import ConfigError
from emgrid.models.regularize import Regularization
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources

from .datafiles import NpyDataset
from .result import FitResult
from .threads import DEFAULT_BLAS_THREADS, check_blas_threads, limited

#: Called after every iteration with ``(iteration, log_likelihood, result_so_far)``.
Callback = Callable[[int, float, FitResult], None]


@dataclass(frozen=True)
class FitJob:
    """One fit: the starting model, the prepared data, the plan and the stopping rule."""

    model: Node
    data: Union[Data, NpyDataset]  # prepared data in memory, or a dataset on disk
    plan: BalancePlan
    max_iter: int
    tol: float
    callback: Callback | None = None
    #: pseudo-statistics added before each M-step (``models.regularize``); None: none
    regularization: Regularization | None = None
    #: starting models of one structure (``model`` is the first): each runs ``start_iter``
    #: iterations, then the best continues for ``max_iter`` (``executors.loop.run_em``)
    starts: tuple[Node, ...] = ()
    start_iter: int = 0
    #: called after every refining iteration of each start (:data:`Callback`; the result so
    #: far names the start: ``FitResult.start`` of ``FitResult.n_init``); None: not called
    init_callback: Callback | None = None
    #: per start of ``starts``, its index among the ``n_init`` seeded ones (a start equal to
    #: an earlier one is refined once, ``models.starts``); empty: ``0, 1, ...``
    start_index: tuple[int, ...] = ()
    #: the number of seeded starts (``len(starts)`` when none coincided)
    n_init: int = 0
    #: the log-likelihood of the iteration before ``model`` (a resumed fit's last), or None
    previous_log_likelihood: float | None = None
    #: whether the fitted model is gathered into ``FitResult.model``; None: when it fits
    #: (:func:`executors.loop.fits_here`); it is always in ``FitResult.shards``
    gather: bool | None = None
    #: what a lost cell does to the fit (:mod:`executors.elastic`): ``"fail"`` ends it,
    #: ``"replan"`` goes on, re-planned without it, up to ``max_replans`` times
    on_worker_loss: str = "fail"
    max_replans: int = 3
    #: an elastic fit re-plans onto workers the engine gained when the predicted iteration
    #: time improves by more than this share (None: never grows)
    grow_threshold: float | None = 0.2
    #: the resources the plan was made for (None: a plan given without them)
    resources: Resources | None = None
    #: the float type of the data and the E-step (``models.data.DTYPES``); sums are float64
    dtype: str = "float64"

    @property
    def directory(self) -> str | None:
        """The folder of a dataset on disk (which each worker maps its rows from), or None."""
        return str(self.data.directory) if isinstance(self.data, NpyDataset) else None

    def open_data(self) -> Data:
        """The data as arrays (memory-mapped when it lives on disk)."""
        return self.data.open() if isinstance(self.data, NpyDataset) else self.data

    def open_rows(self, start: int, stop: int) -> Data:
        """Rows ``start:stop``: views of the arrays in memory, or just their bytes of the
        files memory-mapped (:meth:`NpyDataset.open_rows`)."""
        if isinstance(self.data, NpyDataset):
            return self.data.open_rows(start, stop)
        return take_rows(self.data, start, stop)


@runtime_checkable
class Executor(Protocol):
    """Runs a plan's ``D x M`` grid of workers through EM; executors differ only in transport.

    ``default_resources`` is what plans are made for when the caller names none;
    ``make_plan`` plans (an MPI executor plans once and shares the plan with every rank);
    ``check_plan`` refuses, before any work starts, a plan this executor cannot realize with
    what it has at hand; ``run`` fits.
    """

    name: ClassVar[str]

    def default_resources(self) -> Resources: ...

    def make_plan(self, model: Node, resources: Resources, n_data: int, dtype: str = "float64") -> BalancePlan: ...

    def check_plan(self, plan: BalancePlan) -> None: ...

    def run(self, job: FitJob) -> FitResult: ...


class BaseExecutor:
    """Defaults shared by the executors: ``blas_threads``, the BLAS and OpenMP threads of
    this process while a fit runs (:mod:`executors.threads`; ``None`` leaves them as they are)."""

    name: ClassVar[str] = ""

    def __init__(self, blas_threads: int | None = DEFAULT_BLAS_THREADS) -> None:
        self.blas_threads = check_blas_threads(blas_threads)

    def default_resources(self) -> Resources:
        return Resources.local()

    def make_plan(self, model: Node, resources: Resources, n_data: int, dtype: str = "float64") -> BalancePlan:
        from emgrid.planner import balance_plan

        return balance_plan(model, resources, n_data=n_data, dtype=dtype)

    def check_plan(self, plan: BalancePlan) -> None:
        return None

    def run(self, job: FitJob) -> FitResult:
        with limited(self.blas_threads):
            return self._run(job)

    def _run(self, job: FitJob) -> FitResult:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(blas_threads={self.blas_threads!r})"


def check_timeouts(timeout_s, startup_timeout_s) -> None:
    """ConfigError unless ``timeout_s`` is None or > 0 and ``startup_timeout_s`` > 0."""
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
    if not (isinstance(startup_timeout_s, (int, float)) and startup_timeout_s > 0):
        raise ConfigError(f"startup_timeout_s must be > 0, got {startup_timeout_s!r}")
