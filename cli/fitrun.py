"""One ``emgrid fit`` run, as named steps: resume, fit with a callback that checkpoints and
writes the model while the workers hold it, keep the last finished iteration after an
interrupt or a failure, write the report and say the summary.

The model is written shard by shard (``models.sharded``): every checkpoint from the grid's
shards inside the callback of its iteration, while the workers hold them, and ``model.json``
likewise inside the callback of the last iteration (or, resumed at ``max_iter`` already, from
the checkpoint's model). After an interrupt or a failure the checkpoint of the last finished
iteration is written when this process kept that model: a ``local`` fit's (its grid is this
process) or one of at most :data:`HOLD_BYTES` of parameters (gathered from the shards after
every iteration); for a larger model on other workers the last periodic checkpoint is what
remains.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

from .main import (EXIT_NOT_CONVERGED, EXIT_OK, Interrupted, _n_observations, _rank, _signal_exit,
                   _signals_ignored)
from .predict import fit_summary, skipped_note

#: how many of the rows ``drop_missing`` left out ``report.json`` lists (all are counted)
DROPPED_LISTED = 10_000

#: a model of at most this many bytes of parameters is gathered here after every iteration of
#: a fit on other processes, so that an interrupt or a failure keeps its last iteration
HOLD_BYTES = 64 * 2**20


def _hold_limit(plan, in_grid: bool) -> float:
    """The largest model (parameter bytes) this process keeps a copy of after every iteration:
    :data:`HOLD_BYTES`, and where this process is also the worker of cell (0, 0) (``in_grid``:
    MPI) and that worker's memory is known, a third of what its plan leaves free there (the
    copy, its pickle and the shard fetched in transit), so the copy never breaks the plan."""
    cell = plan.per_worker[0]
    if not in_grid or cell.memory_limit is None:
        return HOLD_BYTES
    return min(HOLD_BYTES, (cell.memory_limit - cell.memory_bytes) / 3)


def _param_bytes(model) -> int:
    return sum(a.nbytes for _, node in model.nodes() for a in node.params().values())


def write_model_file(out: Path, shards):
    """``out/model.json`` from ``shards`` (``executors.mstep.Shards``), one shard at a time:
    a root naming ``model.<tag>.shard-<s>.json`` beside it, or one plain spec for a model no
    node splits (``models.sharded``); every file recorded in the folder's manifest before it
    is written, and the earlier writes' recorded shard files removed after the root is in
    place (``cli.outdir``). Returns the ``Written`` record (its n_parameters)."""
    from .checkpoint import write_model_files
    from .outdir import remove_stale_shard_files, write_output

    written = write_model_files(shards, out, "model")
    write_output(out / "model.json", json.dumps(written.spec, indent=1))
    remove_stale_shard_files(out, "model", written.files)
    return written


class FitRun:
    """The steps of one fit of ``model`` to ``data`` on ``plan`` for the config ``cfg``.
    ``dropped``: the mask of the file's rows ``[data] drop_missing`` left out
    (``session.dropped_rows``; None: none), named in the summary and in ``report.json``."""

    def __init__(self, cfg, model, data, plan, *, quiet: bool, resume: bool, record=None, fingerprint=None,
                 executor_options=None, dropped=None):
        from .checkpoint import read_checkpoint
        from .progress import Progress

        self.cfg, self.model, self.data, self.plan = cfg, model, data, plan
        self.quiet, self.fingerprint, self.dropped = quiet, fingerprint, dropped
        self.executor_options = executor_options or {}
        self.out = cfg.resolve(cfg.fit.output)
        self.lead = _rank() == 0
        self.done, self.resumed_trace = 0, []  # iterations and trace of the checkpoint resumed from
        if resume:
            self.done, self.model, self.resumed_trace = read_checkpoint(self.out, fingerprint,
                                                                        max_iter=cfg.fit.max_iter)
        self.remaining = cfg.fit.max_iter - self.done
        self.progress = Progress(cfg.fit.max_iter, quiet=quiet or not self.lead)
        self.replans_said = 0  # the result's re-plans the progress told of
        # a local grid lives in this process, and a small model costs little to fetch each iteration
        self.hold = self.lead and (cfg.executor.kind == "local"
                                   or _param_bytes(self.model) <= _hold_limit(plan, cfg.executor.kind == "mpi"))
        self.held = None  # (iteration, the model after it as Shards) this process can still write
        self.trace = list(self.resumed_trace)
        self.saved = self.done  # the iteration of the checkpoint on disk
        self.written = None  # what writing model.json gave (its n_parameters for the summary)
        self.record = record if self.lead else None

    # ------------------------------------------------------------ the steps
    def run(self) -> int:
        from emgrid.models.errors import FitError

        from .report import plan_table

        if not self.quiet and self.lead:
            print(plan_table(self.plan))
            print()
        if self.record is not None:
            self.record.progress(self.done)
        t0 = time.perf_counter()
        try:
            result, fit_warnings = self.fit() if self.remaining > 0 else (None, [])
        except KeyboardInterrupt as e:
            return self.interrupted(e)
        except FitError as e:
            self.failed(e)
            raise
        self.progress.close()
        if not self.lead:
            return EXIT_OK
        for line in fit_warnings:
            print(f"emgrid: warning: {line}", file=sys.stderr)
        return self.finish(result, time.perf_counter() - t0)

    def fit(self):
        """The fit from where the run stands: its result, and its warnings but "not converged"."""
        from emgrid.executors import get as get_executor
        from emgrid.executors import optimize
        from emgrid.models.errors import ConvergenceWarning

        cfg, f = self.cfg, self.cfg.fit
        executor = get_executor(cfg.executor.kind, **cfg.executor.executor_options(), **self.executor_options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            result = optimize(self.data, self.model, plan=self.plan, executor=executor, max_iter=self.remaining,
                              tol=f.tol, callback=self.callback, n_init=f.n_init, seed=f.seed, init=f.init,
                              init_iter=f.init_iter, reg_covar=f.reg_covar, pseudo_count=f.pseudo_count,
                              previous_log_likelihood=self.resumed_trace[-1] if self.resumed_trace else None,
                              on_worker_loss=cfg.executor.on_worker_loss, max_replans=cfg.executor.max_replans,
                              grow_threshold=cfg.executor.grow_threshold, dtype=f.dtype)
        return result, [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)
                        and not str(w.message).startswith("not converged")]  # the summary's note says it

    def callback(self, iteration, loglik, so_far) -> None:
        """After each iteration: progress, the periodic checkpoint, the model after the last."""
        from emgrid.executors.mstep import Shards

        at = self.done + iteration
        for r in so_far.replans[self.replans_said if self.lead else len(so_far.replans):]:  # a line each; it goes on
            grids = f"{r['new_grid'][0]}x{r['new_grid'][1]} (was {r['old_grid'][0]}x{r['old_grid'][1]})"
            if r.get("kind") == "growth":
                self.progress.note(f"emgrid: grew: {r['reason']}; from iteration {self.done + r['iteration'] + 1} on "
                                   f"{grids}, {r['seconds_lost']:.2f} s to move")
            else:
                self.progress.note(f"emgrid: re-planned: {r['reason']}; iteration {self.done + r['iteration']} redone "
                                   f"on {grids}, {r['seconds_lost']:.2f} s lost")
        self.replans_said = len(so_far.replans)
        shards = so_far.shards  # the model after this iteration, on the grid (so_far.model may be None)
        if self.hold:  # with its iteration: a signal between the two lines below keeps them apart
            self.held = (at, Shards.held(shards.view, shards.gather()))
        self.trace.append(loglik)
        self.progress.update(at, loglik, so_far.timings[-1]["total"])
        if self.record is not None:
            self.record.progress(at)
        k = self.cfg.fit.checkpoint_every
        last = so_far.converged or iteration == self.remaining
        source = shards if self.held is None else self.held[1]  # held: fetched once already
        if k and self.lead and (at % k == 0 or last):
            self.save(at, source, self.trace)
        if last and self.lead:  # the workers hold the fitted model only while the fit runs
            self.write_model(source)
        if self.record is not None and self.record.stop_requested():
            raise Interrupted(self.record.stop_requested())  # the launcher was interrupted: stop here

    def save(self, iteration, shards, so_far) -> None:
        from emgrid.models.errors import FitError

        from .checkpoint import write_checkpoint
        from .outdir import OutputError

        try:
            write_checkpoint(self.out, iteration, shards, so_far, self.fingerprint)
        except OutputError as e:
            raise FitError(f"{e}; the fit stopped after iteration {iteration}") from None
        self.saved = iteration

    def write_model(self, shards) -> None:
        from emgrid.models.errors import FitError

        from .outdir import OutputError

        try:
            self.out.mkdir(parents=True, exist_ok=True)
            self.written = write_model_file(self.out, shards)
        except (OutputError, OSError) as e:
            raise FitError(f"the fit finished but its results cannot be written: {e}") from None

    def keep_last(self) -> None:
        """The checkpoint of the last finished iteration, when this process has its model."""
        from .checkpoint import write_checkpoint

        if self.held is None:
            return
        reached, held = self.held
        if reached > self.saved:
            write_checkpoint(self.out, reached, held, self.trace[:reached], self.fingerprint)
            self.saved = reached

    def interrupted(self, e: KeyboardInterrupt) -> int:
        """Ctrl-C (130) or SIGTERM (143): keep every finished iteration this process still
        has; a second signal while the checkpoint is written does not cut it short."""
        from .outdir import OutputError

        code = _signal_exit(e)
        with _signals_ignored():
            self.progress.close()
            if not self.lead:
                return code
            try:
                self.keep_last()
            except OutputError as err:
                print(f"emgrid: interrupted; {err}", file=sys.stderr)
                return code
            reached = self.done + len(self.trace) - len(self.resumed_trace)
            if self.saved > 0:
                print(f"emgrid: interrupted: the checkpoint of iteration {self.saved} is in {self.out}; "
                      "continue with --resume", file=sys.stderr)
            elif reached > 0:
                print(f"emgrid: interrupted after iteration {reached}; no checkpoint was written ([fit] "
                      "checkpoint_every keeps one); nothing to resume", file=sys.stderr)
            else:
                print("emgrid: interrupted before the first iteration finished; nothing to resume", file=sys.stderr)
        return code

    def failed(self, e) -> None:
        """A worker died or the statistics went non-finite: keep the model after the last
        M-step that completed when this process has it, so --resume continues from it, and
        say where in the error."""
        from .outdir import OutputError

        self.progress.close()
        if self.lead:
            try:
                self.keep_last()
            except OutputError:
                pass
        if self.lead and self.saved > 0:
            e.args = (f"{e}; the checkpoint of iteration {self.saved} is in {self.out}: continue with --resume",)

    def finish(self, result, wall_s: float) -> int:
        """``report.json`` (and the model, when no iteration ran here), then the summary."""
        import numpy as np

        from emgrid.executors.mstep import Shards
        from emgrid.models import ShardView
        from emgrid.models.errors import FitError

        from .checkpoint import write_checkpoint
        from .outdir import OutputError, write_output

        out, plan, model = self.out, self.plan, self.model
        full_trace = list(self.resumed_trace) + (list(result.log_likelihood) if result is not None else [])
        converged = bool(result.converged) if result is not None else False
        report = {
            "plan": json.loads(plan.to_json()),
            "log_likelihood": full_trace,
            "iterations": len(full_trace),
            "converged": converged,
            "timings": result.timings if result is not None else [],
            "bytes_moved": result.bytes_moved if result is not None else [],
            "wall_s": wall_s,
        }
        dropped = self.dropped
        if dropped is not None:
            rows = [int(r) for r in np.flatnonzero(dropped)]
            report["dropped_rows"] = {"count": len(rows), "of": int(dropped.size), "rows": rows[:DROPPED_LISTED]}
        if result is not None and result.init_log_likelihoods:
            report["init"] = {"log_likelihoods": result.init_log_likelihoods, "best": result.init_best,
                              "seconds": result.init_s, "seeding_seconds": result.init_seeding_s}
        try:
            out.mkdir(parents=True, exist_ok=True)
            if self.written is None:  # no iteration ran here: the resumed checkpoint's model, whole
                held = Shards.held(ShardView.of(model, plan.shard_of_leaf(), len(plan.model_cuts)), model)
                self.written = write_model_file(out, held)
                if self.cfg.fit.checkpoint_every:
                    write_checkpoint(out, len(full_trace), held, full_trace, self.fingerprint)
            write_output(out / "report.json", json.dumps(report, indent=1, default=float))
        except (OutputError, OSError) as e:
            raise FitError(f"the fit finished but its results cannot be written: {e}") from None
        if not self.quiet:
            print(f"wrote {out / 'model.json'} and {out / 'report.json'}")
        print(fit_summary(self.written.n_parameters, _n_observations(model, self.data), len(full_trace), converged,
                          full_trace[-1] if full_trace else None))
        if dropped is not None:
            print(f"note: [data] drop_missing dropped {skipped_note(dropped, dropped.size)} with a missing value; "
                  f"the fit's rows are the others, in order (report.json lists them)", file=sys.stderr)
        if not converged:
            print(f"note: not converged within max_iter={self.cfg.fit.max_iter} (tol={self.cfg.fit.tol}); "
                  f"raise [fit] max_iter or continue with --resume", file=sys.stderr)
            return EXIT_NOT_CONVERGED
        return EXIT_OK
