"""Writers of ``emgrid predict``'s output, one block of rows at a time (see ``cli.predict``)."""

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


def _columns(a: int, ll: np.ndarray, ans) -> dict[str, np.ndarray]:
    """The table columns of one block: one line per row the node's children read."""
    if ans is None:
        return {"row": np.arange(a, a + ll.size), "log_likelihood": ll}
    rows = np.arange(ll.size)
    for o in ans.offsets:
        rows = np.repeat(rows, np.diff(o))
    cols = {"row": rows + a}
    if ans.offsets:
        cols["position"] = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
    cols["log_likelihood"] = ll[rows]
    cols["label"] = _flat(ans.label)
    proba = _flat(ans.proba)
    cols.update({f"p{k}": proba[:, k] for k in range(proba.shape[1])})
    if ans.viterbi is not None:
        cols["viterbi"] = _flat(ans.viterbi)
    return cols


def write_csv(model, data, at, out: Path, *, rows_per_block=None) -> int:
    n = 0
    with open(out, "w") as f:
        for a, b, ll, ans in _answers(model, data, at, rows_per_block):
            cols = _columns(a, ll, ans)
            if a == 0:
                f.write(",".join(cols) + "\n")
            fmt = ["%.17g" if c.dtype.kind == "f" else "%d" for c in cols.values()]
            np.savetxt(f, np.column_stack([c.astype(np.float64) for c in cols.values()]), fmt=fmt, delimiter=",")
            n = b
    return n


def write_parquet(model, data, at, out: Path, *, rows_per_block=None) -> int:
    pa = require_pyarrow()
    import pyarrow.parquet as pq

    writer, n = None, 0
    try:
        for a, b, ll, ans in _answers(model, data, at, rows_per_block):
            table = pa.table(_columns(a, ll, ans))
            writer = writer or pq.ParquetWriter(str(out), table.schema)
            writer.write_table(table)
            n = b
    finally:
        if writer is not None:
            writer.close()
    return n


def write_npz(model, data, at, out: Path, *, rows_per_block=None) -> int:
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
            arrays["log_likelihood"][a:b] = ll
            if ans is not None:
                values = {"label": _flat(ans.label), "proba": _flat(ans.proba)}
                if ans.viterbi is not None:
                    values["viterbi"] = _flat(ans.viterbi)
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
        del arrays
    return n
