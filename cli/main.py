"""``emgrid``: plan and fit nested models by EM on a D x M worker grid.

Exit codes: 0 done; 1 the fit did not converge within ``max_iter``; 2 bad input
(config, model, data, resources, an output folder that cannot be made, written or locked, a
checkpoint that is damaged or belongs to another run); 3 the fit failed while running (a
worker died, the statistics became non-finite, a result could not be written); 130
interrupted (Ctrl-C), 143 terminated (SIGTERM): either writes the checkpoint of the last
finished iteration first; 141 the reader of the output went away (``emgrid plan ... | head``:
silent, as a command killed by SIGPIPE).

``emgrid fit`` makes, checks and locks its output folder before any work
(``emgrid.cli.outdir``), writes every file atomically, and keeps every temporary file of the
run in that folder; a checkpoint records what run it belongs to (``emgrid.cli.checkpoint``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

from .predict import add_parser as add_predict_parser
from .predict import cmd_predict

EXIT_OK, EXIT_NOT_CONVERGED, EXIT_BAD_INPUT, EXIT_FAILED = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


#: The executors ``emgrid advise`` measures beside local, in the order it reports them.
ADVISABLE = ("multiprocessing", "mpi", "dask", "ray", "spark")


def executor_list(text: str) -> list[str]:
    """``emgrid advise --measure``: a comma-separated subset of :data:`ADVISABLE`, each named once."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ADVISABLE]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(ADVISABLE)}")
    return [k for k in ADVISABLE if k in kinds]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emgrid", description=__doc__.split("\n")[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def overrides(sp):
        sp.add_argument("config", help="a TOML run configuration")
        sp.add_argument("--workers", type=int, help="plan for this many workers")
        sp.add_argument("--memory", help="memory per worker, e.g. 4GiB")
        sp.add_argument("--flops", type=float, help="FLOP/s per worker")
        sp.add_argument("--executor", choices=["local", "multiprocessing", "mpi", "dask", "ray", "spark"], help="override [executor] kind")

    sp = sub.add_parser("plan", help="print the balance plan for a config")
    overrides(sp)
    sp.add_argument("--json", action="store_true", help="print the plan as JSON")
    sp.add_argument("--picture", help="draw per-worker load and memory to this PNG (needs matplotlib)")

    sp = sub.add_parser("fit", help="plan and fit")
    overrides(sp)
    sp.add_argument("--quiet", action="store_true", help="no plan table or progress bar")
    sp.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    sp.add_argument("--max-iter", type=int, help="override [fit] max_iter")
    sp.add_argument("--tol", type=float, help="override [fit] tol")
    sp.add_argument("--output", help="override [fit] output (a folder, relative to the current one)")
    sp.add_argument("--seed", type=int, help="override [fit] seed (a template's starts)")
    sp.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)

    sp = sub.add_parser("advise", help="measure and say whether distributing helps")
    overrides(sp)
    sp.add_argument("--measure", type=executor_list, metavar="KIND[,KIND...]",
                    help="measure only these of multiprocessing, mpi, dask, ray, spark (default: each one that "
                         "can run here; a cluster engine's local cluster takes seconds to start)")

    sp = sub.add_parser("demo", help="run a built-in heterogeneous example end to end")
    sp.add_argument("--rows", type=int, default=20000)
    sp.add_argument("--executor", choices=["local", "multiprocessing", "mpi", "dask", "ray", "spark"], default="local")
    sp.add_argument("--quiet", action="store_true")
    add_predict_parser(sub)
    return p


#: The command-line flag behind each config key it overrides (for their errors).
_FLAGS = {"resources.workers": "--workers", "resources.memory": "--memory", "resources.flops_per_s": "--flops",
          "fit.max_iter": "--max-iter", "fit.tol": "--tol", "fit.output": "--output", "fit.seed": "--seed"}


def _config(args):
    from pydantic import ValidationError

    from .config import RunConfig, load_config, parse_memory

    cfg = load_config(args.config)
    res = cfg.resources.model_dump()
    if args.workers is not None:
        res["workers"] = args.workers
        res["detect"] = None
    if args.memory is not None:
        try:
            res["memory"] = parse_memory(args.memory)
        except ValueError as e:
            from emgrid.models.errors import ConfigError

            raise ConfigError(f"--memory: {e}") from None
    if args.flops is not None:
        res["flops_per_s"] = args.flops
    ex = cfg.executor.model_dump()
    if args.executor:
        ex["kind"] = args.executor
    if args.workers is not None:
        ex["processes"] = None  # --workers names the worker count for both
    fit = cfg.fit.model_dump()
    for key in ("max_iter", "tol", "output", "seed"):
        value = getattr(args, key, None)
        if value is not None:
            fit[key] = str(Path(value).resolve()) if key == "output" else value
    try:
        return RunConfig.model_validate({**cfg.model_dump(), "resources": res, "executor": ex, "fit": fit})
    except ValidationError as e:
        from emgrid.models.errors import ConfigError

        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        flag = _FLAGS.get(where, where)
        raise ConfigError(f"{flag} {err.get('input')!r}: {_must(err)}") from None


def _must(err: dict) -> str:
    """A pydantic error's rule as the flag's own words (``must be >= 1``)."""
    ctx = err.get("ctx") or {}
    words = {"greater_than_equal": f"must be >= {ctx.get('ge')}", "greater_than": f"must be > {ctx.get('gt')}",
             "finite_number": "must be a finite number", "less_than_equal": f"must be <= {ctx.get('le')}"}
    return words.get(err["type"], err["msg"].removeprefix("Value error, "))


def _plan(cfg, model, n):
    from emgrid.planner import balance_plan

    from .session import build_resources, build_solver

    return balance_plan(model, build_resources(cfg), n_data=n, solver=build_solver(cfg), dtype=cfg.fit.dtype)


def cmd_plan(args) -> int:
    from .report import plan_table
    from .session import build_model, shaped_model

    cfg = _config(args)
    model, n = shaped_model(cfg, build_model(cfg))
    plan = _plan(cfg, model, n)
    if args.json:
        print(plan.to_json(indent=1))
    else:
        print(plan_table(plan))
    if args.picture:
        from .picture import draw_plan

        wrote = draw_plan(plan, args.picture)
        print(f"emgrid: wrote the plan's picture to {wrote}", file=sys.stderr)
    return EXIT_OK


def _n_rows(data):
    """Rows of prepared data or of a dataset on disk."""
    from emgrid.executors import NpyDataset
    from emgrid.models import n_rows

    return data.n_rows if isinstance(data, NpyDataset) else n_rows(data)


def _n_observations(model, data) -> int:
    """The ``n`` of BIC: positions when the rows are sequences (as hmmlearn counts), else rows;
    data not in memory (a dataset on disk, a Spark DataFrame) count their own."""
    from emgrid.models.inference import n_observations

    return data.n_observations() if hasattr(data, "n_observations") else n_observations(model, data)


#: the files a fit writes under these names in its output folder (its shard files have a new
#: tag on every write, so they never name an existing file)
FIT_OUTPUTS = ("model.json", "report.json", "checkpoint.json")


def _under_mpiexec() -> bool:
    from .launch import under_mpiexec

    return under_mpiexec()


def cmd_fit(args) -> int:
    from emgrid.executors.datafiles import table_scratch
    from emgrid.models import complete_shapes

    from .checkpoint import fingerprint
    from .launch import RankRecord
    from .outdir import OutputFolder
    from .session import build_data, build_model, config_inputs, dropped_rows, spark_table, table_dataset

    cfg = _config(args)
    if cfg.executor.kind == "mpi" and not _under_mpiexec():
        return _launch_mpi(args, cfg)
    record = RankRecord.here()  # a rank of a job _launch_mpi started: tell the parent how it went
    if record is not None:
        record.started()
        _release_mpi_files()
    lead = _rank() == 0
    out = cfg.resolve(cfg.fit.output)
    # the folder is made, checked and locked before any work (the launcher of an MPI job holds
    # the lock for its ranks); its scratch holds every temporary file of the run
    folder = OutputFolder.open(out) if lead and record is None else None
    try:
        if folder is not None:
            folder.refuse_inputs(FIT_OUTPUTS, config_inputs(cfg, args.config))
        model = build_model(cfg)
        parquet = spark_table(cfg)
        if parquet is not None:
            return _fit_on_spark(cfg, args, model, parquet)
        scratch = folder.scratch("table") if folder is not None else _rank_scratch(record, "table")
        # a .parquet / .csv file: every worker reads only its rows of it (the dataset's folder
        # holds the row offsets and lives as long as the fit)
        with table_scratch(scratch) as tables:  # named for this process: a run after a kill removes it
            table = table_dataset(cfg, model, tables)
            with warnings.catch_warnings():  # the rows drop_missing leaves out: said below, by number
                warnings.filterwarnings("ignore", message="dropped .* rows with a missing value")
                data = table if table is not None else build_data(cfg, model)
            dropped = dropped_rows(cfg, model)
            # a template's sizes from the data, before planning
            model = complete_shapes(model, table.open(lazy=True) if table is not None else data)
            n = table.n_rows if table is not None else _n_rows(data)
            plan = _plan(cfg, model, n)
            fp = fingerprint(cfg, model, n, plan)
            options = {}
            if cfg.executor.kind == "multiprocessing":  # its copy of the data, in the folder's scratch
                options["tmp_dir"] = str(folder.scratch("data") if folder is not None else tables)
            return run_fit(cfg, model, data, plan, quiet=args.quiet, resume=args.resume, record=record,
                           fingerprint=fp, executor_options=options, dropped=dropped)
    finally:
        if folder is not None:
            folder.close()


def _fit_on_spark(cfg, args, model, table) -> int:
    """``emgrid fit`` of a Parquet file on the spark executor: Spark reads it and binds the
    model (``SparkExecutor.adopt``), the session held from the count to the fit's end."""
    from emgrid.executors import get

    from .checkpoint import fingerprint

    options = {k: v for k, v in cfg.executor.executor_options().items() if k == "master"}
    ex = get("spark", **options)
    with ex.opened():
        data, model = ex.adopt(table, model)
        n = data.n_rows
        plan = _plan(cfg, model, n)
        return run_fit(cfg, model, data, plan, quiet=args.quiet, resume=args.resume, record=None,
                       fingerprint=fingerprint(cfg, model, n, plan))


def _release_mpi_files() -> None:
    """Once every rank has started MPI, MPICH's shared-memory files are unlinked (the ranks
    keep their mappings), so that no end of the job leaves them in /dev/shm."""
    from mpi4py import MPI

    from emgrid.executors.mpi import release_shared_memory_files

    MPI.COMM_WORLD.Barrier()
    release_shared_memory_files(MPI.COMM_WORLD)


def _rank_scratch(record, what: str) -> str | None:
    """A rank's scratch under its launcher's record folder (in the output folder), or the
    system's temporary folder for a rank of the user's own mpiexec."""
    if record is None:
        return None
    d = record.folder / f"{what}-{record.rank}"
    d.mkdir(exist_ok=True)
    return str(d)


def _launch_mpi(args, cfg) -> int:
    """Re-runs this command under ``mpiexec`` with one rank per worker of the plan.

    The output folder is made, checked and locked here, and a ``--resume`` checked against
    its checkpoint, before any rank starts. Exits with the command's own code as rank 0
    reports it; a job that ends without rank 0's report (a rank died and ``mpiexec`` killed
    the others) is a failed fit: 3, and one line naming the rank, the iteration and the
    checkpoint (see ``emgrid.cli.launch``).
    """
    from .checkpoint import fingerprint, read_checkpoint
    from .launch import launch, mpi_command
    from .outdir import OutputFolder
    from .session import build_model, config_inputs, shaped_model

    out = cfg.resolve(cfg.fit.output)
    with OutputFolder.open(out) as folder:
        folder.refuse_inputs(FIT_OUTPUTS, config_inputs(cfg, args.config))
        model, n = shaped_model(cfg, build_model(cfg))
        plan = _plan(cfg, model, n)
        if args.resume:
            read_checkpoint(out, fingerprint(cfg, model, n, plan), max_iter=cfg.fit.max_iter)
        cmd = mpi_command(plan.workers_used, ["fit"] + sys.argv[sys.argv.index("fit") + 1:], debug=args.debug)
        return launch(cmd, plan, out, cfg.fit.max_iter, record_dir=folder.scratch("mpi"))


def _rank() -> int:
    """This process's MPI rank: 0 outside ``mpiexec``, where MPI is neither imported nor initialized."""
    if not _under_mpiexec():
        return 0
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_rank()
    except Exception:  # noqa: BLE001 - no MPI runtime means a single process
        return 0


def _signal_exit(e: BaseException) -> int:
    return 128 + int(getattr(e, "signum", signal.SIGINT))


def run_fit(cfg, model, data, plan, **options) -> int:
    """Fits and writes the results (:class:`emgrid.cli.fitrun.FitRun`)."""
    from .fitrun import FitRun

    return FitRun(cfg, model, data, plan, **options).run()


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or the launcher's stop request) as Ctrl-C is: ``signum`` decides the exit code."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


def _raise_interrupted(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_ignored():
    """SIGINT and SIGTERM held off (in the main thread) while the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def cmd_demo(args) -> int:
    from .demo import cmd_demo as demo

    return demo(args)


def cmd_advise(args) -> int:
    from .advise import advise

    cfg = _config(args)
    print(advise(cfg, args.measure))
    return EXIT_OK


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()  # here, so that a reader that went away is noticed below
    except BrokenPipeError:
        # the reader of stdout (``| head``) is gone: stop quietly; stdout goes to /dev/null
        # so that the interpreter's last flush at exit does not complain either
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


def _run(args) -> int:
    handlers = {"plan": cmd_plan, "fit": cmd_fit, "demo": cmd_demo, "advise": cmd_advise, "predict": cmd_predict}
    record = None
    if args.command in ("fit", "demo") and _under_mpiexec():
        from .launch import RankRecord

        record = RankRecord.here()  # this is a rank of a job `emgrid fit` started: report to it
    previous = None
    if record is None and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)  # SIGTERM stops a run as Ctrl-C does: 143
    try:
        code = _handle(handlers[args.command], args, record)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if record is not None and record.rank == 0:
        record.finished(code)
    return code


def _handle(handler, args, record) -> int:
    """Runs one command; every error it raises becomes one line and an exit code."""
    from emgrid.models.errors import DataError, EmgridError, FitError
    from emgrid.models.hints import spoken_as

    try:
        with spoken_as("toml"):  # hints in errors name the config's keys
            code = handler(args)
    except KeyboardInterrupt as e:  # outside a fit's iterations (run_fit handles its own)
        if args.debug:
            raise
        code = _signal_exit(e)
        if record is None or record.rank == 0:
            print("emgrid: interrupted", file=sys.stderr)
    except EmgridError as e:
        if args.debug:
            raise
        print(f"emgrid: error: {e}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except FitError as e:
        if args.debug:
            raise
        bad_rows = f"{DataError.__module__}.DataError: " in str(e)  # a worker refused its rows of a data file
        if not _under_mpiexec() or _rank() == 0:  # every rank raises the same FitError: one line
            print(f"emgrid: {'error' if bad_rows else 'fit failed'}: {e}", file=sys.stderr)
        elif record is not None:  # the parent prints it when rank 0 cannot (it is the rank that hangs)
            record.failed(str(e))
        code = EXIT_BAD_INPUT if bad_rows else EXIT_FAILED
    except BrokenPipeError:
        raise  # the reader of stdout went away: main() ends quietly
    except OSError as e:  # a file of the run that could not be read or written: one line
        if args.debug:
            raise
        where = f" {e.filename!r}" if e.filename else ""
        print(f"emgrid: error: cannot use{where}: {e.strerror or e}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    return code


if __name__ == "__main__":
    sys.exit(main())
