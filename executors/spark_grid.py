"""The Spark executor: every grid cell one task of a Spark barrier stage, alive for the fit.

The ``D x M`` cells are the ``D * M`` tasks of one barrier stage (``RDD.barrier()``, gang
scheduled: all start together or none does), as xgboost's and Horovod's Spark integrations
run their workers. A task is a :class:`executors.cell.Cell` served over
:mod:`multiprocessing.connection` sockets exactly as a multiprocessing worker is served over
pipes (:mod:`executors.conns`); only how the sockets are made is this module's (the
driver's side) and :mod:`executors.spark_task`'s (the task's):

- the driver listens on one socket (loopback when the master is local, else the address
  Spark's driver has) and every task connects to it: its control connection;
- each task listens on its own socket, the tasks exchange their addresses with
  ``BarrierTaskContext.allGather`` and connect to the cells they meet (the shards of a
  replica, the replicas of a column): the coupling, the column reduce and the update go
  task to task, the driver sends only each shard's part, the skeletons, and receives reports;
- every connection is authenticated with a key made for the fit (sent with the tasks).

Rows: from a Spark DataFrame (:mod:`executors.spark_data`), each task's rows come from the
DataFrame's partitions through Spark's shuffle, never through the driver; from arrays in
memory, each task's own rows are its partition of an RDD made of them; from a dataset on
disk (``NpyDataset``, on a file system the executors share), each task maps its row range.

Faults: a task that raises stops the fit with a FitError naming its cell and the iteration;
a task whose Python worker dies is named when its socket ends; a barrier stage is never
retried one task alone, and the stage is cancelled when the fit ends however it ended.

Sessions: ``session`` (or a DataFrame's own) is used as it is and left running. Without one,
a session is started for the fit on ``master`` and stopped after, its JVM with it
(:mod:`executors.spark_session`).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import uuid
from contextlib import contextmanager
from multiprocessing import Pipe
from multiprocessing.connection import Listener
from typing import ClassVar

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources, spark_slots

from .actors import EngineGrid, forwarded_env, last_exception_line
from .cellgrid import GridExecutor, describe_error
from .protocol import FitJob
from .result import FitResult
from .spark_data import SparkFrame, is_spark_frame
from .spark_session import import_spark, is_local, start_session, stop_session
from .spark_task import cell_task
from .step import PROTOCOL
from .threads import DEFAULT_BLAS_THREADS
from .warden import pid_alive

#: Seconds :meth:`SparkGrid.close` waits for the stage to end by itself before cancelling it.
STOP_GRACE_S = 10.0


# ------------------------------------------------------------------ the driver side
class SparkGrid(EngineGrid):
    """The driver's side: the barrier stage running on a thread, one control socket per task."""

    engine = "Spark"

    def __init__(self, job: FitJob, ex: SparkExecutor, session):
        super().__init__(job, ex)
        self.sc = session.sparkContext
        self.group = f"emgrid-{uuid.uuid4().hex[:12]}"
        self.error: BaseException | None = None
        self._done_r, self._done_w = None, None
        self._listener: Listener | None = None
        self._stage: threading.Thread | None = None

    def where(self, i: int) -> str:
        return f", Spark task {i}{super().where(i)}"

    def _rdd(self):
        """The stage's input: one partition per cell (grid order), and what it holds."""
        data, n = self.job.data, len(self.cells)
        if isinstance(data, SparkFrame):
            return data.by_cell([row[0].start for row in self.layout], self.shape[1]), "frame", data.reader()
        if self.directory is not None:
            return self.sc.parallelize(range(n), n), "directory", None
        return self.sc.parallelize([rows for _, _, rows in self.shipped()], n), "rows", None

    def launch(self) -> None:
        from pyspark import InheritableThread

        job, n = self.job, len(self.cells)
        authkey = os.urandom(32)
        host = "127.0.0.1" if is_local(self.sc) else self.sc.getConf().get("spark.driver.host")
        self._listener = Listener((host, 0), authkey=authkey)
        self._done_r, self._done_w = Pipe(duplex=False)
        parts = [pickle.dumps(self.view.model_for(s, job.model), protocol=PROTOCOL) for s in range(self.shape[1])]
        rdd, source, reader = self._rdd()
        task = cell_task(self._listener.address, authkey, is_local(self.sc), self.cells, source, reader,
                         self.directory, self.blas_threads, forwarded_env())
        stage = rdd.barrier().mapPartitions(task)

        def run_stage():
            try:
                self.sc.setJobGroup(self.group, "emgrid fit", interruptOnCancel=True)
                stage.collect()
            except BaseException as e:  # noqa: BLE001 - read by the coordinator
                self.error = e
            finally:
                self._done_w.send(None)

        self._stage = InheritableThread(target=run_stage, daemon=True, name="emgrid-spark-stage")
        self._stage.start()
        self._accept(n, parts)

    def _accept(self, n: int, parts: list[bytes]) -> None:
        """Waits until every task has connected and sends each its shard's part (``parts``,
        pickled, by shard), or until the stage ended, or the startup timeout."""

        def greet(conn) -> int:
            i = conn.recv()
            conn.send_bytes(parts[self.cells[i].shard])
            return i

        def ended_early():
            if self._done_r.poll(0.05):
                return self._stage_failed("while starting", [i for i in range(n) if self.conns[i] is None])
            return None

        self.accept(self._listener, greet, ended_early, f"Spark did not start its task(s) (the barrier stage needs "
                                                        f"{n} task slots at once; the session has {spark_slots(self.sc)})")

    def _stage_failed(self, when: str, cells: list[int]) -> FitError:
        summary = self._summary()
        who = ", ".join(self.who(i) for i in cells) if cells else "the barrier stage"
        err = FitError(f"{who} ended {when}: {summary}")
        if self.error is not None:
            err.add_note(f"Spark's report:\n{str(self.error).strip()[:4000]}")
        return err

    def _summary(self) -> str:
        """The stage's error in one line: the Python exception a task raised, if any."""
        if self.error is None:
            return "its Spark stage ended"
        line = last_exception_line(str(self.error), describe_error(self.error)[0])[:500]
        if "No module named 'emgrid'" in line:
            line += (f"; Spark's Python workers run PYSPARK_PYTHON ({os.environ.get('PYSPARK_PYTHON', 'python3')}), "
                     "which has no emgrid: set PYSPARK_PYTHON to this interpreter before the session starts "
                     f"({sys.executable}), or install emgrid where the executors run")
        return "Spark: " + line

    def sentinel(self, i: int):
        return self._done_r

    def ended(self, i: int) -> str:
        pid = self.infos[i].get("pid")
        if pid is not None and self.infos[i].get("host") == os.uname().nodename and not pid_alive(pid):
            return "died"
        if self._stage is not None and not self._stage.is_alive() and self.error is not None:
            return f"ended ({self._summary()})"
        return "died"

    def close(self, failed: bool = False) -> None:
        """Asks every task to stop and waits for the stage to end; cancels it when it does
        not end within :data:`STOP_GRACE_S` (or at once after a failure)."""
        if not failed:
            self.ask_to_stop()
        if self._stage is not None:
            self._stage.join(0.0 if failed else STOP_GRACE_S)
            if self._stage.is_alive():
                self.sc.cancelJobGroup(self.group)
                self._stage.join(30.0)
        self.hang_up_all()
        if self._listener is not None:
            self._listener.close()
        for end in (self._done_r, self._done_w):
            if end is not None:
                end.close()


class SparkExecutor(GridExecutor):
    """Tasks of a Spark barrier stage, one per grid cell.

    ``session``: the SparkSession to run on (used as it is, left running); ``None``: a
    DataFrame's own session, else one started on ``master`` for the fit and stopped after
    (default ``"local[2]"``). ``timeout_s``, ``startup_timeout_s`` and ``blas_threads`` as every
    grid executor's (:class:`executors.cellgrid.GridExecutor`).
    """

    name: ClassVar[str] = "spark"
    shown_option: ClassVar[str] = "master"

    def __init__(self, session=None, master: str | None = None, timeout_s: float | None = None,
                 startup_timeout_s: float = 120.0, blas_threads: int | None = DEFAULT_BLAS_THREADS):
        import_spark()
        if session is not None and master is not None:
            raise ConfigError("give the spark executor a session or a master, not both")
        if master is not None and (not isinstance(master, str) or not master):
            raise ConfigError(f"master must be a Spark master URL such as 'local[2]', got {master!r}")
        super().__init__(timeout_s, startup_timeout_s, blas_threads)
        self.session = session
        self.master = master or "local[2]"
        self._own = None  # the session started here, while it runs
        self._users = 0

    @contextmanager
    def opened(self):
        """A context in which :meth:`spark` is a running session: one started here ends
        with the outermost such context."""
        self._users += 1
        try:
            yield self
        finally:
            self._users -= 1
            if self._users == 0 and self._own is not None:
                own, self._own = self._own, None
                stop_session(own)

    def spark(self, data=None):
        """The session to run on: the executor's, the DataFrame ``data``'s, the one this
        process already runs, or one started on ``master`` (inside :meth:`opened`)."""
        if self.session is not None:
            return self.session
        if data is not None and is_spark_frame(data):
            return (data.source if hasattr(data, "source") else data).sparkSession
        if isinstance(data, SparkFrame):
            return data.df.sparkSession
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        if self._own is None:
            if self._users == 0:
                raise ConfigError("the spark executor starts its session inside opened()")
            self._own = start_session(self.master)
        return self._own

    def adopt(self, data, model: Node):
        """Data in the form this executor reads: a Spark DataFrame (or its Table) bound with
        Spark (:class:`SparkFrame`), a Parquet path read by the session; else as given."""
        from emgrid.models.tables import Table, as_table

        if not is_spark_frame(data):
            table = as_table(data) if isinstance(data, (str, Table)) or hasattr(data, "__fspath__") else None
            source = None if table is None else table.source
            if source is None or not str(source).lower().endswith(".parquet"):
                return data, model
            df = self.spark().read.parquet(str(source))
            data = Table(df, table.sequence_id, table.drop_missing)
        return SparkFrame.bind(data, model)

    def default_resources(self) -> Resources:
        with self.opened():
            return Resources.from_spark(self.spark())

    def check_plan(self, plan: BalancePlan) -> None:
        cells = plan.data_parallel * plan.model_parallel
        with self.opened():
            slots = spark_slots(self.spark().sparkContext)
        if cells > slots:
            raise ConfigError(f"the plan's {plan.data_parallel}x{plan.model_parallel} grid needs {cells} Spark tasks "
                              f"at once (a barrier stage), but the session runs {slots}; plan for "
                              "Resources.from_spark(session), or give the session more cores")

    def _run(self, job: FitJob) -> FitResult:
        with self.opened():
            session = self.spark(job.data)
            return self.fit_on(job, SparkGrid, session)


__all__ = ["SparkExecutor", "SparkGrid"]
