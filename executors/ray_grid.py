"""The Ray executor: every grid cell a long-lived Ray actor (a process of its own).

What moves, and when, is every cell's (:mod:`executors.cell`); how, here: a cell maps its own
row range of the dataset's ``.npy`` files (a dataset on disk, on a file system the nodes
share), or receives its replica's rows, only its shard's columns, as an argument of its
constructor (Ray puts them in its object store once; data in memory); a shard's part of the
model and each skeleton are put in the object store once for every cell; a cell's messages
to its peers (coupling, partial sums, new subtrees) are ``deliver.remote`` calls on their
actors, the coordinator not involved. A cell is a threaded actor, so deliveries run while its
step waits.

Cells are placed on the nodes the plan names when it was made for this cluster
(``Resources.from_ray()``, whose worker names are the cluster's CPUs), otherwise where Ray
puts them (spread over the nodes). Each asks for one CPU, or an equal share of the
cluster's CPUs when the grid has more cells than it has CPUs (``num_cpus``).

Faults: a cell that raises stops the fit with a FitError naming it and the iteration; a cell
whose process dies is named as soon as Ray reports its actor dead; with ``timeout_s``, one
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
import os
from multiprocessing.connection import Connection, Listener
from typing import ClassVar

from emgrid.models.errors import FitError

from emgrid.planner.resources import Resources, ray_slots

from .actors import forwarded_env, import_extra, last_exception_line, shipped_rows
from .cell import Cell
from .cellgrid import GridExecutor, WorkerLost, describe_error
from .conns import ConnGrid, serve_relayed
from .datafiles import NpyDataset
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


class RayGrid(ConnGrid):
    """The coordinator's side: one actor per cell in the Ray cluster this process is connected
    to, each serving its cell over a socket to this process and to the cells it meets."""

    def __init__(self, job: FitJob, directory: str | None, timeout_s: float | None, startup_timeout_s: float,
                 blas_threads: int | None, num_cpus: float | None):
        super().__init__(job, timeout_s, startup_timeout_s)
        self.directory, self.blas_threads, self.num_cpus = directory, blas_threads, num_cpus
        self.actors: list = []
        self.conns: list[Connection | None] = [None] * len(self.cells)
        self._serving: dict = {}  # each actor's ``serve`` call, by its reference

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

    def start(self) -> None:
        ray = _import_ray()
        job, n = self.job, len(self.cells)
        remote = ray.remote(RayCell)
        env = forwarded_env()
        data = None if self.directory is not None else job.open_data()
        for spec, options in zip(self.cells, self._options(ray)):
            part = spec.view.model_for(spec.shard, job.model)
            rows = None if data is None else shipped_rows(spec, part, data)
            self.actors.append(remote.options(**options).remote(spec, part, self.directory, rows, self.blas_threads,
                                                                 env))
        authkey = os.urandom(32)
        listener = Listener((ray.util.get_node_ip_address(), 0), authkey=authkey)
        try:
            self._serving = {a.serve.remote(listener.address, authkey, self.shape[0]): i
                             for i, a in enumerate(self.actors)}
            self.accept_relayed(listener, self._ended_early, "Ray")
        finally:
            listener.close()
        self.collect(dict.fromkeys(range(n)), "while starting", self.startup_timeout_s)
        self.infos = self.call_all("info", (), "while starting", self.startup_timeout_s)

    def _ended_early(self) -> FitError | None:
        """The FitError of a cell whose ``serve`` call ended while the cells started, if any:
        its constructor raised (opening its rows, say), its process died, or it failed."""
        ray = _import_ray()
        from ray.exceptions import RayActorError

        done, _ = ray.wait(list(self._serving), num_returns=1, timeout=0.05)
        for ref in done:
            i, when = self._serving[ref], "while starting"
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
        """What each of ``cells`` waits for (:meth:`Cell.waits_for`), asked for at most a second."""
        ray = _import_ray()
        asked = {self.actors[i].waits_for.remote(): i for i in cells if i < len(self.actors)}
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=1.0) if asked else ([], [])
        out = {}
        for ref in ready:
            try:
                out[asked[ref]] = ray.get(ref)
            except Exception:  # noqa: BLE001 - no answer: it counts as stuck
                pass
        return out

    def close(self, failed: bool = False) -> None:
        """Asks the cells to stop (after a fit that ended well), then kills every cell's
        actor (its process goes with it)."""
        ray = _import_ray()
        if not failed:
            self.ask_to_stop()
        for c in self.conns:
            if c is not None:
                c.close()
        self.conns = [None] * len(self.cells)
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
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
        self._scratch: Scratch | None = None

    def _connect(self) -> bool:
        """Connects this process to Ray; True when it was not connected before (then the
        caller disconnects after, :meth:`_disconnect`)."""
        ray = _import_ray()
        if ray.is_initialized():
            return False
        if self.address is None:
            self._scratch = start_local(self.num_cpus)
        else:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR)
        return True

    def _disconnect(self) -> None:
        """Disconnects from Ray; a local instance started here stops, and its scratch goes."""
        ray = _import_ray()
        scratch, self._scratch = self._scratch, None
        try:
            ray.shutdown()
        finally:
            if scratch is not None:
                scratch.close()

    def default_resources(self) -> Resources:
        ray = _import_ray()
        if self.address is None and not ray.is_initialized():
            return Resources.local()
        opened = self._connect()
        try:
            return Resources.from_ray()
        finally:
            if opened:
                self._disconnect()

    def _run(self, job: FitJob) -> FitResult:
        opened = self._connect()
        try:
            directory = str(job.data.directory) if isinstance(job.data, NpyDataset) else None
            return self.fit_on(lambda j: RayGrid(j, directory, self.timeout_s, self.startup_timeout_s,
                                                 self.blas_threads, self.cell_cpus), job)
        finally:
            if opened:
                self._disconnect()


__all__ = ["RayExecutor", "RayCell", "RayGrid"]
