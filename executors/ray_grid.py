"""The Ray executor: every grid cell a long-lived Ray actor (a process of its own).

What moves, and when, is every cell's (:mod:`executors.cell`); how, here: a cell maps its own
row range of the dataset's ``.npy`` files (a dataset on disk, on a file system the nodes
share), or receives its replica's rows, only its shard's columns, as an argument of its
constructor (Ray puts them in its object store once; data in memory); then its actor serves
it over sockets for the whole fit (:class:`executors.actors.EngineGrid`): the coordinator's
calls, and a cell's messages to its peers (coupling, partial sums, new subtrees) cell to cell.

Cells are placed on the nodes the plan names when it was made for this cluster
(``Resources.from_ray()``, whose worker names are the cluster's CPUs), otherwise where Ray
puts them (spread over the nodes). Each asks for one CPU, or an equal share of the
cluster's CPUs when the grid has more cells than it has CPUs (``num_cpus``).

Faults: a cell that raises stops the fit with a FitError naming it and the iteration; a cell
whose process dies is named as soon as its socket ends; with ``timeout_s``, one
that does not answer in time is named. Every cell is killed (``ray.kill``) after the fit,
however it ended. A Ray instance the executor started (``address=None`` and no Ray running in
this process) is shut down after the fit.

Every process of a Ray instance the executor starts listens on 127.0.0.1 only, with no
dashboard (:func:`start_local`); its ``session_*`` folder goes in a run-tagged scratch folder
whose warden kills what is left of the instance when this process ends, however it ends
(Ray's agents would otherwise wait a minute on a dead GCS; :class:`executors.scratch.Scratch`).
A cluster named by ``address`` is used as it is.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager, suppress
from typing import ClassVar

from emgrid.models.errors import FitError

from emgrid.planner.resources import Resources, ray_slots

from .actors import EngineGrid, forwarded_env, import_extra, last_exception_line
from .cell import Cell
from .cellgrid import GridExecutor, WorkerLost, describe_error
from .conns import serve_relayed
from .protocol import FitJob
from .result import FitResult
from .scratch import Scratch
from .threads import DEFAULT_BLAS_THREADS

def _import_ray():
    return import_extra("ray", "ray")


#: Longest temporary folder Ray's session goes in: its Unix sockets' paths
#: (``.../session_<date>_<pid>/sockets/plasma_store``) must stay within 107 bytes.
_MAX_SCRATCH_PARENT = 40


def start_local(num_cpus: int | None) -> Scratch:
    """Starts a Ray instance on this machine for one fit, every process of it listening on
    127.0.0.1 only, its session folder in a new scratch folder (returned: close it after
    ``ray.shutdown()``).

    Ray resolves a loopback ``_node_ip_address`` to the machine's external address unless it
    is told this machine is no cluster (``ENABLE_RAY_CLUSTER``, as on macOS); with the
    loopback address the GCS, the raylet and every worker bind 127.0.0.1 instead of every
    interface."""
    ray = _import_ray()
    import tempfile

    parent = tempfile.gettempdir()
    scratch = Scratch("ray", parent if len(parent) <= _MAX_SCRATCH_PARENT else "/tmp", kill_at_close=True)
    try:
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - a Ray without the switch: the address still asks for loopback
        ray_constants = None
    was = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    try:
        if was is not None:
            ray_constants.ENABLE_RAY_CLUSTER = False
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 _node_ip_address="127.0.0.1", _temp_dir=str(scratch.path))
    except BaseException:
        scratch.close()
        raise
    finally:
        if was is not None:
            ray_constants.ENABLE_RAY_CLUSTER = was
    return scratch


class RayCell:
    """The Ray actor of one cell: it builds the :class:`executors.cell.Cell` (its rows opened
    or received with the constructor), then :meth:`serve` serves it over sockets for the whole
    fit, as a Spark task or a multiprocessing worker is served (:func:`executors.conns.serve`)."""

    def __init__(self, spec, part, directory, rows, blas_threads, env):
        self.cell = Cell(spec, part, directory, rows, blas_threads, env)

    def waits_for(self) -> str:
        """What the cell waits for (asked on the actor's second thread while it serves)."""
        return self.cell.waits_for()

    def serve(self, coordinator, authkey: bytes, d: int) -> None:
        """Serves the cell until the fit ends (:func:`executors.conns.serve_relayed`)."""
        serve_relayed(self.cell, coordinator, authkey, d, _import_ray().util.get_node_ip_address())


class RayGrid(EngineGrid):
    """The coordinator's side: one actor per cell in the Ray cluster this process is connected
    to, each serving its cell over sockets to this process and to the cells it meets."""

    engine = "Ray"

    def __init__(self, job: FitJob, ex: RayExecutor):
        super().__init__(job, ex)
        self.num_cpus = ex.cell_cpus
        self.actors: list = []

    def _options(self, ray) -> list[dict]:
        """Every cell's actor options: its CPUs, its node, no restarts."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        n = len(self.cells)
        cpus = self.num_cpus
        if cpus is None:
            total = float(ray.cluster_resources().get("CPU", 1.0))
            cpus = min(1.0, math.floor(total / n * 1e4) / 1e4)
        slots = ray_slots(ray.nodes())
        by_name = {name: node for name, node, _ in slots}
        nodes = {node for _, node, _ in slots}
        # two threads: ``serve`` for the whole fit, and ``waits_for`` when the coordinator asks
        common = {"num_cpus": cpus, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 2}
        if all(spec.name in by_name for spec in self.cells):
            return [dict(common, scheduling_strategy=NodeAffinitySchedulingStrategy(by_name[spec.name], soft=False))
                    for spec in self.cells]
        return [dict(common, scheduling_strategy="SPREAD") if len(nodes) > 1 else common for _ in self.cells]

    def resources_now(self) -> Resources:
        return Resources.from_ray()

    def launch(self) -> None:
        ray = _import_ray()
        remote, env = ray.remote(RayCell), forwarded_env()
        for (spec, part, rows), options in zip(self.shipped(), self._options(ray)):
            self.actors.append(remote.options(**options).remote(spec, part, self.directory, rows, self.blas_threads,
                                                                 env))
        self.relay(ray.util.get_node_ip_address(), lambda i, *to: self.actors[i].serve.remote(*to, self.shape[0]))

    def ended_early(self) -> FitError | None:
        """Also when its constructor raised (opening its rows, say) or its process died."""
        ray = _import_ray()
        from ray.exceptions import RayActorError

        done, _ = ray.wait(self.serving, num_returns=1, timeout=0.05)
        for ref in done:
            i, when = self.serving.index(ref), "while starting"
            try:
                ray.get(ref)
                return FitError(f"{self.who(i)} ended {when}")
            except RayActorError as e:
                report = (getattr(e, "error_msg", None) or str(e)).rstrip()
                if "creation task" not in report:
                    err = WorkerLost(f"{self.who(i)} died {when} (Ray: {type(e).__name__})", i, self.cells[i].name)
                    err.add_note(f"Ray's report:\n{report}")
                    return err
                err = FitError(f"{self.who(i)} failed {when}: {last_exception_line(report, 'its constructor raised')}")
            except Exception as e:  # noqa: BLE001 - the cell's own error, inside Ray's
                report = str(e)
                err = FitError(f"{self.who(i)} failed {when}: {describe_error(getattr(e, 'cause', None) or e)[0]}")
            err.add_note(f"Ray's report:\n{report}")
            return err
        return None

    def waits(self, cells: list[int]) -> dict[int, str]:
        """What each of ``cells`` waits for (:meth:`Cell.waits_for`), asked for at most a
        second; one that does not answer counts as stuck."""
        ray = _import_ray()
        asked = {self.actors[i].waits_for.remote(): i for i in cells if i < len(self.actors)}
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=1.0) if asked else ([], [])
        out = {}
        for ref in ready:
            with suppress(Exception):
                out[asked[ref]] = ray.get(ref)
        return out

    def close(self, failed: bool = False) -> None:
        """Asks the cells to stop (after a fit that ended well), then kills every cell's
        actor (its process goes with it; one already dead is passed over)."""
        ray = _import_ray()
        if not failed:
            self.ask_to_stop()
        self.hang_up_all()
        for a in self.actors:
            with suppress(Exception):
                ray.kill(a, no_restart=True)
        self.actors = []


class RayExecutor(GridExecutor):
    """Ray actors, one per grid cell.

    ``address``: the Ray cluster to connect to (``"auto"``, ``"ray://host:10001"``, ...); when
    this process is already connected (``ray.init`` was called), that cluster is used and left
    connected. ``None`` and no Ray here: a local Ray instance is started for the run
    (``num_cpus`` CPUs, default this machine's) and shut down after. ``timeout_s``,
    ``startup_timeout_s`` and ``blas_threads`` as every grid executor's
    (:class:`executors.cellgrid.GridExecutor`). ``cell_cpus``: CPUs each
    cell's actor asks for (default: 1, or an equal share when the grid has more cells than
    the cluster has CPUs).
    """

    name: ClassVar[str] = "ray"
    shown_option: ClassVar[str] = "address"

    def __init__(self, address: str | None = None, timeout_s: float | None = None, startup_timeout_s: float = 120.0,
                 num_cpus: int | None = None, cell_cpus: float | None = None,
                 blas_threads: int | None = DEFAULT_BLAS_THREADS):
        _import_ray()
        super().__init__(timeout_s, startup_timeout_s, blas_threads)
        self.address = address
        self.num_cpus = num_cpus
        self.cell_cpus = cell_cpus

    @contextmanager
    def _connected(self):
        """This process connected to Ray inside the block: to the cluster it is connected to
        already (left so), else to ``address`` or to a local instance started here, and
        disconnected after (a local instance stops, and its scratch goes)."""
        ray = _import_ray()
        if ray.is_initialized():
            yield
            return
        scratch = None
        if self.address is None:
            scratch = start_local(self.num_cpus)
        else:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR)
        try:
            yield
        finally:
            try:
                ray.shutdown()
            finally:
                if scratch is not None:
                    scratch.close()

    def default_resources(self) -> Resources:
        if self.address is None and not _import_ray().is_initialized():
            return Resources.local()
        with self._connected():
            return Resources.from_ray()

    def _run(self, job: FitJob) -> FitResult:
        with self._connected():
            return self.fit_on(job, RayGrid)


__all__ = ["RayExecutor", "RayCell", "RayGrid"]
