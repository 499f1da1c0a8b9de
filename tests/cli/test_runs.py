"""Runs that never mix, lose or leak work: bad inputs, checkpoints that belong to another run
or are damaged, output folders that are files, locked, or hold a planted symlink.

Every case runs ``emgrid.cli.main.main`` in this process (a subprocess per case would cost a
second of start-up each) and asserts the exit code, the one line the command says, and that
nothing in the folder was overwritten or left behind. ``test_signals.py`` runs the cases
that need a process of their own (signals, MPI, what a local fit imports).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from emgrid.cli.checkpoint import CHECKPOINT, read_checkpoint
from emgrid.cli.main import main
from emgrid.cli.outdir import LOCK, MANIFEST, OutputFolder

MIX = ('{ family = "Mixture", weights = [0.5, 0.5], components = [ { family = "Gaussian", mean = -1.0, var = 1.0 }, '
       '{ family = "Gaussian", mean = 1.0, var = 1.0 } ] }')

BASE = f"""
[model]
inline = {MIX}
[data]
path = "x.npy"
[resources]
workers = 1
[fit]
max_iter = 3
tol = 0.0
checkpoint_every = 1
output = "out"
"""


def run(tmp_path, capsys, *args, config=BASE, name="run.toml"):
    """``emgrid fit CONFIG ARGS --quiet`` in ``tmp_path``: (exit code, the lines on stderr)."""
    (tmp_path / name).write_text(config)
    capsys.readouterr()
    code = main(["fit", str(tmp_path / name), "--quiet", *args])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    return code, err


def state(folder: Path) -> dict:
    """Every file under ``folder`` and its bytes (symlinks as their target)."""
    out = {}
    for p in sorted(folder.rglob("*")) if folder.exists() else []:
        if p.is_symlink():
            out[str(p.relative_to(folder))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(folder))] = p.read_bytes()
    return out


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=300))
    return tmp_path


def one_error(err, *words, prefix="emgrid: error: "):
    assert len(err) == 1, err
    assert err[0].startswith(prefix), err
    for w in words:
        assert w in err[0], (w, err[0])


# ---------------------------------------------------------------- bad input: exit 2, one line
def _npy_header(path, shape):
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})
        f.write(np.zeros(10).tobytes())


def _files(d: Path) -> None:
    np.save(d / "good.npy", np.zeros(50))
    np.save(d / "wide.npy", np.zeros((50, 2)))
    (d / "trunc.npy").write_bytes((d / "good.npy").read_bytes()[:100])
    (d / "empty.npy").write_bytes(b"")
    (d / "random.npy").write_bytes(np.random.default_rng(1).bytes(500))
    (d / "dir.npy").mkdir()
    _npy_header(d / "over.npy", (10**6,))
    (d / "notzip.npz").write_bytes(b"hello, not a zip archive")
    np.savez(d / "full.npz", x=np.zeros(50), extra=np.ones(3))
    (d / "trunc.npz").write_bytes((d / "full.npz").read_bytes()[:200])
    np.save(d / "pois.npy", np.array([1.0, 2.0, 1e300]))
    inner = '{"family": "Gaussian", "mean": 0.0, "var": 1.0}'
    for depth in (300, 2000):
        (d / f"deep{depth}.json").write_text('{"family": "Mixture", "weights": [1.0], "components": [' * depth + inner
                                             + "]}" * depth)


def _cfg(**repl):
    text = BASE
    for old, new in repl.items():
        text = text.replace(old, new)
    return text


BAD = [
    ("truncated-npy", _cfg(**{'"x.npy"': '"trunc.npy"'}), [], ["trunc.npy\'", "damaged .npy header"]),
    ("empty-npy", _cfg(**{'"x.npy"': '"empty.npy"'}), [], ["empty.npy\'", "not a .npy file", "empty"]),
    ("random-npy", _cfg(**{'"x.npy"': '"random.npy"'}), [], ["random.npy\'", "not a .npy file"]),
    ("over-claiming-npy", _cfg(**{'"x.npy"': '"over.npy"'}), [], ["over.npy\'", "truncated", "(1000000,)", "80 bytes"]),
    ("directory-npy", _cfg(**{'"x.npy"': '"dir.npy"'}), [], ["dir.npy\'", "is a folder"]),
    ("non-zip-npz", _cfg(**{'"x.npy"': '"notzip.npz"'}), [], ["notzip.npz\'", "not a .npz file"]),
    ("truncated-npz", _cfg(**{'"x.npy"': '"trunc.npz"'}), [], ["trunc.npz\'", "not a .npz file"]),
    ("extra-arrays-npz", _cfg(**{'"x.npy"': '"full.npz"'}), [], ["full.npz\'", "does not use: extra"]),
    ("paths-of-two-shapes", _cfg(**{'path = "x.npy"': 'paths = ["good.npy", "wide.npy"]'}), [],
     ["wide.npy\'", "(2,)", "good.npy\'", "()"]),
    ("memory-inf", _cfg(**{"workers = 1": "workers = 1\nmemory = inf"}), [], ["resources.memory", "inf", "finite"]),
    ("flops-inf", _cfg(**{"workers = 1": "workers = 1\nflops_per_s = inf"}), [], ["flops_per_s", "inf", "finite"]),
    ("flops-nan", _cfg(**{"workers = 1": "workers = 1\nflops_per_s = nan"}), [], ["flops_per_s", "nan", "finite"]),
    ("cli-workers-0", BASE, ["--workers", "0"], ["--workers 0", ">= 1"]),
    ("cli-flops-negative", BASE, ["--flops", "-1"], ["--flops -1.0", "> 0"]),
    ("cli-flops-inf", BASE, ["--flops", "inf"], ["--flops inf", "finite"]),
    ("spec-300-deep", _cfg(**{f"inline = {MIX}": 'spec = "deep300.json"'}), [],
     ["deep300.json\'", "nested more than 100 levels", "(the limit)"]),
    ("spec-2000-deep", _cfg(**{f"inline = {MIX}": 'spec = "deep2000.json"'}), [],
     ["deep2000.json\'", "nested too deep", "limit is 100"]),
    ("poisson-1e300", _cfg(**{f"inline = {MIX}": 'inline = { family = "Poisson", rate = 1.0 }',
                              '"x.npy"': '"pois.npy"'}), [], ["Poisson", "2**63", "1e+300"]),
]


@pytest.mark.parametrize("config,args,words", [r[1:] for r in BAD], ids=[r[0] for r in BAD])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(folder, capsys, config, args, words):
    _files(folder)
    before = state(folder)
    code, err = run(folder, capsys, *args, config=config)
    assert code == 2, err
    one_error(err, *words)
    assert not (folder / "out").exists()  # made before the work, and removed again: nothing was written
    assert state(folder) == {**before, "run.toml": (folder / "run.toml").read_bytes()}


def test_resources_uniform_refuses_inf_and_nan_with_its_own_error():
    from emgrid.models.errors import ConfigError
    from emgrid.planner import Resources

    for kw, words in [({"flops_per_s": float("nan")}, "flops_per_s"), ({"flops_per_s": float("inf")}, "flops_per_s"),
                      ({"memory_bytes": float("inf")}, "memory_bytes")]:
        with pytest.raises(ConfigError, match=f"{words} must be a finite number"):
            Resources.uniform(2, **kw)


def test_deep_specs_are_refused_without_recursion():
    from emgrid.models import from_spec
    from emgrid.models.errors import SpecError

    spec = {"family": "Gaussian", "mean": 0.0, "var": 1.0}
    for _ in range(5000):
        spec = {"family": "Mixture", "weights": [1.0], "components": [spec]}
    with pytest.raises(SpecError, match="nested more than 100 levels deep"):
        from_spec(spec)


@pytest.mark.parametrize("edit,words", [
    (lambda p: {"replica_rows": (900, 100)}, "worker 'w0' has 500 rows but replica 0 has 900"),
    (lambda p: {"per_worker": (p.per_worker[0].model_copy(update={"memory_limit": 1}),) + p.per_worker[1:]},
     "worker 'w0' needs .* bytes but its memory_limit is 1"),
], ids=["replica-rows", "memory-limit"])
def test_optimize_with_a_hand_edited_plan_and_no_resources_is_refused(edit, words):
    from emgrid.executors import optimize
    from emgrid.models import Gaussian, Mixture
    from emgrid.models.errors import PlanError
    from emgrid.planner import Resources, balance_plan

    model = Mixture([Gaussian(0.0, 1.0), Gaussian(1.0, 1.0)], [0.5, 0.5])
    plan = balance_plan(model, Resources.uniform(2, memory_bytes=2**30), n_data=1000, grid=(2, 1))
    with pytest.raises(PlanError, match=words):
        optimize(model.sample(1000, np.random.default_rng(0)), model, plan=plan.model_copy(update=edit(plan)),
                 max_iter=2)


# ---------------------------------------------------------------- --resume: what it resumes
def _first_fit(folder, capsys):
    code, err = run(folder, capsys)
    assert code == 1, err  # tol = 0: max_iter ends it, "not converged"
    return state(folder / "out")


RESUME = [
    ("fewer-rows", lambda d: np.save(d / "x.npy", np.random.default_rng(0).normal(size=150)), BASE,
     ["the data changed: 300 rows -> 150 rows"]),
    ("same-rows-other-values", lambda d: np.save(d / "x.npy", np.random.default_rng(9).normal(size=300)), BASE,
     ["the data file", "x.npy", "content digest differs"]),
    ("other-family", None, _cfg(**{'family = "Gaussian", mean = 1.0, var = 1.0': 'family = "Exponential", rate = 1.0'}),
     ["the model changed", "Gaussian reading float at 1 -> Exponential reading float at 1"]),
    ("more-components", None, _cfg(**{"weights = [0.5, 0.5]": "weights = [0.4, 0.3, 0.3]",
                                      "mean = 1.0, var = 1.0 }": "mean = 1.0, var = 1.0 }, "
                                                                 "{ family = \"Gaussian\", mean = 2.0, var = 1.0 }"}),
     ["the model changed", "children=2", "children=3"]),
    ("other-regularization", None, _cfg(**{"tol = 0.0": "tol = 0.0\nreg_covar = 0.1"}),
     ["[fit] reg_covar changed: 0.0 -> 0.1"]),
]


@pytest.mark.parametrize("change,config,words", [r[1:] for r in RESUME], ids=[r[0] for r in RESUME])
def test_resume_refuses_a_checkpoint_of_another_run_naming_what_changed(folder, capsys, change, config, words):
    saved = _first_fit(folder, capsys)
    if change is not None:
        change(folder)
    code, err = run(folder, capsys, "--resume", config=config)
    assert code == 2, err
    one_error(err, "checkpoint", "out/checkpoint.json", "belongs to another run", *words)
    assert state(folder / "out") == saved


def _edit(key, value):
    def edit(raw):
        raw[key] = value
        return json.dumps(raw)
    return edit


def _drop(key):
    def edit(raw):
        del raw[key]
        return json.dumps(raw)
    return edit


DAMAGED = [
    ("negative-iteration", _edit("iteration", -5), ["field 'iteration' = -5"]),
    ("trace-longer-than-iteration", lambda raw: json.dumps({**raw, "log_likelihood": [-1.0] * 10}),
     ["iteration 3 with a trace of 10 entries"]),
    ("nan-in-trace", lambda raw: json.dumps(raw).replace(str(raw["log_likelihood"][1]), "NaN"),
     ["log_likelihood[1] = nan is not finite"]),
    ("random-bytes", lambda raw: np.random.default_rng(2).bytes(300), ["is damaged: not JSON"]),
    ("json-list", lambda raw: json.dumps([1, 2, 3]), ["a JSON object is expected, got a list"]),
    ("missing-model", _drop("model"), ["field 'model' is missing"]),
    ("model-not-a-spec", _edit("model", {"family": "Nope"}), ["field 'model'", "unknown model family 'Nope'"]),
    ("missing-fingerprint", _drop("fingerprint"), ["field 'fingerprint' is missing"]),
    ("unknown-field", _edit("colour", "red"), ["unknown field 'colour'"]),
    ("beyond-max-iter", lambda raw: json.dumps({**raw, "iteration": 4, "log_likelihood": raw["log_likelihood"] + [-1.0]}),
     ["at iteration 4, beyond [fit] max_iter = 3"]),
]


@pytest.mark.parametrize("damage,words", [r[1:] for r in DAMAGED], ids=[r[0] for r in DAMAGED])
def test_resume_of_a_damaged_checkpoint_is_exit_2_naming_file_and_field(folder, capsys, damage, words):
    _first_fit(folder, capsys)
    path = folder / "out" / CHECKPOINT
    blob = damage(json.loads(path.read_text()))
    path.write_bytes(blob if isinstance(blob, bytes) else blob.encode())
    saved = state(folder / "out")
    code, err = run(folder, capsys, "--resume")
    assert code == 2, err
    one_error(err, "--resume: checkpoint", "out/checkpoint.json", *words)
    assert "Traceback" not in "\n".join(err)
    assert state(folder / "out") == saved


def test_resume_of_a_matching_checkpoint_continues_the_trace(folder, capsys):
    _first_fit(folder, capsys)
    _, _, trace = read_checkpoint(folder / "out")
    code, err = run(folder, capsys, "--resume", "--max-iter", "5")
    assert code == 1, err
    report = json.loads((folder / "out" / "report.json").read_text())
    assert report["iterations"] == 5 and report["log_likelihood"][:3] == trace


# ---------------------------------------------------------------- the output folder
def test_an_output_that_is_a_file_or_under_one_is_refused_before_any_work(folder, capsys):
    (folder / "afile").write_text("mine")
    for out, words in [("afile", ["'", "afile'", "exists and is not a folder"]),
                       ("afile/sub", ["afile/sub'", "a part of the path is a file"])]:
        code, err = run(folder, capsys, "--output", out)
        assert code == 2, err
        one_error(err, *words)
    assert (folder / "afile").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_output_is_refused_before_any_work(folder, capsys):
    (folder / "ro").mkdir(mode=0o555)
    code, err = run(folder, capsys, "--output", "ro")
    assert code == 2, err
    one_error(err, "'", "ro'", "not writable")


def test_a_planted_symlink_is_replaced_not_followed(folder, capsys):
    (folder / "out").mkdir()
    (folder / "victim").write_text("precious")
    (folder / "out" / "model.json").symlink_to(folder / "victim")
    (folder / "out" / "report.json").symlink_to(folder / "victim")
    code, err = run(folder, capsys)
    assert code == 1, err
    assert (folder / "victim").read_text() == "precious"
    assert not (folder / "out" / "model.json").is_symlink()
    json.loads((folder / "out" / "model.json").read_text())


def test_a_second_run_into_a_locked_folder_is_refused_naming_the_holder(folder, capsys):
    (folder / "out").mkdir()
    with OutputFolder.open(folder / "out"):
        saved = state(folder / "out")
        code, err = run(folder, capsys)
        assert code == 2, err
        one_error(err, "output folder", "is in use by another emgrid run", f"pid {os.getpid()}")
        assert state(folder / "out") == saved
    assert not (folder / "out" / LOCK).exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over(folder, capsys):
    (folder / "out").mkdir()
    (folder / "out" / LOCK).write_text("999999999 somehost 1700000000\n")  # no process holds it
    # what a killed run left, its tag in the folder's manifest, beside a user's look-alikes
    (folder / "out" / MANIFEST).write_text(json.dumps({"format": 1, "runs": ["deadbeef"], "files": []}))
    (folder / "out" / ".emgrid-scratch-deadbeef-data").mkdir()
    (folder / "out" / ".model.json.deadbeef-0.tmp").write_text("half")
    (folder / "out" / ".notes.tmp").write_text("mine")
    code, err = run(folder, capsys)
    assert code == 1, err
    assert sorted(p.name for p in (folder / "out").iterdir()) == [
        MANIFEST, ".notes.tmp", "checkpoint.json", "model.json", "report.json"]
    assert json.loads((folder / "out" / MANIFEST).read_text())["runs"] == []


def test_a_write_that_fails_after_the_fit_is_one_line_exit_3(folder, capsys, monkeypatch):
    from emgrid.cli import outdir

    real = outdir.write_atomic

    def full(path, data):
        if Path(path).name == "report.json":
            raise outdir.OutputError(f"cannot write {str(path)!r}: No space left on device")
        return real(path, data)

    monkeypatch.setattr(outdir, "write_atomic", full)
    code, err = run(folder, capsys)
    assert code == 3, err
    one_error(err, "report.json", "No space left on device", prefix="emgrid: fit failed: ")
    assert read_checkpoint(folder / "out")[0] == 3  # the periodic checkpoints were written


def test_a_resume_stops_where_the_uninterrupted_run_converges(folder, capsys):
    """The first resumed iteration's convergence test compares against the checkpoint's last
    log-likelihood, so a fit stopped one iteration before converging and resumed ends with
    the uninterrupted trace, not one iteration more."""
    code, err = run(folder, capsys, "--max-iter", "200", "--tol", "1e-4", "--output", "whole")
    assert code == 0, err
    whole = json.loads((folder / "whole" / "report.json").read_text())["log_likelihood"]
    assert len(whole) >= 3
    code, err = run(folder, capsys, "--max-iter", str(len(whole) - 1), "--tol", "1e-4")
    assert code == 1, err
    code, err = run(folder, capsys, "--resume", "--max-iter", "200", "--tol", "1e-4")
    assert code == 0, err
    resumed = json.loads((folder / "out" / "report.json").read_text())["log_likelihood"]
    assert resumed == whole


@pytest.mark.parametrize("kind", ["dask", "ray"])  # Spark's: the Parquet test below
def test_the_cluster_executors_run_from_config_with_the_local_trace(folder, capsys, kind):
    pytest.importorskip({"dask": "distributed", "ray": "ray"}[kind])
    two = BASE.replace("workers = 1", "workers = 2")
    code, err = run(folder, capsys, "--output", "local", config=two)
    assert code == 1, err
    code, err = run(folder, capsys, "--output", kind, config=two + f'[executor]\nkind = "{kind}"\n')
    assert code == 1, err
    local, engine = (json.loads((folder / d / "report.json").read_text()) for d in ("local", kind))
    assert engine["log_likelihood"] == pytest.approx(local["log_likelihood"], rel=1e-9)


def test_an_address_for_an_executor_without_a_cluster_is_refused(folder, capsys):
    code, err = run(folder, capsys, config=BASE + '[executor]\nkind = "multiprocessing"\naddress = "tcp://h:8786"\n')
    assert code == 2
    one_error(err, "address", "tcp://h:8786", "dask and ray")


@pytest.mark.parametrize("when", ["opened", "written", "renamed"])
def test_a_signal_in_the_middle_of_an_atomic_write_leaves_no_temporary_file(tmp_path, monkeypatch, when):
    """Ctrl-C can land right after the temporary file is created (before its descriptor is
    stored), while it is written, or at the rename: the temporary file goes every time and the
    target keeps its previous contents."""
    from emgrid.cli import outdir

    target = tmp_path / "checkpoint.json"
    target.write_text("previous")
    real = {"opened": os.open, "written": os.fsync, "renamed": os.replace}[when]

    def interrupted(*a, **k):
        real(*a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(outdir.os, {"opened": "open", "written": "fsync", "renamed": "replace"}[when], interrupted)
    with pytest.raises(KeyboardInterrupt):
        outdir.write_atomic(target, "new")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
    assert target.read_text() == ("new" if when == "renamed" else "previous")


def test_a_lost_worker_is_one_line_and_the_fit_goes_on_when_asked(folder, capsys, monkeypatch):
    """Worker w1 kills itself in iteration 2; with on_worker_loss = "replan" the run says so in
    one line and ends with the trace of a run that lost nothing."""
    # slow workers and a fast network: every machine's plan is 2x1
    two = BASE.replace("workers = 1", "workers = 2\nflops_per_s = 1e6\nlatency_s = 1e-6\nbytes_per_s = 1e10").replace(
        "max_iter = 3", "max_iter = 5")
    code, err = run(folder, capsys, "--output", "whole", config=two)
    assert code == 1, err
    monkeypatch.setenv("EMGRID_FAULT", "kill:worker=w1:iteration=2:block=1")
    code, err = run(folder, capsys, "--output", "failed", config=two + '[executor]\nkind = "multiprocessing"\n')
    assert code == 3, err
    code, err = run(folder, capsys, "--output", "elastic",
                    config=two + '[executor]\nkind = "multiprocessing"\non_worker_loss = "replan"\n')
    assert code == 1, err  # not converged in 5 iterations: it ran to the end
    (line,) = [ln for ln in err if "re-planned" in ln]
    assert re.match(r"emgrid: re-planned: worker 'w1' .* was killed by signal 9 in iteration 2; iteration 2 redone "
                    r"on 1x1 \(was 2x1\), [\d.]+ s lost$", line), line
    whole, elastic = (json.loads((folder / d / "report.json").read_text()) for d in ("whole", "elastic"))
    assert elastic["log_likelihood"] == pytest.approx(whole["log_likelihood"], rel=1e-9)


def test_replan_on_an_executor_that_cannot_is_refused(folder, capsys):
    code, err = run(folder, capsys, config=BASE + '[executor]\nkind = "mpi"\non_worker_loss = "replan"\n')
    assert code == 2
    one_error(err, "on_worker_loss", "replan", "not mpi")


def test_a_parquet_file_is_read_by_spark_on_the_spark_executor(tmp_path, capsys, monkeypatch):
    """``[data] path`` of Parquet with ``kind = "spark"``: Spark reads it (a string category
    bound by its distinct values) and the fit ends with the local fit's trace."""
    pytest.importorskip("pyspark")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime")
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 2, 400)
    pq.write_table(pa.table({"x": rng.normal(size=400) + 3.0 * codes,
                             "c": np.array(["a", "b"], dtype=object)[codes]}), tmp_path / "t.parquet")
    config = ('[model]\ninline = { family = "Mixture", k = 2, component = { family = "Composite", children = '
              '[ { family = "Gaussian" }, { family = "Categorical" } ], fields = ["x", "c"] } }\n'
              '[data]\npath = "t.parquet"\n[resources]\nworkers = 2\n[fit]\nmax_iter = 4\ntol = 0.0\noutput = "out"\n')
    code, err = run(tmp_path, capsys, "--output", "local", config=config)
    assert code == 1, err
    code, err = run(tmp_path, capsys, "--output", "spark", config=config + '[executor]\nkind = "spark"\n')
    assert code == 1, err
    local, spark = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("local", "spark"))
    assert spark["log_likelihood"] == pytest.approx(local["log_likelihood"], rel=1e-9)
