"""A fitted model on disk shard by shard, written without ever holding the whole model.

A model whose plan splits it over several shards (:class:`models.shard.ShardView`, some node
spanning shards) is written as a *root* spec naming one file per shard::

    model.json                {"format": "emgrid-sharded", "version": 1,
                               "skeleton": <spec of the spanning nodes, each shard root a stub
                                            {"family": "Elsewhere", "path": P, "data_type": T}>,
                               "shards": [{"file": "model.<tag>.shard-0.json", "roots": ["0", ...]},
                                          ...,
                                          {"file": null, "roots": []}]}     (an idle shard)
    model.<tag>.shard-0.json  {"0": <spec of the subtree at path "0">, ...}

``shards[s]`` is shard ``s``'s entry: its file (in the root's folder) and its root paths in
pre-order, the keys of that file. A model that no node splits (one shard, or every leaf on
one) is written as one plain spec, as :func:`models.save_model` writes it.

Each shard file is written (atomically) from one shard's subtrees before the next is fetched,
then the root, then the shard files of earlier writes of the same name are removed. ``<tag>``
is new on every write, so a root on disk never names a file of another write: a write killed
half-way leaves the previous root and its files whole (and files no root names, removed by
the next write).

:func:`read_model` (and :func:`models.load_model`) read both forms back whole, equal to the
model written (``to_spec()`` equal); :func:`read_shard` reads the skeleton and one shard's
subtrees only.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .base import MAX_SPEC_DEPTH, Node, from_spec, spec_depth
from .errors import ModelError, SpecError
from .files import read_text
from .shard import Elsewhere, ShardView, fill_stubs

__all__ = ["FORMAT", "Written", "ShardOf", "is_sharded", "write_shards", "save_sharded", "save_model_sharded",
           "read_model", "read_root", "read_shard", "model_from_root", "shard_from_root", "shard_file_names",
           "remove_stale_shard_files"]

FORMAT = "emgrid-sharded"
VERSION = 1
STUB = "Elsewhere"

#: ``write(path, text)``: how a file is written (the CLI passes ``cli.outdir.write_atomic``)
Writer = Callable[[Path, str], object]


@dataclass
class Written:
    """What a write produced: the root spec (or the plain spec of a model no node splits),
    the shard files it names, and the free parameters counted on the way (BIC's)."""

    spec: dict
    files: list[str] = field(default_factory=list)
    n_parameters: int = 0


@dataclass
class ShardOf:
    """One shard's part of a sharded file: the skeleton (stubs for every shard root) and the
    shard's subtrees by root path; :meth:`part` assembles them (``ShardView.model_for``'s form)."""

    skeleton: Node
    subtrees: dict[str, Node]

    def part(self) -> Node:
        return fill_stubs(self.skeleton, self.subtrees)


# ---------------------------------------------------------------- writing
def write_atomic(path: Path, text: str) -> Path:
    """A temporary file in ``path``'s folder, synced and renamed over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "x") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return path


def shard_file_names(stem: str, tag: str, n_shards: int) -> list[str]:
    return [f"{stem}.{tag}.shard-{s}.json" for s in range(n_shards)]


def write_shards(shards, folder, stem: str, *, write: Writer | None = None, tag: str | None = None,
                 indent: int | None = None) -> Written:
    """Writes the shard files of ``shards`` (an ``executors.mstep.Shards``: ``.view``,
    ``.skeleton``, and ``for s, subtrees in shards``, one shard fetched at a time) into
    ``folder`` as ``<stem>.<tag>.shard-<s>.json`` and returns the root spec naming them,
    unwritten (the caller writes it: a file of its own, or a field of a checkpoint). A model
    no node splits gives its plain spec and no file."""
    write = write_atomic if write is None else write
    folder = Path(folder)
    view: ShardView = shards.view
    if view.whole:
        for _, subtrees in shards:
            if "" in subtrees:
                model = subtrees[""]
                return Written(spec=model.to_spec(), n_parameters=model.n_parameters())
        raise ModelError("no shard holds the model")  # pragma: no cover - a view always names its holder
    tag = secrets.token_hex(4) if tag is None else tag
    names = shard_file_names(stem, tag, view.n_shards)
    skeleton: Node = shards.skeleton
    n_parameters = skeleton.n_parameters()  # the spanning nodes' own (a stub has none)
    entries, files = [], []
    for s, subtrees in shards:
        roots = list(view.roots_of(s))
        if set(subtrees) != set(roots):
            raise ModelError(f"shard {s} sent subtrees {sorted(subtrees)}, not its roots {roots}")
        if not roots:
            entries.append({"file": None, "roots": []})
            continue
        body = {p: subtrees[p].to_spec() for p in roots}
        n_parameters += sum(subtrees[p].n_parameters() for p in roots)
        del subtrees
        write(folder / names[s], json.dumps(body, indent=indent))
        del body
        entries.append({"file": names[s], "roots": roots})
        files.append(names[s])
    spec = {"format": FORMAT, "version": VERSION, "skeleton": skeleton.to_spec(), "shards": entries}
    return Written(spec=spec, files=files, n_parameters=n_parameters)


def remove_stale_shard_files(folder, stem: str, keep: Iterable[str] = ()) -> None:
    """Removes ``<stem>.*.shard-*.json`` files in ``folder`` but ``keep`` (those the root just
    written names): earlier writes' and those of a write killed before its root."""
    keep = set(keep)
    for p in Path(folder).glob(f"{stem}.*.shard-*.json"):
        if p.name not in keep:
            try:
                p.unlink()
            except OSError:
                pass


def save_sharded(shards, path, *, write: Writer | None = None, indent: int | None = 1) -> Written:
    """Writes ``shards`` (see :func:`write_shards`) as the root ``path`` and its shard files
    beside it, one shard at a time; the earlier shard files of ``path`` are removed after
    the root is in place."""
    write = write_atomic if write is None else write
    path = Path(path)
    stem = path.name[:-len(".json")] if path.name.endswith(".json") else path.name
    written = write_shards(shards, path.parent, stem, write=write, indent=indent)
    write(path, json.dumps(written.spec, indent=indent))
    remove_stale_shard_files(path.parent, stem, written.files)
    return written


class _Held:
    """A whole model in this process seen as shards (``executors.mstep.Shards.held``'s twin,
    which this layer cannot import)."""

    def __init__(self, view: ShardView, model: Node):
        self.view, self._model = view, model
        self.skeleton = view.skeleton(model)

    def __iter__(self):
        for s in range(self.view.n_shards):
            yield s, self.view.owned(s, self._model)


def save_model_sharded(model: Node, path, view: ShardView, *, write: Writer | None = None) -> Written:
    """``model`` (whole, in this process) written in ``view``'s shards (:func:`save_sharded`)."""
    return save_sharded(_Held(view, model), path, write=write)


# ---------------------------------------------------------------- reading
def is_sharded(spec) -> bool:
    """Whether a spec read from a file is a sharded model's root."""
    return isinstance(spec, dict) and spec.get("format") == FORMAT


def _read_json(path: Path, what: str):
    """The JSON of a regular UTF-8 file within ``models.files.MAX_SPEC_FILE_BYTES``."""
    text = read_text(path, what, SpecError)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} {str(path)!r} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except RecursionError:
        raise SpecError(f"{what} {str(path)!r} is nested too deep to read; the limit is {MAX_SPEC_DEPTH} "
                        "levels") from None


def read_root(path) -> dict | list:
    """The JSON of a model file (a plain spec or a sharded root)."""
    return _read_json(Path(path), "model spec")


def _check_root(root: dict, where: str) -> tuple[dict, list[dict], dict[str, int]]:
    """The root's skeleton spec, shard entries and shard of every root path (SpecError naming
    ``where`` and the field when something is off)."""
    if root.get("version") != VERSION:
        raise SpecError(f"{where}: sharded model version {root.get('version')!r} is not {VERSION}")
    unknown = sorted(set(root) - {"format", "version", "skeleton", "shards"})
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown} in a sharded model")
    skeleton, entries = root.get("skeleton"), root.get("shards")
    if not isinstance(skeleton, dict):
        raise SpecError(f"{where}: field 'skeleton' must be a model spec")
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{where}: field 'shards' must be a non-empty list")
    if spec_depth(skeleton) > MAX_SPEC_DEPTH:
        raise SpecError(f"{where}: field 'skeleton' is nested too deep; the limit is {MAX_SPEC_DEPTH} levels")
    owner: dict[str, int] = {}
    for s, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"file", "roots"}:
            raise SpecError(f"{where}: shards[{s}] must be {{'file': ..., 'roots': [...]}}")
        name, roots = e["file"], e["roots"]
        if not isinstance(roots, list) or not all(isinstance(p, str) for p in roots):
            raise SpecError(f"{where}: shards[{s}].roots must be a list of paths")
        if (name is None) != (not roots):
            raise SpecError(f"{where}: shards[{s}] names a file without roots, or roots without a file")
        if name is not None and (not isinstance(name, str) or not name or "/" in name or "\\" in name
                                 or name in (".", "..") or any(ord(ch) < 32 for ch in name)):
            raise SpecError(f"{where}: shards[{s}].file must be a file name in the root's folder, got {name!r}")
        for p in roots:
            if p in owner:
                raise SpecError(f"{where}: root {p!r} is on shards {owner[p]} and {s}")
            owner[p] = s
    stubs = _stub_paths(skeleton)
    if sorted(stubs) != sorted(owner):
        missing = sorted(set(stubs) - set(owner)) or sorted(set(owner) - set(stubs))
        raise SpecError(f"{where}: the skeleton's stubs and the shards' roots differ (at {missing})")
    return skeleton, entries, owner


def _stub_paths(spec) -> list[str]:
    out: list[str] = []

    def walk(x):
        if isinstance(x, dict):
            if x.get("family") == STUB:
                path = x.get("path")
                if not isinstance(path, str) or set(x) - {"family", "path", "data_type"}:
                    raise SpecError(f"a stub of a sharded model must be {{'family': 'Elsewhere', 'path': ..., "
                                    f"'data_type': ...}}, got keys {sorted(x)}")
                out.append(path)
                return
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(spec)
    return out


def _splice(spec, fill: Callable[[dict], object]):
    """``spec`` with every stub replaced by ``fill(stub)`` (a spec or a Node); only the
    skeleton is walked, never what is filled in."""
    if isinstance(spec, dict):
        if spec.get("family") == STUB:
            return fill(spec)
        return {k: _splice(v, fill) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_splice(v, fill) for v in spec]
    return spec


def _read_shard_file(folder: Path, entry: dict, s: int, where: str) -> dict:
    path = folder / entry["file"]
    body = _read_json(path, f"shard {s} of {where}")
    if not isinstance(body, dict) or list(body) != entry["roots"]:
        got = sorted(body) if isinstance(body, dict) else type(body).__name__
        raise SpecError(f"shard file {str(path)!r} holds {got}, not the roots {entry['roots']} its root names "
                        "(a file of another write?)")
    return body


def model_from_root(root: dict, folder, where: str = "sharded model") -> Node:
    """The whole model a sharded root names (its shard files read from ``folder``)."""
    folder = Path(folder)
    skeleton, entries, _ = _check_root(root, where)
    subtrees: dict[str, dict] = {}
    for s, e in enumerate(entries):
        if e["file"] is not None:
            subtrees.update(_read_shard_file(folder, e, s, where))
    return from_spec(_splice(skeleton, lambda stub: subtrees[stub["path"]]))


def shard_from_root(root: dict, folder, shard: int, where: str = "sharded model") -> ShardOf:
    """Shard ``shard``'s part of a sharded root: the skeleton and that shard's subtrees only."""
    folder = Path(folder)
    skeleton, entries, _ = _check_root(root, where)
    if not 0 <= shard < len(entries):
        raise SpecError(f"{where}: no shard {shard} (it has {len(entries)})")
    e = entries[shard]
    body = _read_shard_file(folder, e, shard, where) if e["file"] is not None else {}
    subtrees = {p: from_spec(spec) for p, spec in body.items()}
    stubbed = from_spec(_splice(skeleton, lambda stub: Elsewhere(stub["path"], stub.get("data_type"))))
    return ShardOf(skeleton=stubbed, subtrees=subtrees)


def read_model(path) -> Node:
    """A model file read back whole: a plain spec, or a sharded root and its shard files."""
    p = Path(path)
    spec = read_root(p)
    if is_sharded(spec):
        return model_from_root(spec, p.parent, f"model spec {str(p)!r}")
    return from_spec(spec)


def read_shard(path, shard: int) -> ShardOf:
    """Shard ``shard``'s part of a model file. A plain spec (a model no node splits) is one
    shard holding the whole tree: shard 0 gets it, under a bare stub as skeleton."""
    p = Path(path)
    spec = read_root(p)
    if is_sharded(spec):
        return shard_from_root(spec, p.parent, shard, f"model spec {str(p)!r}")
    if shard != 0:
        raise SpecError(f"model spec {str(p)!r} is not sharded: it has shard 0 only")
    model = from_spec(spec)
    return ShardOf(skeleton=Elsewhere("", model.data_type()), subtrees={"": model})

