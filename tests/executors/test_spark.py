"""Spark barrier tasks give the local trace on every grid, from arrays, a Spark DataFrame (a
string category bound by a distinct) and Parquet read by Spark; a killed task is named;
nothing stays running.

One local session of four task slots serves the module (started as the executor starts one);
the session the executor starts and stops itself is checked in a process of its own, since a
process holds one SparkContext at a time.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pyspark = pytest.importorskip("pyspark")
pd = pytest.importorskip("pandas")
if shutil.which("java") is None:
    pytest.skip("Spark needs a Java runtime", allow_module_level=True)

from emgrid.executors import NpyDataset, get, optimize  # noqa: E402
from emgrid.executors.warden import pid_alive  # noqa: E402
from emgrid.models import Categorical, Composite, DiagGaussian, Gaussian, Mixture, n_rows  # noqa: E402
from emgrid.models.errors import ConfigError, DataError, FitError  # noqa: E402
from emgrid.models.tables import Table  # noqa: E402
from emgrid.planner import Resources  # noqa: E402

from .actor_checks import GRIDS, assert_same_fit, assert_same_model, grid_id, local_fits  # noqa: E402
from .fault_models import ROWS, blocky_data, blocky_model  # noqa: E402
from .plans import grid_plan  # noqa: E402
from .test_faults import deadline  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COLORS = np.array(["red", "green", "blue"], dtype=object)
N = 900


@pytest.fixture(scope="module")
def session():
    from emgrid.executors.spark_session import start_session, stop_session

    s = start_session("local[4]")
    yield s
    stop_session(s)


@pytest.fixture(scope="module")
def reference(nested):
    return local_fits(*nested)



def assert_nothing_running(session, pids, within_s: float = 30.0) -> None:
    """No job of the fit is still running, and (when given) the cells' processes are gone."""
    tracker = session.sparkContext.statusTracker()
    end = time.monotonic() + within_s
    while time.monotonic() < end and (tracker.getActiveJobsIds() or any(map(pid_alive, pids))):
        time.sleep(0.1)
    assert not tracker.getActiveJobsIds(), "the fit's barrier stage is still running"
    assert not [p for p in pids if pid_alive(p)], "cells' processes left running"


class Cells:
    """The executor, and the pids its cells had while the fit ran."""

    def __init__(self, session, **options):
        self.ex = get("spark", session=session, **options)
        self.pids: list[int] = []

    def callback(self, it, ll, result):
        if it == 1:
            self.pids = list(self.ex.worker_pids)


@pytest.mark.parametrize("grid", GRIDS, ids=grid_id)
def test_spark_grids_give_the_local_trace_and_bytes(session, nested, reference, grid, tmp_path, monkeypatch):
    """Arrays in memory (each task's rows its partition) and, on 1x2, a dataset on disk that
    each task maps: the trace and the gathered model are local's to the last bit, and every
    cell runs one BLAS thread."""
    model, data = nested
    n = n_rows(model.prepare(data))
    (tmp_path / "probe").mkdir()
    monkeypatch.setenv("EMGRID_THREAD_PROBE", str(tmp_path / "probe"))
    if grid == (1, 2):
        data = NpyDataset.write(data, tmp_path / "ds", model=model)
    cells = Cells(session)
    res = optimize(data, model, plan=grid_plan(model, n, *grid), executor=cells.ex, max_iter=4, tol=0.0,
                   callback=cells.callback)
    assert_same_fit(res, reference[grid], "spark", tmp_path / "probe", grid[0] * grid[1])
    assert_nothing_running(session, [])


def record_model() -> Mixture:
    """A mixture of records whose categorical column's values are not given: bound from the
    column (sorted), by Spark's distinct or by the table's own reading."""
    def record(mean, probs):
        return Composite({"x": Gaussian(mean, 1.0), "color": Categorical(probs),
                          "pos": DiagGaussian([mean, 0.0], [1.0, 1.0])}, columns={"pos": ["px", "py"]})

    return Mixture([record(-1.0, [0.6, 0.3, 0.1]), record(2.0, [0.1, 0.3, 0.6])], [0.4, 0.6])


@pytest.fixture(scope="module")
def frame(session):
    """The same rows as a pandas DataFrame and a Spark DataFrame of 3 partitions."""
    x, codes, pos = record_model().sample(N, np.random.default_rng(5))
    pdf = pd.DataFrame({"x": x, "color": COLORS[codes], "px": pos[:, 0], "py": pos[:, 1], "other": np.arange(N)})
    return pdf, session.createDataFrame(pdf).repartition(3)


@pytest.mark.parametrize("grid", GRIDS, ids=grid_id)
def test_a_spark_dataframe_gives_the_trace_of_its_pandas_twin(session, frame, grid):
    """Rows from the DataFrame's partitions (shuffled to the tasks), the string column bound
    by a distinct: the trace and model equal a local fit of ``toPandas()`` to the last bit."""
    pdf, df = frame
    model = record_model()
    plan = grid_plan(model, N, *grid)
    want = optimize(df.toPandas(), model, plan=plan, max_iter=4, tol=0.0)
    got = optimize(df, model, plan=plan, executor=get("spark", session=session), max_iter=4, tol=0.0)
    assert got.log_likelihood == want.log_likelihood
    assert_same_model(got.model, want.model)
    assert got.model.node_at("0.1").values == ("blue", "green", "red")
    assert_nothing_running(session, [])


def test_a_template_from_a_dataframe_seeds_from_the_same_rows(session, frame):
    """A template's starts read their sample by global row index through Spark: the same
    starts, traces and model as the local fit of the pandas table."""
    pdf, df = frame
    template = Mixture([Composite({"x": Gaussian(), "color": Categorical(), "px": Gaussian()})] * 3)
    plan_of = {}

    def fit(data, executor):
        kwargs = {"plan": plan_of["plan"]} if plan_of else {}
        res = optimize(data, template, executor=executor, max_iter=3, tol=0.0, n_init=2, init_iter=2, seed=4, **kwargs)
        plan_of.setdefault("plan", res.plan)
        return res

    got = fit(df, get("spark", session=session))
    want = fit(df.toPandas(), "local")
    assert got.init_log_likelihoods == want.init_log_likelihoods
    assert got.log_likelihood == want.log_likelihood
    assert_same_model(got.model, want.model)


def test_parquet_is_read_by_spark(session, frame, tmp_path):
    pdf, _ = frame
    pdf.to_parquet(tmp_path / "t.parquet")
    model = record_model()
    plan = grid_plan(model, N, 2, 1)
    want = optimize(pdf, model, plan=plan, max_iter=3, tol=0.0)
    got = optimize(str(tmp_path / "t.parquet"), model, plan=plan, executor=get("spark", session=session), max_iter=3,
                   tol=0.0)
    assert got.log_likelihood == want.log_likelihood


def test_drop_missing_drops_with_spark_and_a_missing_value_is_named(session, frame):
    pdf, _ = frame
    holed = pdf.copy()
    holed.loc[[7, 300], "x"] = np.nan
    df = session.createDataFrame(holed)
    model = record_model()
    with pytest.raises(FitError, match=r"column 'x' has a missing value .* at row 7"):
        optimize(df, model, plan=grid_plan(model, N, 2, 1), executor=get("spark", session=session), max_iter=2)
    with pytest.warns(UserWarning, match="dropped 2 of 900 rows"):
        got = optimize(Table(df, drop_missing=True), model, plan=grid_plan(model, N - 2, 2, 1),
                       executor=get("spark", session=session), max_iter=3, tol=0.0)
    want = optimize(holed.dropna().reset_index(drop=True), model, plan=grid_plan(model, N - 2, 2, 1), max_iter=3,
                    tol=0.0)
    assert got.log_likelihood == want.log_likelihood


def test_bad_input_is_refused_by_name(session, frame):
    pdf, df = frame
    with pytest.raises(DataError, match="'nope'"):
        optimize(df, Composite({"nope": Gaussian(0.0, 1.0)}), executor=get("spark", session=session))
    with pytest.raises(ConfigError, match="executor='spark'"):
        optimize(df, record_model(), executor="local")
    with pytest.raises(ConfigError, match="needs 9 Spark tasks"):
        optimize(df, record_model(), plan=grid_plan(record_model(), N, 9, 1), executor=get("spark", session=session))


def test_resources_read_the_session(session):
    res = Resources.from_spark(session)
    assert res.n_workers == 4
    assert [w.name for w in res.workers] == [f"{res.workers[0].name.rsplit('/', 1)[0]}/{k}" for k in range(4)]
    assert all(w.memory_bytes and w.memory_bytes > 0 for w in res.workers)


def test_a_killed_task_stops_the_fit_with_its_name_and_iteration(session):
    model = blocky_model()
    data = blocky_data(model)
    cells = Cells(session)

    def kill_second_cell(it, ll, result):
        if it == 1:
            cells.pids = list(cells.ex.worker_pids)
            os.kill(cells.pids[1], signal.SIGKILL)

    t0 = time.monotonic()
    died = r"worker 'w1' \(replica 0, shard 1, Spark task 1, pid \d+ on .*\) died in iteration 2"
    with deadline(90), pytest.raises(FitError, match=died):
        optimize(data, model, plan=grid_plan(model, ROWS, 1, 2), executor=cells.ex, max_iter=5, tol=0.0,
                 callback=kill_second_cell)
    assert time.monotonic() - t0 < 60
    assert cells.ex.worker_pids == []
    assert_nothing_running(session, cells.pids)
    # the session is the caller's: it is left running, and fits again
    res = optimize(data, model, plan=grid_plan(model, ROWS, 1, 2), executor=get("spark", session=session), max_iter=2)
    assert len(res.log_likelihood) == 2


def test_a_raising_task_is_named_with_its_error(session, monkeypatch):
    model = blocky_model()
    data = blocky_data(model)
    monkeypatch.setenv("EMGRID_FAULT", "raise:worker=w0:iteration=2:block=1")
    with deadline(90), pytest.raises(FitError, match=r"^worker 'w0' \(replica 0, shard 0, Spark task 0, pid \d+ on "
                                                     r".*\) failed in iteration 2: .*InjectedFault"):
        optimize(data, model, plan=grid_plan(model, ROWS, 2, 1), executor=get("spark", session=session), max_iter=4,
                 tol=0.0)
    assert_nothing_running(session, [])


_OWN_SESSION = textwrap.dedent("""
    import os, sys, numpy as np
    sys.path.insert(0, sys.argv[1])
    from pyspark import SparkContext
    from emgrid.executors import get, optimize
    from emgrid.models import Gaussian, Mixture
    from tests.executors.plans import grid_plan
    model = Mixture([Gaussian(-1.0, 1.0), Gaussian(2.0, 1.0)], [0.5, 0.5])
    data = model.prepare(model.sample(2000, np.random.default_rng(0)))
    plan = grid_plan(model, 2000, 2, 1)
    seen = {}

    def callback(it, ll, result):
        seen["jvm"] = SparkContext._gateway.proc

    want = optimize(data, model, plan=plan, max_iter=3, tol=0.0)
    res = optimize(data, model, plan=plan, executor=get("spark", master=sys.argv[2]), max_iter=3, tol=0.0,
                   callback=callback)
    jvm = seen["jvm"]
    children = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().split(")")[-1].split()[1] == str(os.getpid())]
    print("SAME", res.log_likelihood == want.log_likelihood, "JVM", jvm.poll() is not None, "CHILDREN", len(children),
          "SC", SparkContext._active_spark_context is None)
""")


def test_a_session_the_executor_starts_on_a_local_cluster_is_stopped_with_its_jvms():
    """The executor's own session on ``local-cluster[2,1,1024]`` (two executors in JVMs of
    their own, the tasks in their Python workers): the local trace to the last bit, and after
    the fit no JVM and no child process of this one is left (a process of its own: a process
    holds one SparkContext at a time)."""
    proc = subprocess.run([sys.executable, "-c", _OWN_SESSION, str(ROOT), "local-cluster[2,1,1024]"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "SAME True JVM True CHILDREN 0 SC True" in proc.stdout, proc.stdout + proc.stderr[-4000:]


def test_a_killed_task_is_replanned_when_asked_and_the_fit_ends_as_the_uninterrupted_one(session, nested):
    """A barrier stage ends with any of its tasks: the re-planned grid is a new stage on the
    session's slots, from the last completed iteration's model."""
    model, data = nested
    n = n_rows(model.prepare(data))
    plan = grid_plan(model, n, 2, 1)
    want = optimize(data, model, plan=plan, max_iter=12, tol=1e-7)
    cells = Cells(session)

    def kill_second_cell(it, ll, result):
        if it == 2 and not result.replans:
            os.kill(cells.ex.worker_pids[1], signal.SIGKILL)

    with deadline(180):
        got = optimize(data, model, plan=plan, executor=cells.ex, max_iter=12, tol=1e-7, callback=kill_second_cell,
                       on_worker_loss="replan")
    assert [r["iteration"] for r in got.replans] == [3]
    np.testing.assert_allclose(got.log_likelihood, want.log_likelihood, rtol=1e-9)
    assert got.iterations == want.iterations
    assert_nothing_running(session, [])

