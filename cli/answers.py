"""Writers of ``emgrid predict``'s output, one block of rows at a time (see ``cli.predict``).

Each writer takes ``bad``, the mask of data rows that could not be scored (``cli.badrows``,
``--on-bad-row skip``; None: every row scored): such a row keeps its line(s), with a NaN
log-likelihood and probabilities and an empty label and Viterbi state (in ``.npz``, -1,
and the array ``bad_rows`` lists those rows)."""

from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

import numpy as np
from numpy.lib.format import open_memmap, write_array

from emgrid.models import Ragged, engine, n_rows
from emgrid.models.errors import ConfigError
from emgrid.models.inference import answer_blocks, blocks, choice_node, hmm_paths, sequence_offsets


def require_pyarrow():
    """The pyarrow module, or a ConfigError naming what to install."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError("writing .parquet needs pyarrow, which is not installed (pip install pyarrow); "
                          "or write .npz or .csv") from None
    return pyarrow


def _answers(model, data, at, rows_per_block):
    """``(start, stop, log-likelihood, answers or None)`` per block."""
    if at is None:
        for a, b, d in blocks(model, data, rows_per_block):
            yield a, b, engine.log_density(model, d), None
        return
    for ans in answer_blocks(model, data, at, rows_per_block=rows_per_block):
        yield ans.start, ans.stop, ans.log_likelihood, ans


def _flat(x):
    while isinstance(x, Ragged):
        x = x.values
    return np.asarray(x)


#: the integer columns a row that could not be scored leaves empty
EMPTY_WHEN_BAD = ("label", "viterbi")


def _columns(a: int, ll: np.ndarray, ans, bad=None) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The table columns of one block (one line per row the node's children read) and the
    mask of its lines whose data row could not be scored (None: none), whose floats are NaN."""
    rows = np.arange(ll.size)
    if ans is not None:
        for o in ans.offsets:
            rows = np.repeat(rows, np.diff(o))
    empty = None
    if bad is not None and bad[a:a + ll.size].any():
        empty = bad[a:a + ll.size][rows]
    if ans is None:
        cols = {"row": rows + a, "log_likelihood": ll}
    else:
        cols = {"row": rows + a}
        if ans.offsets:
            cols["position"] = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
        cols["log_likelihood"] = ll[rows]
        cols["label"] = _flat(ans.label)
        proba = _flat(ans.proba)
        cols.update({f"p{k}": proba[:, k] for k in range(proba.shape[1])})
        if ans.viterbi is not None:
            cols["viterbi"] = _flat(ans.viterbi)
    if empty is not None:
        for k, c in cols.items():
            if c.dtype.kind == "f":
                c = c.copy()
                c[empty] = np.nan
                cols[k] = c
    return cols, empty


def _csv_lines(cols: dict[str, np.ndarray], empty: np.ndarray) -> str:
    """A block's lines with the integer answers of its ``empty`` lines left empty."""
    text = []
    for k, c in cols.items():
        s = np.char.mod("%.17g" if c.dtype.kind == "f" else "%d", c).astype(object)
        if k in EMPTY_WHEN_BAD:
            s[empty] = ""
        text.append(s)
    return "".join(",".join(line) + "\n" for line in zip(*text))


def write_csv(model, data, at, out: Path, *, rows_per_block=None, bad=None) -> int:
    n = 0
    with open(out, "w") as f:
        for a, b, ll, ans in _answers(model, data, at, rows_per_block):
            cols, empty = _columns(a, ll, ans, bad)
            if a == 0:
                f.write(",".join(cols) + "\n")
            if empty is not None:
                f.write(_csv_lines(cols, empty))
            else:
                fmt = ["%.17g" if c.dtype.kind == "f" else "%d" for c in cols.values()]
                np.savetxt(f, np.column_stack([c.astype(np.float64) for c in cols.values()]), fmt=fmt, delimiter=",")
            n = b
    return n


def write_parquet(model, data, at, out: Path, *, rows_per_block=None, bad=None) -> int:
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    writer, n = None, 0
    try:
        for a, b, ll, ans in _answers(model, data, at, rows_per_block):
            cols, empty = _columns(a, ll, ans, bad)
            table = pa.table({k: pa.array(c, mask=empty if (empty is not None and k in EMPTY_WHEN_BAD) else None,
                                          type=pa.int64() if c.dtype.kind in "iu" else None)
                              for k, c in cols.items()})
            writer = writer or pq.ParquetWriter(str(out), table.schema)
            writer.write_table(table)
            n = b
    finally:
        if writer is not None:
            writer.close()
    return n


def write_npz(model, data, at, out: Path, *, rows_per_block=None, bad=None) -> int:
    """Each array is filled block by block in a memory-mapped ``.npy`` beside the output,
    then stored in the ``.npz`` archive (what ``np.load`` reads)."""
    n = n_rows(data)
    shapes: dict[str, tuple] = {"log_likelihood": (n,)}
    levels: tuple = ()
    deep = ""
    if at is not None:
        node = choice_node(model, at)
        levels = sequence_offsets(model, data, at)
        m = int(levels[-1][-1]) if levels else n
        deep = ".values" * len(levels)
        shapes.update({f"label{deep}": (m,), f"proba{deep}": (m, len(node.children))})
        if at in hmm_paths(model):
            shapes[f"viterbi{deep}"] = (m,)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".emgrid-predict-") as tmp:
        arrays = {k: open_memmap(Path(tmp, k + ".npy"), mode="w+", dtype=np.int64 if k.startswith(("label", "viterbi"))
                                 else np.float64, shape=s) for k, s in shapes.items()}
        done = 0
        for a, b, ll, ans in _answers(model, data, at, rows_per_block):
            empty = None if bad is None or not bad[a:b].any() else bad[a:b]
            arrays["log_likelihood"][a:b] = ll if empty is None else np.where(empty, np.nan, ll)
            if ans is not None:
                values = {"label": _flat(ans.label), "proba": _flat(ans.proba)}
                if ans.viterbi is not None:
                    values["viterbi"] = _flat(ans.viterbi)
                if empty is not None:
                    lines = np.arange(b - a)
                    for o in ans.offsets:
                        lines = np.repeat(lines, np.diff(o))
                    lines = empty[lines]
                    values = {k: np.where(lines if v.ndim == 1 else lines[:, None], -1 if k != "proba" else np.nan, v)
                              for k, v in values.items()}
                for key, v in values.items():
                    arrays[key + deep][done:done + v.shape[0]] = v
                done += values["label"].shape[0]
        for v in arrays.values():
            v.flush()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for k in arrays:
                z.write(Path(tmp, k + ".npy"), arcname=k + ".npy")
            for key in {k.split(".")[0] for k in arrays if k != "log_likelihood"}:
                for j, o in enumerate(levels):
                    with z.open(f"{key}{'.values' * j}.offsets.npy", "w", force_zip64=True) as f:
                        write_array(f, np.asarray(o, dtype=np.int64))
            if bad is not None:
                with z.open("bad_rows.npy", "w", force_zip64=True) as f:
                    write_array(f, np.flatnonzero(bad).astype(np.int64))
        del arrays
    return n
