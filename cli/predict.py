"""``emgrid predict CONFIG --model out/model.json [--at PATH] --output FILE``, and the one
summary line ``emgrid fit`` ends with.

The command reads the config's data (files, or the synthetic rows ``emgrid fit`` drew),
scores it with a fitted model and writes, block by block (``engine.block_rows`` rows at a
time, so memory stays bounded by a block plus the file's buffers), per data row its
log-likelihood and, for the Mixture or HMM at ``--at`` (default: the root when it is one),
per row that node's children read: the most probable child, the posterior weights of every
child, and for an HMM the Viterbi state (see ``models.inference`` for what the rows are).

Formats, by the output's extension:

- ``.npz``: ``log_likelihood`` ``(n,)``; ``label``, ``proba`` ``(m, K)`` and for an HMM
  ``viterbi``, with their sequences' offsets in ``models.data.flatten``'s layout
  (``label.offsets``, ``label.values``), so ``unflatten(z, "label")`` gives the ``Ragged``;
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


def add_parser(sub) -> None:
    """Registers ``emgrid predict`` on the command's subparsers."""
    sp = sub.add_parser("predict", help="write per-row answers of a fitted model (labels, probabilities, Viterbi)")
    sp.add_argument("config", help="the TOML run configuration whose [data] to score")
    sp.add_argument("--model", required=True, help="a fitted model spec, e.g. out/model.json (a sharded one reads its shard files beside it)")
    sp.add_argument("--at", default=None, help="path of the Mixture or HMM to answer for (default: the root)")
    sp.add_argument("--output", required=True, help="a .npz, .csv or .parquet file to write")
    sp.add_argument("--rows-per-block", type=int, default=None, help=argparse.SUPPRESS)


def cmd_predict(args) -> int:
    """Runs the command (the modules it needs load here, so other commands start fast)."""
    from emgrid.models import load_model
    from emgrid.models.errors import ConfigError
    from emgrid.models.inference import choice_paths

    from .answers import require_pyarrow, write_csv, write_npz, write_parquet
    from .config import load_config
    from .session import build_data, build_model

    out = Path(args.output)
    if out.suffix not in FORMATS:
        raise ConfigError(f"--output {str(out)!r}: the extension must be one of {', '.join(FORMATS)}")
    if out.suffix == ".parquet":
        require_pyarrow()
    if not Path(args.model).exists():
        raise ConfigError(f"--model {args.model!r} does not exist (emgrid fit writes <[fit] output>/model.json)")
    cfg = load_config(args.config)
    model = load_model(args.model)
    data = model.prepare(build_data(cfg, build_model(cfg)) if cfg.data.synthetic is not None else build_data(cfg, model))
    at = args.at
    if at is None:
        paths = choice_paths(model)
        at = "" if "" in paths else None
        if at is None:
            where = ", ".join(repr(p) for p in paths) or "none in this model"
            print(f"note: the root is a {model.describe()}; writing log-likelihoods only (--at PATH names a "
                  f"Mixture or HMM: {where})", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = {".npz": write_npz, ".csv": write_csv, ".parquet": write_parquet}[out.suffix]
    n = writer(model, data, at, out, rows_per_block=args.rows_per_block)
    print(f"wrote {out}: {n} rows" + ("" if at is None else f", answers for {model.node_at(at).describe()} at "
                                                          f"{at or '<root>'!r}"))
    return 0


def fit_summary(model, n_rows: int, iterations: int, converged: bool, log_likelihood: float | None) -> str:
    """The line ``emgrid fit`` ends with: iterations, convergence, the final log-likelihood
    (the trace's last entry) and the BIC at it, ``-2 log L + n_parameters log n``. ``model``
    is the fitted model, or its count of free parameters (a model written shard by shard
    counts them on the way, ``models.sharded.Written``)."""
    if log_likelihood is None:
        return f"fit: {iterations} iterations, converged={converged}"
    k = int(model) if isinstance(model, int) else model.n_parameters()
    bic = -2.0 * log_likelihood + k * math.log(max(n_rows, 1))
    return (f"fit: {iterations} iterations, converged={converged}, final log-likelihood {log_likelihood:.10g}, "
            f"BIC {bic:.10g} ({k} free parameters, {n_rows} rows)")
