"""The Spark executor: every grid cell one task of a Spark barrier stage, alive for the fit.

The ``D x M`` cells are the ``D * M`` tasks of one barrier stage (``RDD.barrier()``, gang
scheduled: all start together or none does), as xgboost's and Horovod's Spark integrations
run their workers. A task is a :class:`executors.cell.Cell` served over
:mod:`multiprocessing.connection` sockets exactly as a multiprocessing worker is served over
pipes (:mod:`executors.conns`); only how the sockets are made is this module's:

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
a session is started for the fit on ``master`` (``local[N]``: the driver on 127.0.0.1, no web
UI, the workers running this Python) and stopped after, its JVM with it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import threading
import uuid
from multiprocessing.connection import Client, Connection, Listener
from time import perf_counter
from typing import ClassVar

from emgrid.models import Node
from emgrid.models.errors import ConfigError, FitError
from emgrid.planner.plan import BalancePlan
from emgrid.planner.resources import Resources, spark_slots

from .actors import forwarded_env, import_extra, last_exception_line, shipped_rows
from .cell import Cell
from .cellgrid import GridExecutor, describe_error
from .conns import ConnGrid, serve
from .datafiles import NpyDataset
from .protocol import FitJob
from .result import FitResult
from .spark_data import SparkFrame, cell_rows, is_spark_frame
from .threads import DEFAULT_BLAS_THREADS
from .warden import pid_alive

#: Seconds :meth:`SparkGrid.close` waits for the stage to end by itself before cancelling it.
STOP_GRACE_S = 10.0


def _import_spark():
    import warnings

    # PySpark warns on every DataFrame conversion that it is not tested with pandas 3 (which
    # emgrid's extras install); the conversions emgrid makes work, and the user cannot act on it
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    return import_extra("spark", "pyspark")


def check_java() -> None:
    """ConfigError in one line when no Java runtime is found (Spark runs on one)."""
    home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (home and os.path.exists(os.path.join(home, "bin", "java"))):
        raise ConfigError('the "spark" executor needs a Java 17+ runtime, and no "java" is on PATH (nor JAVA_HOME '
                          "set): install one (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew "
                          "install openjdk@17) or set JAVA_HOME")


def start_session(master: str):
    """A session on ``master`` for one fit: on a local master the driver binds 127.0.0.1
    only, no web UI; its Python workers run this interpreter."""
    _import_spark()
    check_java()
    from pyspark.sql import SparkSession

    # PySpark's workers run PYSPARK_PYTHON (default: the first python3 on PATH), read when the
    # context starts: this interpreter, which has emgrid
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName("emgrid")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_session(session) -> None:
    """Stops a session started here, and the JVM it started (PySpark keeps its gateway's JVM
    running after ``stop``), so that a later session starts afresh."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - a gateway already gone
        pass
    if proc is not None:
        try:
            proc.stdin.close()  # the JVM's launcher exits when its stdin closes
        except (OSError, AttributeError):
            pass
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - still running: ended below
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def no_delay(conn: Connection) -> Connection:
    """``conn`` (a TCP connection) with Nagle's algorithm off: a message's header and its
    body are two writes, which Nagle would hold back for the peer's delayed ACK (40 ms)."""
    import socket

    s = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        s.close()
    return conn


def is_local(sc) -> bool:
    return sc.master.startswith("local")


# ------------------------------------------------------------------ the task side
def _cell_task(coordinator, authkey: bytes, local: bool, specs, source: str, reader, directory,
               regularization, blas_threads, env):
    """The barrier task of every cell (its index the task's partition): ``source`` says what
    its partition holds, ``"frame"`` a DataFrame's ``(first, blob)`` blocks, ``"rows"`` its
    rows, ``"directory"`` nothing (it maps its rows from ``directory``). Its shard's part of
    the starting model comes down its control connection once it connected (not with the
    task: every task would receive every shard's)."""

    def run(partition):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        i = ctx.partitionId()
        spec = specs[i]
        d, m = len(specs) // spec.view.n_shards, spec.view.n_shards
        # a local master's tasks listen on loopback, a cluster's on their executor's address
        host = "127.0.0.1" if local else ctx.getTaskInfos()[i].address.rsplit(":", 1)[0]
        control = no_delay(Client(coordinator, authkey=authkey))
        control.send(i)
        part_blob = control.recv_bytes()

        def make_cell():
            part = pickle.loads(part_blob)
            if source == "frame":
                rows = cell_rows(reader, spec, part, partition)
            elif source == "rows":
                rows = next(iter(partition))
            else:
                rows = None
            cell = Cell(spec, part, directory if source == "directory" else None, rows, blas_threads, env)
            return cell, _link(ctx, i, spec, d, m, host, authkey)

        serve(make_cell, d, control, regularization)
        control.close()
        return iter(())

    return run


def _link(ctx, i: int, spec, d: int, m: int, host: str, authkey: bytes) -> dict[tuple[int, int], Connection]:
    """The task's connections to the cells it sends to: it listens, the tasks exchange their
    addresses (``allGather``), each connects to the cells after it in grid order and accepts
    those before it (on a thread, while it connects)."""
    targets = Cell.targets(spec, d)
    listener = Listener((host, 0), authkey=authkey)
    try:
        addresses = [tuple(json.loads(a)) for a in ctx.allGather(json.dumps(list(listener.address)))]
        links: dict[tuple[int, int], Connection] = {}
        before = [t for t in targets if t[0] * m + t[1] < i]
        failure: list[BaseException] = []

        def accept():
            try:
                for _ in before:
                    conn = no_delay(listener.accept())
                    j = conn.recv()
                    links[(j // m, j % m)] = conn
            except BaseException as e:  # noqa: BLE001 - raised on the task's thread
                failure.append(e)

        acceptor = threading.Thread(target=accept, daemon=True, name=f"emgrid-{spec.name}-accept")
        acceptor.start()
        for t in targets:
            j = t[0] * m + t[1]
            if j > i:
                conn = no_delay(Client(addresses[j], authkey=authkey))
                conn.send(i)
                links[t] = conn
        acceptor.join()
        if failure:
            raise failure[0]
        return links
    finally:
        listener.close()


# ------------------------------------------------------------------ the driver side
class SparkGrid(ConnGrid):
    """The driver's side: the barrier stage running on a thread, one control socket per task."""

    def __init__(self, job: FitJob, session, timeout_s: float | None, startup_timeout_s: float,
                 blas_threads: int | None):
        super().__init__(job, timeout_s, startup_timeout_s)
        self.session, self.blas_threads = session, blas_threads
        self.sc = session.sparkContext
        self.conns: list[Connection | None] = [None] * len(self.cells)
        self.infos: list[dict] = [{} for _ in self.cells]
        self.group = f"emgrid-{uuid.uuid4().hex[:12]}"
        self.error: BaseException | None = None
        self._done_r, self._done_w = None, None
        self._listener: Listener | None = None
        self._stage: threading.Thread | None = None

    def who(self, i: int) -> str:
        s = self.cells[i]
        info = self.infos[i]
        at = f", pid {info['pid']} on {info['host']}" if info else ""
        return f"worker {s.name!r} (replica {s.replica}, shard {s.shard}, Spark task {i}{at})"

    def _rdd(self):
        """The stage's input: one partition per cell (grid order), and what it holds."""
        job, n = self.job, len(self.cells)
        data = job.data
        if isinstance(data, SparkFrame):
            return data.by_cell([row[0].start for row in self.layout], self.shape[1]), "frame", data.reader(), None
        if isinstance(data, NpyDataset):
            return self.sc.parallelize(range(n), n), "directory", None, str(data.directory)
        rows = job.open_data()
        cells = [shipped_rows(spec, spec.view.model_for(spec.shard, job.model), rows) for spec in self.cells]
        return self.sc.parallelize(cells, n), "rows", None, None

    def start(self) -> None:
        from pyspark import InheritableThread

        job, n = self.job, len(self.cells)
        authkey = os.urandom(32)
        host = "127.0.0.1" if is_local(self.sc) else self.sc.getConf().get("spark.driver.host")
        self._listener = Listener((host, 0), authkey=authkey)
        self._done_r, self._done_w = _pipe()
        parts = [pickle.dumps(self.view.model_for(s, job.model), protocol=5) for s in range(self.shape[1])]
        rdd, source, reader, directory = self._rdd()
        task = _cell_task(self._listener.address, authkey, is_local(self.sc), self.cells, source, reader, directory,
                          job.regularization, self.blas_threads, forwarded_env())
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
        del parts
        self.collect(dict.fromkeys(range(n)), "while starting", self.startup_timeout_s)
        self.infos = self.call_all("info", (), "while starting", self.startup_timeout_s)

    def _accept(self, n: int, parts: list[bytes]) -> None:
        """Waits until every task has connected and sends each its shard's part (``parts``,
        pickled, by shard), or until the stage ended, or the startup timeout."""
        got: list = []

        def accept():
            try:
                for _ in range(n):
                    conn = no_delay(self._listener.accept())
                    i = conn.recv()
                    conn.send_bytes(parts[self.cells[i].shard])
                    got.append((i, conn))
            except (OSError, EOFError):
                pass

        threading.Thread(target=accept, daemon=True, name="emgrid-spark-accept").start()
        deadline = perf_counter() + self.startup_timeout_s
        while len(got) < n:
            if self._done_r.poll(0.05):
                raise self._stage_failed("while starting", [i for i in range(n) if i not in dict(got)])
            if perf_counter() > deadline:
                missing = sorted(set(range(n)) - {i for i, _ in got})
                raise FitError(f"no answer within {self.startup_timeout_s:g} s while starting from "
                               f"{', '.join(self.who(i) for i in missing)}: Spark did not start its task(s) "
                               f"(the barrier stage needs {n} task slots at once; the session has {spark_slots(self.sc)})")
        for i, conn in got:
            self.conns[i] = conn

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

    @property
    def pids(self) -> list[int]:
        return [info.get("pid") for info in self.infos]

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
            for c in self.conns:
                if c is not None:
                    try:
                        c.send(("stop", None))
                    except OSError:
                        pass
        if self._stage is not None:
            self._stage.join(0.0 if failed else STOP_GRACE_S)
            if self._stage.is_alive():
                self.sc.cancelJobGroup(self.group)
                self._stage.join(30.0)
        for c in self.conns:
            if c is not None:
                c.close()
        if self._listener is not None:
            self._listener.close()
        for end in (self._done_r, self._done_w):
            if end is not None:
                end.close()


def _pipe():
    from multiprocessing import Pipe

    return Pipe(duplex=False)


class SparkExecutor(GridExecutor):
    """Tasks of a Spark barrier stage, one per grid cell.

    ``session``: the SparkSession to run on (used as it is, left running); ``None``: a
    DataFrame's own session, else one started on ``master`` for the fit and stopped after
    (default ``"local[2]"``). ``timeout_s``, ``startup_timeout_s`` and ``blas_threads`` as every
    grid executor's (:class:`executors.cellgrid.GridExecutor`).
    """

    name: ClassVar[str] = "spark"

    def __init__(self, session=None, master: str | None = None, timeout_s: float | None = None,
                 startup_timeout_s: float = 120.0, blas_threads: int | None = DEFAULT_BLAS_THREADS):
        _import_spark()
        if session is not None and master is not None:
            raise ConfigError("give the spark executor a session or a master, not both")
        if master is not None and (not isinstance(master, str) or not master):
            raise ConfigError(f"master must be a Spark master URL such as 'local[2]', got {master!r}")
        super().__init__(timeout_s, startup_timeout_s, blas_threads)
        self.session = session
        self.master = master or "local[2]"
        self._own = None  # the session started here, while it runs
        self._users = 0

    def opened(self):
        """A context in which :meth:`spark` is a running session: one started here ends
        with the outermost such context."""
        from contextlib import contextmanager

        @contextmanager
        def held():
            self._users += 1
            try:
                yield self
            finally:
                self._users -= 1
                if self._users == 0 and self._own is not None:
                    own, self._own = self._own, None
                    stop_session(own)

        return held()

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
            return self.fit_on(lambda j: SparkGrid(j, session, self.timeout_s, self.startup_timeout_s,
                                                   self.blas_threads), job)

    def __repr__(self) -> str:
        return (f"SparkExecutor(master={self.master!r}, timeout_s={self.timeout_s!r}, "
                f"blas_threads={self.blas_threads!r})")


__all__ = ["SparkExecutor", "SparkGrid", "start_session", "stop_session"]
