"""Hostile input, one test per finding of a red-team pass (issue 29): the reproducer's situation
and the one-line refusal it must get, never a traceback, a hang or a run to the memory cap.

- Unbounded work from a small input: a spec's node count and a plan's worker count are
  checked against their documented limits before anything is built.
- Files that are no regular files (a FIFO, ``/dev/zero``), files larger than what is read
  whole, and headers that claim more than a file holds.
- Tables that cannot be read as the model reads them, and lines that used to blame the wrong
  thing (``tests/cli/test_hostile_files.py`` runs the same files through ``emgrid`` and checks
  one line and exit code 2).
- A table's scratch folder left by a killed process is removed by the next run.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from emgrid.executors import optimize
from emgrid.executors.datafiles import SCRATCH_PREFIX, new_table_scratch
from emgrid.models import (HMM, Categorical, Composite, DiagGaussian, Gaussian, Mixture, Poisson, ShardView, from_spec,
                           load_model)
from emgrid.models.base import FAMILIES
from emgrid.models.columns import MAX_ABS_VALUE
from emgrid.models.errors import ConfigError, DataError, FitError, SpecError
from emgrid.models.files import MAX_SPEC_FILE_BYTES, load_npy, load_npz
from emgrid.models.schema import MAX_SPEC_NODES, spec_node_count
from emgrid.models.sharded import save_model_sharded
from emgrid.models.tables import Table
from emgrid.planner import Resources, Worker
from emgrid.planner.resources import MAX_WORKERS

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def nested_k(depth: int, k: int = 2) -> dict:
    spec = {"family": "Gaussian"}
    for _ in range(depth):
        spec = {"family": "Mixture", "k": k, "component": spec}
    return spec


def refused_within(call, error, limit_bytes: int = 20 * 2**20):
    """Runs ``call``, which must raise ``error``; returns the error after checking that the
    refusal allocated less than ``limit_bytes`` (no building before counting)."""
    tracemalloc.start()
    try:
        with pytest.raises(error) as info:
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit_bytes, f"the refusal allocated {peak} bytes"
    return info.value


def finishes(call, timeout_s: float = 30.0):
    """``call()``'s exception, run on a thread that must end within ``timeout_s`` (a read of a
    FIFO would block forever)."""
    box = {}

    def run():
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "the call blocked"
    return box.get("error")


# ---------------------------------------------------------------- unbounded work from a small input
def test_a_spec_nesting_the_k_shorthand_40_deep_is_refused_before_building(tmp_path):
    path = tmp_path / "nest.json"
    path.write_text(json.dumps(nested_k(40)))
    assert path.stat().st_size < 2000  # the reproducer: 1.8 KB describing 2^41 - 1 nodes
    e = refused_within(lambda: load_model(path), SpecError)
    assert f"{2**41 - 1:,} nodes" in str(e) and f"limit is {MAX_SPEC_NODES:,}" in str(e)
    assert "\n" not in str(e)


@pytest.mark.parametrize("k", [10**9, 10**18, 2**63, 10**6])
def test_a_huge_k_is_refused_in_one_line_naming_the_count_and_the_limit(k):
    e = refused_within(lambda: from_spec({"family": "Mixture", "k": k, "component": {"family": "Gaussian"}}),
                       SpecError)
    assert f"{k + 1:,} nodes" in str(e) and "MAX_SPEC_NODES" in str(e)


def test_an_hmm_shorthand_multiplies_too():
    spec = {"family": "HMM", "n_states": 1000, "emission": {"family": "Composite", "children": [nested_k(1, 100)]}}
    e = refused_within(lambda: from_spec(spec), SpecError)
    assert f"{1 + 1000 * (1 + 1 + 100 * 1):,} nodes" in str(e)


def test_a_spec_at_the_limit_builds():
    model = from_spec({"family": "Mixture", "k": MAX_SPEC_NODES - 1, "component": {"family": "Gaussian"}})
    assert len(model.children) == MAX_SPEC_NODES - 1


def test_a_python_spec_sharing_one_sub_dict_is_counted_without_walking_it_each_time():
    shared = {"family": "Gaussian"}
    for _ in range(60):  # 2^60 uses of one dict: walked once
        shared = {"family": "Composite", "children": [shared, shared]}
    e = refused_within(lambda: from_spec(shared), SpecError)
    assert f"{2**61 - 1:,} nodes" in str(e)


SPECS = [
    nested_k(3, 3),
    {"family": "Composite", "children": [nested_k(2), {"family": "Poisson"},
                                         {"family": "Sequence", "child": {"family": "Gaussian"}}]},
    {"family": "HMM", "n_states": 3, "emission": {"family": "Composite", "fields": ["a", "b"],
                                                  "children": [{"family": "Gaussian"}, {"family": "Categorical",
                                                                                        "n_values": 2}]}},
    {"family": "Mixture", "components": [nested_k(1, 4), nested_k(2, 2)]},
]


@pytest.mark.parametrize("spec", SPECS)
def test_the_count_from_the_spec_equals_the_nodes_built(spec):
    """The count is an independent computation of what ``from_spec`` builds."""
    built = from_spec(spec)
    assert spec_node_count(spec, lambda f: getattr(FAMILIES.get(f), "repeat", None)) == len(list(built.nodes()))


@pytest.mark.parametrize("n", [10**9, MAX_WORKERS + 1])
def test_absurd_worker_counts_are_refused_against_the_planners_limit(n):
    e = refused_within(lambda: Resources.uniform(n), ConfigError)
    assert f"at most {MAX_WORKERS:,}" in str(e) and f"{n:,}" in str(e)


def test_resources_listing_too_many_workers_are_refused():
    workers = [Worker(name=f"w{i}") for i in range(MAX_WORKERS + 1)]
    with pytest.raises(ValueError, match=f"at most {MAX_WORKERS:,} workers"):
        Resources(workers=workers)
    assert Resources.uniform(MAX_WORKERS).n_workers == MAX_WORKERS


# ---------------------------------------------------------------- files that are no regular files
@pytest.fixture
def fifo(tmp_path):
    def make(name):
        p = tmp_path / name
        os.mkfifo(p)
        return p

    return make


def zero_link(tmp_path, name):
    p = tmp_path / name
    p.symlink_to("/dev/zero")
    return p


def three_shards():
    model = Composite([Mixture([Gaussian(-1.0, 1.0), Gaussian(2.0, 0.5)], [0.3, 0.7]), Poisson(3.0)])
    return model, ShardView.of(model, {"0.0": 0, "0.1": 1, "1": 1}, 2)


@pytest.mark.parametrize("name", ["model.json", "model.toml"])
def test_a_model_spec_that_is_a_fifo_or_dev_zero_is_refused_without_blocking(tmp_path, fifo, name):
    for path, kind in [(fifo(name), "FIFO"), (zero_link(tmp_path, "z" + name), "character device")]:
        e = finishes(lambda: load_model(path))
        assert isinstance(e, SpecError) and kind in str(e) and "regular file" in str(e), e


def test_a_shard_file_that_is_a_fifo_or_dev_zero_is_refused_without_blocking(tmp_path):
    model, view = three_shards()
    written = save_model_sharded(model, tmp_path / "model.json", view)
    shard = tmp_path / written.files[1]
    shard.unlink()
    os.mkfifo(shard)
    e = finishes(lambda: load_model(tmp_path / "model.json"))
    assert isinstance(e, SpecError) and "shard 1" in str(e) and "FIFO" in str(e), e
    shard.unlink()
    shard.symlink_to("/dev/zero")
    e = finishes(lambda: load_model(tmp_path / "model.json"))
    assert isinstance(e, SpecError) and "character device" in str(e), e


def test_a_spec_larger_than_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "model.json"
    with open(path, "wb") as f:  # sparse: no disk is used
        f.truncate(MAX_SPEC_FILE_BYTES + 1)
    e = refused_within(lambda: load_model(path), SpecError)
    assert f"{MAX_SPEC_FILE_BYTES + 1:,} bytes" in str(e) and "MAX_SPEC_FILE_BYTES" in str(e)


def test_a_shard_file_larger_than_the_limit_is_refused_before_it_is_read(tmp_path):
    model, view = three_shards()
    written = save_model_sharded(model, tmp_path / "model.json", view)
    with open(tmp_path / written.files[0], "r+b") as f:
        f.truncate(MAX_SPEC_FILE_BYTES + 1)
    e = refused_within(lambda: load_model(tmp_path / "model.json"), SpecError)
    assert "shard 0" in str(e) and f"{MAX_SPEC_FILE_BYTES + 1:,} bytes" in str(e)


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv", ".parquet"])
def test_a_data_path_that_is_a_fifo_or_dev_zero_is_refused_without_blocking(tmp_path, fifo, suffix):
    model = Composite({"a": Gaussian(0.0, 1.0)}) if suffix in (".csv", ".parquet") else Gaussian(0.0, 1.0)
    for path, kind in [(fifo("x" + suffix), "FIFO"), (zero_link(tmp_path, "z" + suffix), "character device")]:
        if suffix == ".npy":
            call = lambda: load_npy(path)  # noqa: E731
        elif suffix == ".npz":
            call = lambda: load_npz(path)  # noqa: E731
        else:
            call = lambda: optimize(str(path), model, max_iter=1)  # noqa: E731
        e = finishes(call)
        assert isinstance(e, DataError) and kind in str(e) and "regular file" in str(e), e


def test_an_npz_member_whose_header_claims_1e12_rows_is_refused_by_its_size(tmp_path):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    buf.write(np.zeros(10).tobytes())
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as z:
        z.writestr("x.npy", buf.getvalue())
    e = refused_within(lambda: load_npz(tmp_path / "x.npz"), DataError)
    assert "array 'x' is truncated" in str(e) and "(1000000000000,)" in str(e) and "80 bytes" in str(e)


def test_a_compressed_npz_still_reads(tmp_path):
    x = np.arange(1000.0)
    np.savez_compressed(tmp_path / "x.npz", x=x)
    np.testing.assert_array_equal(load_npz(tmp_path / "x.npz"), x)


# ---------------------------------------------------------------- specs that are not text
def test_a_non_utf8_model_spec_is_one_line_naming_the_byte(tmp_path):
    path = tmp_path / "model.json"
    path.write_bytes('{"family": "Gaussian", "mean": 0.0, "var": 1.0, "x": "\xe9"}'.encode("latin-1"))
    with pytest.raises(SpecError, match=r"is not UTF-8 text: byte 0xe9 at offset 54 \(line 1\)"):
        load_model(path)


def test_a_non_utf8_sharded_root_and_shard_file_are_one_line(tmp_path):
    model, view = three_shards()
    written = save_model_sharded(model, tmp_path / "model.json", view)
    shard = tmp_path / written.files[0]
    shard.write_bytes(shard.read_bytes().replace(b'"', b"\xff", 1))
    with pytest.raises(SpecError, match="shard 0 .* is not UTF-8 text: byte 0xff at offset [0-9]+"):
        load_model(tmp_path / "model.json")
    root = tmp_path / "model.json"
    root.write_bytes(b"\xfe" + root.read_bytes())
    with pytest.raises(SpecError, match="model spec .* is not UTF-8 text: byte 0xfe"):
        load_model(root)


@pytest.mark.parametrize("name", ["model.x\x00.shard-0.json", "model\n.json", "\x00"])
def test_a_nul_or_a_control_character_in_a_shard_name_is_refused(tmp_path, name):
    model, view = three_shards()
    save_model_sharded(model, tmp_path / "model.json", view)
    root = json.loads((tmp_path / "model.json").read_text())
    root["shards"][0]["file"] = name
    (tmp_path / "model.json").write_text(json.dumps(root))
    with pytest.raises(SpecError, match=r"shards\[0\].file must be a file name in the root's folder"):
        load_model(tmp_path / "model.json")


# ---------------------------------------------------------------- tables
def write(tmp_path, name, text) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def ab_rows(n=20) -> str:
    return "".join(f"{i * 0.1},{i % 3}\n" for i in range(n))


AB = Composite({"a": Mixture([Gaussian(), Gaussian()]), "b": Gaussian()})
TABLE_CASES = [
    # (name, file name, contents (text or a function writing the file), model, words of the one line)
    ("missing-column", "x.csv", "a,b\n" + ab_rows(), Composite({"a": Gaussian(), "zz": Gaussian()}),
     ["has no column 'zz'", "it has: a, b"]),
    ("ragged-row", "x.csv", "a,b\n1,2\n3\n4,5\n", AB, ["row 1 has 1 field(s)", "the header names 2"]),
    ("duplicate-names", "x.csv", "a,a\n1,2\n3,4\n", AB, ["names column 'a' twice"]),
    ("empty", "x.csv", "", AB, ["is empty"]),
    ("header-only", "x.csv", "a,b\n", AB, ["has no rows"]),
    ("cr-only", "x.csv", "a,b\r1,2\r3,4\r", AB, ["carriage return alone", "LF or CRLF"]),
    ("not-parquet", "x.parquet", "hello", AB, ["cannot be read as Parquet"]),
    ("truncated-parquet", "x.parquet", lambda p: p.write_bytes(parquet_bytes()[:200]), AB,
     ["cannot be read as Parquet"]),
    ("list-column", "x.parquet", lambda p: pq.write_table(pa.table({"a": pa.array([[1.0, 2.0]] * 10),
                                                                    "b": np.arange(10.0)}), p), AB,
     ["column 'a' holds list<", "numbers, strings or booleans"]),
    ("struct-column", "x.parquet", lambda p: pq.write_table(pa.table({"a": pa.array([{"x": 1.0}] * 10),
                                                                      "b": np.arange(10.0)}), p), AB,
     ["column 'a' holds struct<"]),
    ("inf", "x.csv", "a,b\n1,0\ninf,1\n2,2\n", AB, ["column 'a' holds inf at row 1", "finite"]),
    ("huge-values", "x.csv", "a,b\n1,0\n1e300,1\n-1e300,2\n" + ab_rows(), AB,
     ["column 'a' holds 1e+300 at row 1", f"within +-{MAX_ABS_VALUE:g}", "rescale"]),
]


def parquet_bytes() -> bytes:
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"a": np.arange(100.0), "b": np.arange(100.0)}), buf)
    return buf.getvalue().to_pybytes()


def make_file(tmp_path, name, contents) -> str:
    p = tmp_path / name
    if callable(contents):
        contents(p)
    else:
        p.write_text(contents)
    return str(p)


@pytest.mark.parametrize("case", TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
@pytest.mark.parametrize("read", ["optimize", "in-memory"])
def test_a_bad_table_file_is_one_data_error(tmp_path, case, read):
    _, name, contents, model, words = case
    path = make_file(tmp_path, name, contents)
    source = path if read == "optimize" else Table(path, drop_missing=True)  # drop_missing reads it whole
    with pytest.raises(DataError) as info:
        optimize(source, model, max_iter=2)
    msg = str(info.value)
    assert "\n" not in msg
    if read == "optimize" or case[0] not in ("inf", "huge-values", "header-only"):
        for w in words:
            assert w in msg, (w, msg)


def test_a_missing_sequence_id_column_is_one_line(tmp_path):
    path = write(tmp_path, "x.csv", "a,b\n" + ab_rows())
    for model in (Composite({"a": Gaussian()}), HMM([Composite({"a": Gaussian()})] * 2)):
        with pytest.raises(DataError, match="has no column 'user' \\(it has: a, b\\)"):
            optimize(Table(path, sequence_id="user"), model, max_iter=2)


def late_strings(tmp_path, column: str) -> str:
    """200,000 rows (well past the first MiB the column types are read from) whose last row
    holds a string in ``column``."""
    rows = [f"{i % 7}.5,{i % 3}" for i in range(200_000)]
    rows.append("x1,0" if column == "a" else "1.5,zz")
    return write(tmp_path, "late.csv", "a,b\n" + "\n".join(rows) + "\n")


def test_a_float_column_turning_to_strings_after_the_first_mib_names_its_row(tmp_path):
    path = late_strings(tmp_path, "a")
    with pytest.raises(DataError, match="column 'a' holds 'x1' at row 200000, where its first rows hold double"):
        optimize(path, AB, max_iter=2)


def test_a_worker_that_meets_such_a_row_reports_the_data_error(tmp_path):
    """A complete model reads its rows on the workers only: the worker's DataError reaches the
    caller inside the FitError (``emgrid`` exits 2 on it, ``tests/cli/test_hostile_files.py``)."""
    path = late_strings(tmp_path, "a")
    model = Composite({"a": Mixture([Gaussian(0.0, 1.0), Gaussian(1.0, 1.0)], [0.5, 0.5]), "b": Gaussian(0.0, 1.0)})
    with pytest.raises(FitError, match="DataError: data file .* column 'a' holds 'x1' at row 200000"):
        optimize(path, model, max_iter=2, executor="multiprocessing", resources=Resources.uniform(2))


def test_an_int_column_turning_to_strings_is_read_as_the_strings_it_holds(tmp_path):
    """The value list comes from the whole column (strings), and every worker reads the column
    as strings: no "value 0 was not seen"."""
    path = late_strings(tmp_path, "b")
    fit = optimize(path, Composite({"a": Gaussian(), "b": Categorical()}), max_iter=2)
    assert fit.model.children[1].values == ("0", "1", "2", "zz")
    counts = np.bincount(fit.model.prepare(path)[1], minlength=4)
    np.testing.assert_array_equal(counts, [66667, 66667, 66666, 1])


@pytest.mark.parametrize("bad, words", [(np.inf, ["NaN or inf", "row 2"]), (1e300, ["1e+300 at row 2", "rescale"])])
def test_inf_and_huge_values_in_arrays_name_the_row(bad, words):
    x = np.array([0.0, 1.0, bad, 2.0])
    for model in (Gaussian(), Mixture([Gaussian(), Gaussian()])):
        with pytest.raises(DataError) as info:
            optimize(x, model, max_iter=2)
        for w in words:
            assert w in str(info.value)
    v = np.random.default_rng(0).normal(size=(20, 2))
    v[3, 1] = bad
    with pytest.raises(DataError, match="row 3, entry 1"):
        optimize(v, Mixture([DiagGaussian(dim=2)] * 2), max_iter=2)


# ---------------------------------------------------------------- scratch left by a kill
KILLED_FIT = textwrap.dedent("""
    import os, signal, sys
    from emgrid.models import Composite, Gaussian, Mixture
    from emgrid.executors import optimize

    def stop(iteration, loglik, so_far):
        if sys.argv[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)

    model = Composite({"a": Mixture([Gaussian(0.0, 1.0), Gaussian(3.0, 1.0)], [0.5, 0.5])})
    optimize(sys.argv[1], model, max_iter=2, tol=0.0, callback=stop)
""")


def test_a_killed_fit_leaves_its_table_scratch_and_the_next_run_removes_it(tmp_path):
    """The reproducer: a process reading a CSV (each rank of the user's own mpiexec does) killed
    mid-fit leaves ``emgrid-table-*/rows.npy`` in the system temporary folder; the next run on
    this host removes it, and leaves nothing of its own."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    x = np.random.default_rng(0).normal(size=300)
    csv = write(tmp_path, "d.csv", "a\n" + "".join(f"{v}\n" for v in x))
    script = write(tmp_path, "fit.py", KILLED_FIT)
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, script, csv, "kill"], env=env, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    left = [p for p in temp.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    assert len(left) == 1 and (left[0] / "rows.npy").exists()
    other = temp / f"{SCRATCH_PREFIX}otherhost-1-abcdefgh"  # another host's (a shared temporary folder)
    other.mkdir()
    done = subprocess.run([sys.executable, script, csv, "run"], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert sorted(temp.iterdir()) == [other]


def test_a_running_processs_scratch_is_kept(tmp_path):
    mine = new_table_scratch(tmp_path)
    again = new_table_scratch(tmp_path)  # this process is alive: its first folder stays
    assert mine.exists() and again.exists() and mine != again
    assert mine.name.startswith(SCRATCH_PREFIX) and f"-{os.getpid()}-" in mine.name
