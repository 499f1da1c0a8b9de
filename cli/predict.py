"""``emgrid predict CONFIG --model out/model.json [--data FILE] [--at PATH] --output FILE
[--on-bad-row error|skip]``, and the one summary line ``emgrid fit`` ends with.

The command reads the config's data (files, or the synthetic rows ``emgrid fit`` drew), or
``--data FILE`` read as the config's ``[data]`` reads its files (its ``sequence_id``), scores
it with a fitted model and writes, block by block (``engine.block_rows`` rows at a time, so
memory stays bounded by a block plus the file's buffers), per data row its log-likelihood
and, for the Mixture or HMM at ``--at`` (default: the root when it is one), per row that
node's children read: the most probable child, the posterior weights of every child, and
for an HMM the Viterbi state (see ``models.inference`` for what the rows are).

Rows are never renumbered: output row ``i`` is input row ``i``. In a ``.csv`` or
``.parquet`` input every row that cannot be scored (a missing value, a value a Categorical
did not see, a number outside its leaf's support) is found at once (``cli.badrows``);
``--on-bad-row error`` (the default) refuses the file in one line naming each column, each
kind of problem, its count and first rows, ``skip`` writes those rows with an empty label
and NaN probabilities and says how many and which. ``[data] drop_missing`` applies to fits
only. Paths given on the command line are relative to the current folder; the config's own
paths to the config's folder.

The output is written to a temporary file beside it and renamed over it when complete
(``cli.outdir.atomic_file``): Ctrl-C or SIGTERM leave the previous output whole and no
temporary file. An output that is one of the inputs (the config, the model and its shard
files, the data; compared by inode) is refused, and so is one in a folder an ``emgrid fit``
holds locked (exit 2, as a second fit into it is).

Formats, by the output's extension:

- ``.npz``: ``log_likelihood`` ``(n,)``; ``label``, ``proba`` ``(m, K)`` and for an HMM
  ``viterbi``, with their sequences' offsets in ``models.data.flatten``'s layout
  (``label.offsets``, ``label.values``), so ``unflatten(z, "label")`` gives the ``Ragged``;
  rows not scored: ``bad_rows``, their label and Viterbi state -1;
- ``.csv`` and ``.parquet`` (needs pyarrow): one line per row the node's children read:
  ``row``, ``position`` (under a sequence), ``log_likelihood`` (of the data row), ``label``,
  ``p0 .. p{K-1}``, ``viterbi`` (an HMM).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

FORMATS = (".npz", ".csv", ".parquet")
#: how many row numbers the note of skipped rows shows
SHOWN_SKIPPED = 10


def add_parser(sub) -> None:
    """Registers ``emgrid predict`` on the command's subparsers."""
    sp = sub.add_parser("predict", help="write per-row answers of a fitted model (labels, probabilities, Viterbi)")
    sp.add_argument("config", help="the TOML run configuration whose [data] to score")
    sp.add_argument("--model", required=True, help="a fitted model spec, e.g. out/model.json (a sharded one reads its shard files beside it)")
    sp.add_argument("--data", default=None, help="a data file to score instead of the config's [data] (read as [data] reads its files)")
    sp.add_argument("--at", default=None, help="path of the Mixture or HMM to answer for (default: the root)")
    sp.add_argument("--output", required=True, help="a .npz, .csv or .parquet file to write")
    sp.add_argument("--on-bad-row", choices=["error", "skip"], default="error",
                    help="a row that cannot be scored: refuse the file listing every problem (error), or write the "
                         "row with an empty label and NaN probabilities (skip)")
    sp.add_argument("--rows-per-block", type=int, default=None, help=argparse.SUPPRESS)


def _with_data(cfg, data: str):
    """``cfg`` reading ``data`` (relative to the current folder) instead of its ``[data]`` files."""
    from emgrid.models.errors import ConfigError

    path = Path(data).resolve()
    if not path.exists():
        raise ConfigError(f"--data {data!r} does not exist")
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": str(path), "paths": None,
                                                                        "synthetic": None, "truth": None})})


def _inputs(cfg, args) -> list[tuple[str, Path]]:
    from .session import spec_files

    d = cfg.data
    out = [("the config", Path(args.config))] + [("the --model", p) for p in spec_files(Path(args.model))]
    out += [("the data file", cfg.resolve(p)) for p in ([d.path] if d.path is not None else list(d.paths or []))]
    return out


def _refuse_output(out: Path, inputs) -> None:
    from .outdir import OutputError, lock_holder, refuse_inputs

    refuse_inputs(out.parent, [out.name], inputs, "--output: folder")
    holder = lock_holder(out.parent)
    if holder is not None:
        raise OutputError(f"--output {str(out)!r}: its folder is in use by an emgrid fit ({holder}); wait for it "
                          "to end or write elsewhere")


def _read(cfg, model, on_bad_row: str):
    """The data to score and the mask of rows not scored (None: all scored)."""
    from emgrid.models.errors import DataError
    from emgrid.models.tables import FILE_SUFFIXES

    from .badrows import read_scorable
    from .session import build_data, build_model

    d = cfg.data
    paths = [d.path] if d.path is not None else list(d.paths or [])
    if d.synthetic is not None:
        return model.prepare(build_data(cfg, build_model(cfg))), None
    if len(paths) == 1 and Path(paths[0]).suffix.lower() in FILE_SUFFIXES:
        where = f"data file {str(cfg.resolve(paths[0]))!r}"
        try:
            got = read_scorable(model, str(cfg.resolve(paths[0])), where, sequence_id=d.sequence_id,
                                on_bad_row=on_bad_row)
            return model.prepare(got.data), got.bad
        except DataError as e:
            raise DataError(f"[data] {e}" if not str(e).startswith("data file") else str(e)) from None
    if on_bad_row == "skip":
        from emgrid.models.errors import ConfigError

        raise ConfigError("--on-bad-row skip reads one .csv or .parquet file; this [data] is "
                          f"{', '.join(paths)} (an .npy/.npz row that cannot be scored is refused)")
    return model.prepare(build_data(cfg, model)), None


def skipped_note(bad, n: int) -> str:
    """``k of n rows not scored (rows 3, 8, ...)``: the rows a run left out, by number."""
    import numpy as np

    rows = np.flatnonzero(bad)
    shown = ", ".join(str(int(r)) for r in rows[:SHOWN_SKIPPED]) + (", ..." if rows.size > SHOWN_SKIPPED else "")
    return f"{rows.size} of {n} rows (row{'s' if rows.size > 1 else ''} {shown}, counted from 0)"


def cmd_predict(args) -> int:
    """Runs the command (the modules it needs load here, so other commands start fast)."""
    from emgrid.models import load_model, n_rows
    from emgrid.models.errors import ConfigError
    from emgrid.models.inference import choice_paths

    from .answers import require_pyarrow, write_csv, write_npz, write_parquet
    from .config import load_config
    from .outdir import atomic_file

    out = Path(args.output)
    if out.suffix not in FORMATS:
        raise ConfigError(f"--output {str(out)!r}: the extension must be one of {', '.join(FORMATS)}")
    if out.suffix == ".parquet":
        require_pyarrow()
    if not Path(args.model).exists():
        raise ConfigError(f"--model {args.model!r} does not exist (emgrid fit writes <[fit] output>/model.json, "
                          "the output relative to the config's folder)")
    cfg = load_config(args.config)
    if args.data is not None:
        cfg = _with_data(cfg, args.data)
    out.parent.mkdir(parents=True, exist_ok=True)
    _refuse_output(out, _inputs(cfg, args))
    model = load_model(args.model)
    data, bad = _read(cfg, model, args.on_bad_row)
    at = args.at
    if at is None:
        paths = choice_paths(model)
        at = "" if "" in paths else None
        if at is None:
            where = ", ".join(repr(p) for p in paths) or "none in this model"
            print(f"note: the root is a {model.describe()}; writing log-likelihoods only (--at PATH names a "
                  f"Mixture or HMM: {where})", file=sys.stderr)
    writer = {".npz": write_npz, ".csv": write_csv, ".parquet": write_parquet}[out.suffix]
    with atomic_file(out) as tmp:
        n = writer(model, data, at, tmp, rows_per_block=args.rows_per_block, bad=bad)
    print(f"wrote {out}: {n} rows" + ("" if at is None else f", answers for {model.node_at(at).describe()} at "
                                                          f"{at or '<root>'!r}"))
    if bad is not None:
        print(f"note: {skipped_note(bad, n_rows(data))} could not be scored (--on-bad-row skip): their label is "
              "empty and their probabilities NaN", file=sys.stderr)
    return 0


def fit_summary(model, n_rows: int, iterations: int, converged: bool, log_likelihood: float | None) -> str:
    """The line ``emgrid fit`` ends with: iterations, convergence, the final log-likelihood
    (the trace's last entry) and the BIC at it, ``-2 log L + n_parameters log n``, ``n_rows``
    being the observations (``models.inference.n_observations``: positions of sequences). ``model``
    is the fitted model, or its count of free parameters (a model written shard by shard
    counts them on the way, ``models.sharded.Written``)."""
    if log_likelihood is None:
        return f"fit: {iterations} iterations, converged={converged}"
    k = int(model) if isinstance(model, int) else model.n_parameters()
    bic = -2.0 * log_likelihood + k * math.log(max(n_rows, 1))
    return (f"fit: {iterations} iterations, converged={converged}, final log-likelihood {log_likelihood:.10g}, "
            f"BIC {bic:.10g} ({k} free parameters, {n_rows} observations)")
