"""Sampling with latent labels: the component or state that generated every row.

``sample_latent(model, n, rng)`` draws exactly the rows ``model.sample(n, rng)`` draws (the
same calls on the generator, in the same order) and, for every node that chooses among its
children (a Mixture, an HMM: ``shares_child_data``), the index of the child that generated
each row its children read. A label sits in the nesting ``models.inference`` answers in:
an ``(n,)`` int64 array for a node outside sequences, wrapped in one ``Ragged`` (with the
data's offsets) per sequence or HMM on the way from the root to the node's children. A
row the node did not generate (it belongs to another component of a mixture above) has
label ``-1``.

A choosing node draws its labels through ``_draw_labels`` and its children's rows by
label, as its own ``_sample`` does; any other internal node runs its own ``_sample`` with
recording stand-ins for its children, which places their rows (a record's field, a
sequence's positions) without this module knowing the family.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from .data import Data, Ragged, concat_rows, n_rows, take_index
from .errors import ModelError
from .tree import child_path

if TYPE_CHECKING:
    from .base import Node

#: A route step into a sequence's positions (``Ragged.values``); an int steps into a field.
VALUES = "values"

#: ``{path: (labels, route)}``: a choosing node's labels in the nesting of the data of the
#: node being sampled, and the route from that data to the level the labels count rows of.
Entries = dict[str, tuple[Data, tuple]]


def sample_latent(model: Node, n: int, rng: np.random.Generator) -> tuple[Data, dict[str, Data]]:
    """``(data, labels)``: the rows ``model._sample(n, rng)`` draws and, by path of every
    Mixture and HMM in pre-order, the child that generated each row (see the module)."""
    data, entries = _sample(model, n, rng, "")
    return data, {p: entries[p][0] for p, _ in model.nodes() if p in entries}


def _sample(node: Node, n: int, rng: np.random.Generator, path: str) -> tuple[Data, Entries]:
    if node.is_leaf:
        return node._sample(n, rng), {}
    if node.shares_child_data:
        return _by_label(node, n, rng, path)
    return _through(node, n, rng, path)


def _by_label(node: Node, n: int, rng: np.random.Generator, path: str) -> tuple[Data, Entries]:
    """A choosing node: its labels, then each child's rows for the rows it generates."""
    labels, offsets = node._draw_labels(n, rng)
    k = len(node.children)
    counts = np.bincount(labels, minlength=k)
    parts = [_sample(c, int(counts[j]), rng, child_path(path, j)) for j, c in enumerate(node.children)]
    order = np.argsort(labels, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    rows = take_index(concat_rows([d for d, _ in parts]), inverse)
    entries: Entries = {path: (np.asarray(labels, dtype=np.int64), ())}
    for j, (_, sub) in enumerate(parts):
        for p, (e, route) in sub.items():
            pieces = [e if i == j else _fill(parts[i][0], route) for i in range(k)]
            entries[p] = (take_index(concat_rows(pieces), inverse), route)
    if offsets is None:
        return rows, entries
    return Ragged(rows, offsets), {p: (Ragged.unchecked(e, offsets), (VALUES, *route)) for p, (e, route) in entries.items()}


def _through(node: Node, n: int, rng: np.random.Generator, path: str) -> tuple[Data, Entries]:
    """Any other internal node: its own ``_sample`` over recording stand-ins for its children."""
    stand_ins = tuple(_Recorder(c, child_path(path, i)) for i, c in enumerate(node.children))
    clone = copy.copy(node)
    object.__setattr__(clone, "children", stand_ins)
    out = clone._sample(n, rng)
    entries: Entries = {}
    for i, rec in enumerate(stand_ins):
        if not any(sub for _, sub in rec.calls):
            continue
        if len(rec.calls) != 1:
            raise ModelError(f"latent sampling: {node.family} at {path or '<root>'!r} samples child {i} "
                             f"{len(rec.calls)} times; it places each child's rows with one call")
        d_i, sub = rec.calls[0]
        if isinstance(out, Ragged) and out.values is d_i:
            entries.update({p: (Ragged.unchecked(e, out.offsets), (VALUES, *r)) for p, (e, r) in sub.items()})
        elif isinstance(out, tuple) and i < len(out) and out[i] is d_i:
            entries.update({p: (e, (i, *r)) for p, (e, r) in sub.items()})
        else:
            raise ModelError(f"latent sampling: {node.family} at {path or '<root>'!r} places child {i}'s rows "
                             f"neither as a field nor as sequence positions")
    return out, entries


def _fill(data: Data, route: tuple) -> Data:
    """Labels ``-1`` for every row at ``route`` below ``data``, in the nesting of its sequences."""
    if not route:
        return np.full(n_rows(data), -1, dtype=np.int64)
    step, rest = route[0], route[1:]
    if step == VALUES:
        return Ragged.unchecked(_fill(data.values, rest), data.offsets)
    return _fill(data[step], rest)


class _Recorder:
    """Stands in for a child in its parent's ``_sample``: samples it with labels and keeps
    ``(rows, entries)`` of every call; any other attribute is the child's."""

    def __init__(self, child: Node, path: str):
        self._child, self._path, self.calls = child, path, []

    def _sample(self, n: int, rng: np.random.Generator) -> Data:
        data, entries = _sample(self._child, n, rng, self._path)
        self.calls.append((data, entries))
        return data

    def __getattr__(self, name):
        return getattr(self._child, name)
