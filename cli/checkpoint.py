"""Checkpoints: the model and the trace so far, what run they belong to, written atomically.

A checkpoint (``checkpoint.json``, a :class:`Checkpoint`) holds the iteration reached, the
model after it (whole, or for a model the plan splits over shards the root of
``models.sharded`` naming one file per shard beside it, written shard by shard), the log-likelihood of every iteration so far and a :class:`Fingerprint` of
the run: the model's structure (every node's family, sizes and data type, in pre-order), the
data (rows, and per file its size and a BLAKE2b digest of its bytes: streamed whole up to
:data:`FULL_HASH_BYTES`, beyond that the first, last and :data:`SAMPLED_BLOCKS` evenly spaced
blocks of :data:`BLOCK_BYTES`; synthetic data: its row count, seed and truth), what a row of
a table is (``[data] sequence_id``, ``drop_missing`` and the columns every leaf reads: the
same file read another way gives other rows, or the same rows grouped otherwise) and the fit
settings that change the trace (``reg_covar``, ``pseudo_count``, a template's ``n_init``,
``seed``, ``init``, ``init_iter``). The plan (grid, executor) is recorded, not compared: every
executor and grid give the same trace, so a fit may resume on other workers.

``--resume`` reads it back with :func:`read_checkpoint`: every field is validated (a damaged
file is one ConfigError naming the file and the field), and a fingerprint that differs from
the run's is one ConfigError naming what changed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from emgrid.models import Node, from_spec
from emgrid.models.errors import ConfigError, EmgridError
from emgrid.models.sharded import Written, is_sharded, model_from_root, shard_file_names, write_shards

from .outdir import describe_os_error

CHECKPOINT = "checkpoint.json"
#: the shard files of a sharded checkpoint: ``checkpoint.<tag>.shard-<s>.json``
SHARD_STEM = "checkpoint"
FORMAT = 2
FULL_HASH_BYTES = 256 * 2**20
BLOCK_BYTES = 2**20
SAMPLED_BLOCKS = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataFile(_Strict):
    path: str
    bytes: int = Field(ge=0)
    digest: str
    #: "full": every byte hashed; "sampled": the blocks named in the module's docstring
    hashed: Literal["full", "sampled"]


class Fingerprint(_Strict):
    """What a checkpoint belongs to (see the module)."""

    model: list[str]
    n_rows: int = Field(ge=1)
    data: list[DataFile] = []
    synthetic: str | None = None  # "N rows, seed S, truth <digest>"
    #: what a row is: ``[data] sequence_id``, ``drop_missing`` and ``columns`` (every leaf's
    #: columns of a table), as text; None in a checkpoint written before emgrid recorded them
    rows: dict[str, str] | None = None
    fit: dict[str, str | float | int]
    plan: str = ""  # recorded, not compared

    def difference(self, other: "Fingerprint") -> str | None:
        """What changed from ``self`` (the checkpoint's) to ``other`` (this run's), or None."""
        if self.model != other.model:
            a, b = self.model, other.model
            for x, y in zip(a, b):
                if x != y:
                    return f"the model changed: {x} -> {y}"
            return f"the model changed: {len(a)} nodes -> {len(b)} nodes"
        if (self.synthetic is None) != (other.synthetic is None):
            was = "synthetic" if self.synthetic is not None else "read from files"
            now = "synthetic" if other.synthetic is not None else "read from files"
            return f"the data changed: {was} -> {now}"
        if self.n_rows != other.n_rows:
            return f"the data changed: {self.n_rows} rows -> {other.n_rows} rows"
        if self.synthetic != other.synthetic:
            return f"the synthetic data changed: {self.synthetic} -> {other.synthetic}"
        if [d.path for d in self.data] != [d.path for d in other.data]:
            return (f"the data files changed: {', '.join(d.path for d in self.data)} -> "
                    f"{', '.join(d.path for d in other.data)}")
        for x, y in zip(self.data, other.data):
            if x.bytes != y.bytes:
                return f"the data file {x.path!r} changed: {x.bytes} bytes -> {y.bytes} bytes"
            if x.digest != y.digest:
                return f"the data file {x.path!r} changed: its content digest differs"
        rows = _rows_change(self.rows, other.rows)
        if rows is not None:
            return rows
        for key in sorted(set(self.fit) | set(other.fit)):
            if self.fit.get(key) != other.fit.get(key):
                return f"[fit] {key} changed: {self.fit.get(key)!r} -> {other.fit.get(key)!r}"
        return None


#: how a table's rows are read when nothing says otherwise (what an older checkpoint assumed)
DEFAULT_ROWS = {"sequence_id": "none", "drop_missing": "false", "columns": ""}


def _rows_change(was: dict | None, now: dict | None) -> str | None:
    """What changed in how the rows are read, as ``[data] <setting> changed: a -> b``."""
    if was is None:  # an older checkpoint: it can only have been read the default way
        if now is None or now == DEFAULT_ROWS:
            return None
        was = None
    now = now or DEFAULT_ROWS
    for key in ("sequence_id", "drop_missing", "columns"):
        a = "not recorded by this checkpoint" if was is None else was.get(key, DEFAULT_ROWS[key])
        b = now.get(key, DEFAULT_ROWS[key])
        if a != b:
            what = "the columns the model reads" if key == "columns" else f"[data] {key}"
            return f"{what} changed: {a or 'none'} -> {b or 'none'}"
    return None


def row_settings(cfg, model: Node) -> dict[str, str]:
    """What a row of the config's data is (see :class:`Fingerprint`): the ``[data]`` settings
    that read a table otherwise and, for a table, every leaf's columns by path."""
    d = cfg.data
    paths = [d.path] if d.path is not None else list(d.paths or [])
    columns = ""
    if d.synthetic is None and any(Path(p).suffix.lower() in (".csv", ".parquet") for p in paths):
        from emgrid.models.tables import column_tree

        try:
            _, reads = column_tree(model, d.sequence_id)
        except EmgridError:
            reads = {}
        columns = "; ".join(f"{p or '<root>'}: {','.join(c.names)}" for p, c in sorted(reads.items()))
    return {"sequence_id": repr(d.sequence_id) if d.sequence_id is not None else "none",
            "drop_missing": "true" if d.drop_missing else "false", "columns": columns}


class Checkpoint(_Strict):
    format: Literal[2]
    iteration: int = Field(ge=1)
    model: dict
    log_likelihood: list[float] = Field(min_length=1)
    fingerprint: Fingerprint | None

    @model_validator(mode="after")
    def _consistent(self):
        if len(self.log_likelihood) != self.iteration:
            raise ValueError(f"iteration {self.iteration} with a trace of {len(self.log_likelihood)} entries")
        bad = next((i for i, x in enumerate(self.log_likelihood) if not math.isfinite(x)), None)
        if bad is not None:
            raise ValueError(f"log_likelihood[{bad}] = {self.log_likelihood[bad]} is not finite")
        return self


def model_structure(model: Node) -> list[str]:
    """Every node's path, family, sizes and data type, in pre-order (not its parameters)."""
    out = []
    for path, node in model.nodes():
        sizes = getattr(node, "_sizes", {}) or {}
        extra = "".join(f" {k}={v}" for k, v in sorted(sizes.items()) if v is not None)
        if not node.is_leaf:
            extra += f" children={len(node.children)}"
        fields = getattr(node, "fields", None)
        if fields:
            extra += f" fields={list(fields)}"
        values = getattr(node, "values", None)
        if getattr(node, "value_coded", False) and values is not None:  # a value list a table fixed
            extra += f" values={len(values)}"
        out.append(f"{node.family}{extra} reading {node.data_type()} at {path or '<root>'}")
    return out


def file_digest(path: Path) -> DataFile:
    """Size and BLAKE2b digest of a data file (whole, or sampled when large: see the module)."""
    h = hashlib.blake2b(digest_size=16)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= FULL_HASH_BYTES:
                for chunk in iter(lambda: f.read(BLOCK_BYTES * 8), b""):
                    h.update(chunk)
                hashed = "full"
            else:
                step = (size - BLOCK_BYTES) / (SAMPLED_BLOCKS + 1)
                for k in range(SAMPLED_BLOCKS + 2):
                    f.seek(int(k * step))
                    h.update(f.read(BLOCK_BYTES))
                hashed = "sampled"
    except IsADirectoryError:  # a dataset folder: its files, sorted
        for p in sorted(Path(path).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(path)).encode())
                h.update(file_digest(p).digest.encode())
        return DataFile(path=str(path), bytes=0, digest=h.hexdigest(), hashed="full")
    except OSError as e:
        raise ConfigError(f"[data] cannot read {str(path)!r}: {describe_os_error(e)}") from None
    return DataFile(path=str(path), bytes=size, digest=h.hexdigest(), hashed=hashed)


def fingerprint(cfg, model: Node, n_rows: int, plan=None) -> Fingerprint:
    """The fingerprint of a run of ``cfg`` fitting ``model`` (its shapes complete) to ``n_rows`` rows."""
    d, f = cfg.data, cfg.fit
    synthetic = None
    files: list[DataFile] = []
    if d.synthetic is not None:
        # the truth sampled from: a spec file's bytes, an inline spec, or the model itself
        source = d.truth if d.truth is not None else cfg.model.spec if cfg.model.spec is not None else cfg.model.inline
        truth = file_digest(cfg.resolve(source)).digest if isinstance(source, str) else json.dumps(source, sort_keys=True)
        digest = hashlib.blake2b(truth.encode(), digest_size=8).hexdigest()
        synthetic = f"{d.synthetic} rows, seed {d.seed}, truth {digest}"
    else:
        paths = [d.path] if d.path is not None else list(d.paths or [])
        files = [file_digest(cfg.resolve(p)) for p in paths]
    fit = {"reg_covar": float(f.reg_covar), "pseudo_count": float(f.pseudo_count)}
    if f.dtype != "float64":  # a float64 run's fingerprint stays what it was before dtype existed
        fit["dtype"] = f.dtype
    if model.is_template:
        fit.update(n_init=f.n_init, seed=f.seed, init=f.init, init_iter=f.init_iter)
    plan_text = "" if plan is None else f"{plan.data_parallel}x{plan.model_parallel} grid on {cfg.executor.kind}"
    return Fingerprint(model=model_structure(model), n_rows=n_rows, data=files, synthetic=synthetic,
                       rows=row_settings(cfg, model), fit=fit, plan=plan_text)


def write_checkpoint(folder: Path, iteration: int, model, trace: list[float],
                     fingerprint: Fingerprint | None = None) -> Path:
    """Writes the checkpoint atomically (``outdir.write_atomic``); the folder must exist.

    ``model`` is a whole model, or the model as it sits on the grid (an
    ``executors.mstep.Shards``): then each shard's subtrees go to a file of their own
    (``checkpoint.<tag>.shard-<s>.json``, one shard fetched at a time, ``models.sharded``)
    before ``checkpoint.json``, whose ``model`` is the root naming them; the shard files of
    earlier checkpoints are removed after it is in place. A model no node splits is written
    whole into ``checkpoint.json``, as ever."""
    from . import outdir

    folder = Path(folder)
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
    written = write_model_files(model, folder, SHARD_STEM)
    payload = {"format": FORMAT, "iteration": int(iteration), "model": written.spec,
               "log_likelihood": [float(x) for x in trace],
               "fingerprint": None if fingerprint is None else fingerprint.model_dump()}
    path = outdir.write_output(folder / CHECKPOINT, json.dumps(payload))
    outdir.remove_stale_shard_files(folder, SHARD_STEM, written.files)
    return path


def write_model_files(model, folder: Path, stem: str) -> Written:
    """The shard files of ``model`` (a whole Node, or an ``executors.mstep.Shards``) as
    ``<stem>.<tag>.shard-<s>.json`` in ``folder``, each recorded in the folder's manifest
    before it is written (``cli.outdir``); returns what was written (``models.sharded.Written``:
    the root spec naming them, unwritten, their names, the free parameters). A model no node
    splits gives its plain spec and no file."""
    import secrets

    from . import outdir

    if isinstance(model, Node):
        return Written(spec=model.to_spec(), n_parameters=model.n_parameters())
    tag = None
    if not model.view.whole:
        tag = secrets.token_hex(4)
        outdir.record_outputs(folder, shard_file_names(stem, tag, model.view.n_shards))
    return write_shards(model, folder, stem, write=outdir.write_atomic, tag=tag)


def checkpoint_files(folder: Path) -> list[str]:
    """The files of the checkpoint in ``folder``: ``checkpoint.json`` and the shard files its
    model names (none when it holds the model whole, or when there is no readable checkpoint)."""
    path = Path(folder) / CHECKPOINT
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    model = raw.get("model") if isinstance(raw, dict) else None
    names = [e.get("file") for e in model.get("shards", [])] if is_sharded(model) else []
    return [CHECKPOINT] + [n for n in names if isinstance(n, str)]


def _field_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "<root>"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"field {where!r} is missing"
    if err["type"] == "extra_forbidden":
        return f"unknown field {where!r}"
    if where == "<root>":
        return msg
    shown = repr(err.get("input"))
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"field {where!r} = {shown}: {msg}"


def read_checkpoint(folder: Path, expect: Fingerprint | None = None,
                    max_iter: int | None = None) -> tuple[int, Node, list[float]]:
    """The checkpoint in ``folder``: ``(iteration, model, trace)``; ConfigError naming the
    file and the field when it is damaged, or what changed when ``expect`` (this run's
    fingerprint) differs from its own."""
    path = Path(folder) / CHECKPOINT
    where = f"--resume: checkpoint {str(path)!r}"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"--resume: no checkpoint at {str(path)!r}") from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {describe_os_error(e)}") from None
    try:
        raw = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text" if isinstance(e, UnicodeDecodeError) \
            else "nested too deep"
        raise ConfigError(f"{where} is damaged: not JSON ({why})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} is damaged: a JSON object is expected, got a {type(raw).__name__}")
    if raw.get("format") != FORMAT and "fingerprint" not in raw and expect is not None:
        raise ConfigError(f"{where} has no fingerprint (written by an older emgrid): it cannot be checked "
                          "against this run; start without --resume")
    try:
        ck = Checkpoint.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{where} is damaged: {_field_error(e)}") from None
    try:
        # a model written shard by shard: the root names its files in the folder (models.sharded)
        model = model_from_root(ck.model, path.parent, "the sharded model") if is_sharded(ck.model) else from_spec(ck.model)
    except (EmgridError, ValueError, TypeError) as e:
        raise ConfigError(f"{where} is damaged: field 'model': {str(e).splitlines()[0]}") from None
    if model.is_template:
        raise ConfigError(f"{where} is damaged: field 'model' is a template, not a fitted model")
    if ck.fingerprint is not None and model_structure(model) != ck.fingerprint.model:
        raise ConfigError(f"{where} is damaged: field 'model' does not match its fingerprint")
    if expect is not None:
        if ck.fingerprint is None:
            raise ConfigError(f"{where} has no fingerprint: it cannot be checked against this run; "
                              "start without --resume")
        change = ck.fingerprint.difference(expect)
        if change is not None:
            raise ConfigError(f"{where} belongs to another run: {change}; start without --resume, or use "
                              "another output folder")
    if max_iter is not None and ck.iteration > max_iter:
        raise ConfigError(f"{where} is at iteration {ck.iteration}, beyond [fit] max_iter = {max_iter}; "
                          "raise max_iter to continue it")
    return ck.iteration, model, list(ck.log_likelihood)
