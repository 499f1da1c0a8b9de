"""``emgrid``: plan and fit nested models by EM on a D x M worker grid.

Exit codes: 0 done; 1 the fit did not converge within ``max_iter``; 2 bad input
(config, model, data, resources); 3 the fit failed while running (a worker died, the
statistics became non-finite); 130 interrupted; 141 the reader of the output went away
(``emgrid plan ... | head``: silent, as a command killed by SIGPIPE).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

from .predict import add_parser as add_predict_parser
from .predict import cmd_predict, fit_summary

EXIT_OK, EXIT_NOT_CONVERGED, EXIT_BAD_INPUT, EXIT_FAILED = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emgrid", description=__doc__.split("\n")[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def overrides(sp):
        sp.add_argument("config", help="a TOML run configuration")
        sp.add_argument("--workers", type=int, help="plan for this many workers")
        sp.add_argument("--memory", help="memory per worker, e.g. 4GiB")
        sp.add_argument("--flops", type=float, help="FLOP/s per worker")
        sp.add_argument("--executor", choices=["local", "multiprocessing", "mpi"], help="override [executor] kind")

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

    sp = sub.add_parser("demo", help="run a built-in heterogeneous example end to end")
    sp.add_argument("--rows", type=int, default=20000)
    sp.add_argument("--executor", choices=["local", "multiprocessing", "mpi"], default="local")
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
        raise ConfigError(f"{flag} {err.get('input')!r}: {err['msg']}") from None


def _plan(cfg, model, n):
    from emgrid.planner import balance_plan

    from .session import build_resources, build_solver

    return balance_plan(model, build_resources(cfg), n_data=n, solver=build_solver(cfg))


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


def _under_mpiexec() -> bool:
    from .launch import under_mpiexec

    return under_mpiexec()


def cmd_fit(args) -> int:
    from emgrid.models import complete_shapes

    from .launch import RankRecord
    from .session import build_data, build_model, table_dataset

    cfg = _config(args)
    if cfg.executor.kind == "mpi" and not _under_mpiexec():
        return _launch_mpi(args, cfg)
    record = RankRecord.here()  # a rank of a job _launch_mpi started: tell the parent how it went
    if record is not None:
        record.started()
    model = build_model(cfg)
    # a .parquet / .csv file: every worker reads only its rows of it (the dataset's folder
    # holds the row offsets and lives as long as the fit)
    with tempfile.TemporaryDirectory(prefix="emgrid-table-") as scratch:
        table = table_dataset(cfg, model, scratch)
        data = table if table is not None else build_data(cfg, model)
        # a template's sizes from the data, before planning
        model = complete_shapes(model, table.open(lazy=True) if table is not None else data)
        n = table.n_rows if table is not None else _n_rows(data)
        plan = _plan(cfg, model, n)
        return run_fit(cfg, model, data, plan, quiet=args.quiet, resume=args.resume, record=record)


def _launch_mpi(args, cfg) -> int:
    """Re-runs this command under ``mpiexec`` with one rank per worker of the plan.

    Exits with the command's own code as rank 0 reports it; a job that ends without rank 0's
    report (a rank died and ``mpiexec`` killed the others) is a failed fit: 3, and one line
    naming the rank, the iteration and the checkpoint (see ``emgrid.cli.launch``).
    """
    from .launch import launch, mpi_command
    from .session import build_model, shaped_model

    model, n = shaped_model(cfg, build_model(cfg))
    plan = _plan(cfg, model, n)
    cmd = mpi_command(plan.workers_used, ["fit"] + sys.argv[sys.argv.index("fit") + 1:], debug=args.debug)
    return launch(cmd, plan, cfg.resolve(cfg.fit.output), cfg.fit.max_iter)


def _rank() -> int:
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_rank()
    except Exception:  # noqa: BLE001 - no MPI runtime means a single process
        return 0


def run_fit(cfg, model, data, plan, *, quiet: bool, resume: bool, record=None) -> int:
    from emgrid.executors import get as get_executor
    from emgrid.executors import optimize
    from emgrid.models.errors import ConvergenceWarning, FitError

    from .checkpoint import read_checkpoint, write_checkpoint
    from .progress import Progress
    from .report import plan_table

    out = cfg.resolve(cfg.fit.output)
    lead = _rank() == 0
    done, trace = 0, []
    if resume:
        done, model, trace = read_checkpoint(out)
    if not quiet and lead:
        print(plan_table(plan))
        print()
    remaining = cfg.fit.max_iter - done
    progress = Progress(cfg.fit.max_iter, quiet=quiet or not lead)
    state = {"model": model, "trace": list(trace), "saved": done}  # saved: iteration of the checkpoint on disk
    record = record if lead else None
    if record is not None:
        record.progress(done)

    def callback(iteration, loglik, so_far):
        current_model = so_far.model
        state["trace"].append(loglik)
        state["model"] = current_model
        progress.update(done + iteration, loglik, so_far.timings[-1]["total"])
        if record is not None:
            record.progress(done + iteration)
        k = cfg.fit.checkpoint_every
        if k and lead and (done + iteration) % k == 0:
            write_checkpoint(out, done + iteration, current_model, state["trace"])
            state["saved"] = done + iteration

    t0 = time.perf_counter()
    try:
        if remaining > 0:
            f = cfg.fit
            executor = get_executor(cfg.executor.kind, **cfg.executor.executor_options())
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConvergenceWarning)
                result = optimize(data, model, plan=plan, executor=executor,
                                  max_iter=remaining, tol=f.tol, callback=callback, n_init=f.n_init, seed=f.seed,
                                  init=f.init, init_iter=f.init_iter, reg_covar=f.reg_covar,
                                  pseudo_count=f.pseudo_count)
            fit_warnings = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)
                            and not str(w.message).startswith("not converged")]  # the note below says it
        else:
            result, fit_warnings = None, []
    except KeyboardInterrupt:
        progress.close()
        if lead and state["trace"]:
            write_checkpoint(out, done + len(state["trace"]) - len(trace), state["model"], state["trace"])
            print(f"interrupted: checkpoint written to {out}; continue with --resume", file=sys.stderr)
        return 130
    except FitError as e:
        # A worker died or the statistics went non-finite: keep every finished iteration
        # (the model after the last M-step that completed) so --resume continues from it.
        progress.close()
        reached = done + len(state["trace"]) - len(trace)
        if lead and reached > state["saved"]:
            write_checkpoint(out, reached, state["model"], state["trace"])
            state["saved"] = reached
        if lead and state["saved"] > 0:
            e.args = (f"{e}; the checkpoint of iteration {state['saved']} is in {out}: continue with --resume",)
        raise
    progress.close()
    if not lead:
        return EXIT_OK
    for line in fit_warnings:
        print(f"emgrid: warning: {line}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    fitted = result.model if result is not None else model
    full_trace = list(trace) + (list(result.log_likelihood) if result is not None else [])
    converged = bool(result.converged) if result is not None else False
    (out / "model.json").write_text(json.dumps(fitted.to_spec(), indent=1))
    report = {
        "plan": json.loads(plan.to_json()),
        "log_likelihood": full_trace,
        "iterations": len(full_trace),
        "converged": converged,
        "timings": result.timings if result is not None else [],
        "bytes_moved": result.bytes_moved if result is not None else [],
        "wall_s": time.perf_counter() - t0,
    }
    if result is not None and result.init_log_likelihoods:
        report["init"] = {"log_likelihoods": result.init_log_likelihoods, "best": result.init_best,
                          "seconds": result.init_s, "seeding_seconds": result.init_seeding_s}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
    if cfg.fit.checkpoint_every:
        write_checkpoint(out, len(full_trace), fitted, full_trace)
    if not quiet:
        print(f"wrote {out / 'model.json'} and {out / 'report.json'}")
    print(fit_summary(fitted, _n_rows(data), len(full_trace), converged, full_trace[-1] if full_trace else None))
    if not converged:
        print(f"note: not converged within max_iter={cfg.fit.max_iter} (tol={cfg.fit.tol}); "
              f"raise [fit] max_iter or continue with --resume", file=sys.stderr)
        return EXIT_NOT_CONVERGED
    return EXIT_OK


def cmd_demo(args) -> int:
    from .demo import cmd_demo as demo

    return demo(args)


def cmd_advise(args) -> int:
    from .advise import advise

    cfg = _config(args)
    print(advise(cfg))
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
    from emgrid.models.errors import EmgridError, FitError

    handlers = {"plan": cmd_plan, "fit": cmd_fit, "demo": cmd_demo, "advise": cmd_advise, "predict": cmd_predict}
    record = None
    if args.command in ("fit", "demo") and _under_mpiexec():
        from .launch import RankRecord

        record = RankRecord.here()  # this is a rank of a job `emgrid fit` started: report to it
    try:
        code = handlers[args.command](args)
    except EmgridError as e:
        if args.debug:
            raise
        print(f"emgrid: error: {e}", file=sys.stderr)
        code = EXIT_BAD_INPUT
    except FitError as e:
        if args.debug:
            raise
        if not _under_mpiexec() or _rank() == 0:  # every rank raises the same FitError: one line
            print(f"emgrid: fit failed: {e}", file=sys.stderr)
        elif record is not None:  # the parent prints it when rank 0 cannot (it is the rank that hangs)
            record.failed(str(e))
        code = EXIT_FAILED
    if record is not None and record.rank == 0:
        record.finished(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
