"""Answers out of a fitted model, computed block by block (``engine.block_rows``).

- ``score_samples``: the log-likelihood of every row, ``(n,)``.
- ``predict_proba(data, at)``: for the Mixture or HMM at path ``at``, the row weights the
  E-step hands its children: one row of ``K`` per row its children read, summing to the
  weight reaching the node (1 at the root; a nested node's parent responsibility).
  ``predict`` is its argmax (int64).
- ``posterior_states`` and ``viterbi`` for the HMM at ``at``, given that the HMM generated
  the row: per position, the state probabilities (summing to 1) and the most probable path.
- ``bic`` and ``aic`` from ``Node.n_parameters`` and the total log-likelihood; ``n`` is
  ``n_observations``: the number of positions when the rows are sequences (the innermost
  level, as hmmlearn counts ``len(X)``), else the number of rows (as scikit-learn does).

**Shapes.** An answer has one entry per row the node's children read. For a node outside
sequences that is one per data row: ``(n, K)`` or ``(n,)``. The children of an HMM, and any
node under a ``Sequence`` or ``HMM``, read positions: the answer is then a ``Ragged`` with
the data's offsets around ``(positions, K)`` or ``(positions,)`` values, one ``Ragged``
level per sequence on the way (``answer[i]`` is row ``i``'s positions), the nesting of
``sample(n, rng, latent=True)``'s labels.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from . import engine
from .data import Data, Ragged, concat_rows, n_rows, take_rows
from .errors import DataError, ModelError

if TYPE_CHECKING:
    from .base import Node


class Answers(NamedTuple):
    """One block of rows ``start:stop``: each row's log-likelihood, and for the node at
    ``at`` the weights its children receive, their argmax and (for an HMM) the Viterbi path,
    in the nesting of the module docstring; ``offsets`` are those of its ``Ragged`` levels."""

    start: int
    stop: int
    log_likelihood: np.ndarray
    proba: Data
    label: Data
    viterbi: Data | None
    offsets: tuple[np.ndarray, ...]


# ---------------------------------------------------------------- the nodes answers are about
def choice_paths(model: Node) -> list[str]:
    """Paths of the nodes that choose among their children (Mixtures and HMMs), pre-order."""
    return [p for p, node in model.nodes() if node.shares_child_data and not node.is_leaf]


def hmm_paths(model: Node) -> list[str]:
    """Paths of the HMMs: choosing nodes whose children read a sequence's positions."""
    return [p for p in choice_paths(model) if model.node_at(p).reads_ragged]


def _node(model: Node, at: str, verb: str, paths: list[str], needs: str, plural: str) -> Node:
    where = ", ".join(repr(p) for p in paths) if paths else "none in this model"
    model.require_complete(f"run {verb} on")
    if not isinstance(at, str):
        raise ModelError(f"{verb}: at must be a path string such as '0.1', got {at!r}")
    try:
        node = model.node_at(at)
    except (ModelError, ValueError):
        raise ModelError(f"{verb}: path {at!r} does not exist in this model; {plural} are at: {where}") from None
    if at not in paths:
        raise ModelError(f"node {at!r} is a {node.describe()}; {verb} needs {needs}, which are at: {where}")
    return node


def choice_node(model: Node, at: str, verb: str = "predict") -> Node:
    """The Mixture or HMM at ``at``; a ModelError names what is there and where they are."""
    return _node(model, at, verb, choice_paths(model), "a Mixture or HMM", "Mixtures and HMMs")


def hmm_node(model: Node, at: str, verb: str = "viterbi") -> Node:
    """The HMM at ``at``; a ModelError names what is there and where the HMMs are."""
    return _node(model, at, verb, hmm_paths(model), "an HMM", "HMMs")


# ---------------------------------------------------------------- blocks and nesting
def blocks(model: Node, data: Data, rows_per_block: int | None = None) -> Iterator[tuple[int, int, Data]]:
    """``(start, stop, rows)`` of prepared data, ``engine.block_rows(model)`` rows at a time."""
    n = n_rows(data)
    step = rows_per_block or engine.block_rows(model)
    for a in range(0, n, step):
        b = min(n, a + step)
        yield a, b, take_rows(data, a, b)


def sequence_offsets(model: Node, data: Data, at: str) -> tuple[np.ndarray, ...]:
    """The offsets of every sequence level between the root's rows and the rows the
    children of the node at ``at`` read, outermost first."""
    out = []
    node, d = model, data
    for i in [int(part) for part in at.split(".")] + [0] if at else [0]:
        child = node._child_data(d, i)
        if isinstance(d, Ragged) and child is d.values:
            out.append(d.offsets)
        node, d = node.children[i], child
    return tuple(out)


def nest(values: np.ndarray, offsets: tuple[np.ndarray, ...]) -> Data:
    """``values`` wrapped in one ``Ragged`` per level of ``offsets`` (outermost first)."""
    for o in reversed(offsets):
        values = Ragged.unchecked(values, o)
    return values


def _joined(parts: list) -> Data:
    return concat_rows(parts) if parts else np.zeros(0)


# ---------------------------------------------------------------- answers
def score_samples(model: Node, data) -> np.ndarray:
    """Log-likelihood of every row, ``(n,)``."""
    model.require_complete("score")
    return _scores(model, model.prepare(data))


def _scores(model: Node, data: Data) -> np.ndarray:
    return np.concatenate([engine.log_density(model, d) for _, _, d in blocks(model, data)])


def answer_blocks(model: Node, data, at: str = "", *, rows_per_block: int | None = None,
                  with_viterbi: bool | None = None) -> Iterator[Answers]:
    """Every answer about the node at ``at``, one block of rows at a time (what
    ``emgrid predict`` writes); the Viterbi path by default when the node is an HMM."""
    node = choice_node(model, at)
    is_hmm = at in hmm_paths(model)
    with_viterbi = is_hmm if with_viterbi is None else with_viterbi
    if with_viterbi and not is_hmm:
        hmm_node(model, at)
    data = model.prepare(data)
    for a, b, d in blocks(model, data, rows_per_block):
        W, ld = engine.child_weights(model, d, at)
        offsets = sequence_offsets(model, d, at)
        path = None
        if with_viterbi:
            sub = engine.subtree_data(model, d, at)
            path = nest(viterbi_paths(node, sub), offsets)
        yield Answers(a, b, ld, nest(np.ascontiguousarray(W.T), offsets), nest(W.argmax(axis=0), offsets), path,
                      offsets)


def predict_proba(model: Node, data, at: str = "") -> Data:
    """The weights the node at ``at`` hands its children, ``(rows, K)`` (see the module)."""
    return _joined([ans.proba for ans in answer_blocks(model, data, at, with_viterbi=False)])


def predict(model: Node, data, at: str = "") -> Data:
    """The argmax of ``predict_proba``, int64: per row, the most probable child given that
    the node generated it (for an HMM, each position's most probable state; ``viterbi``
    gives the most probable path)."""
    return _joined([ans.label for ans in answer_blocks(model, data, at, with_viterbi=False)])


def posterior_states(model: Node, data, at: str = "") -> Data:
    """For the HMM at ``at``: each position's state probabilities given that the HMM
    generated the row, a ``Ragged`` of ``(positions, K)`` (rows sum to 1)."""
    node = hmm_node(model, at, "posterior_states")
    data = model.prepare(data)
    parts = []
    for _, _, d in blocks(model, data):
        sub = engine.subtree_data(model, d, at)
        W, _ = engine.child_weights(node, sub, "")
        parts.append(nest(np.ascontiguousarray(W.T), sequence_offsets(model, d, at)))
    return _joined(parts)


def viterbi(model: Node, data, at: str = "") -> Data:
    """For the HMM at ``at``: the most probable state path of every sequence, a ``Ragged``
    of int64 states (ties go to the lower state)."""
    node = hmm_node(model, at)
    data = model.prepare(data)
    parts = []
    for _, _, d in blocks(model, data):
        sub = engine.subtree_data(model, d, at)
        parts.append(nest(viterbi_paths(node, sub), sequence_offsets(model, d, at)))
    return _joined(parts)


def viterbi_paths(hmm: Node, data: Ragged) -> np.ndarray:
    """The most probable states of every position of the HMM's prepared ``data``, ``(positions,)``.

    Log-space max-product over every sequence at once, one time step at a time (sequences
    sorted by decreasing length, so the ones still running at step ``t`` are a prefix).
    """
    logB = np.ascontiguousarray(engine.children_log_density(hmm, data).T)  # (positions, K)
    with np.errstate(divide="ignore"):
        logA, logpi = np.log(hmm.transitions), np.log(hmm.initial)
    lengths = data.lengths
    order = np.argsort(-lengths, kind="stable")
    starts = data.offsets[:-1][order]
    t_max = int(lengths[order[0]]) if lengths.size else 0
    active = np.searchsorted(-lengths[order], -np.arange(t_max), side="left")
    delta = np.empty_like(logB)
    back = np.zeros(logB.shape, dtype=np.int64)
    for t in range(t_max):
        idx = starts[: active[t]] + t
        if t == 0:
            delta[idx] = logpi + logB[idx]
            continue
        scores = delta[idx - 1][:, :, None] + logA[None, :, :]  # (rows, from, to)
        back[idx] = scores.argmax(axis=1)
        delta[idx] = np.take_along_axis(scores, back[idx][:, None, :], axis=1)[:, 0, :] + logB[idx]
    states = np.zeros(logB.shape[0], dtype=np.int64)
    ends = data.offsets[1:][lengths > 0] - 1
    states[ends] = delta[ends].argmax(axis=1)
    for t in range(t_max - 1, 0, -1):
        idx = starts[: active[t]] + t
        states[idx - 1] = back[idx, states[idx]]
    return states


# ---------------------------------------------------------------- information criteria
def n_observations(model: Node, data) -> int:
    """The ``n`` of ``bic``: how many observations ``data`` holds.

    When the rows are sequences (the data is a ``Ragged``: a ``Sequence``, an ``HMM``, or a
    ``Mixture`` of them at the root), an observation is a position of the innermost
    sequence level: ``len(X)`` of hmmlearn's ``bic(X, lengths)`` for an HMM, the positions
    of every inner sequence for a ``Sequence`` of HMMs. Otherwise an observation is a row
    (a record with sequence fields included), as scikit-learn counts ``len(X)``.
    """
    return _observations(model.prepare(data))


def _observations(data: Data) -> int:
    while isinstance(data, Ragged):
        data = data.values
    n = n_rows(data)
    if n < 1:
        raise DataError("data holds no observations (every sequence is empty); BIC needs at least one")
    return n


def _log_likelihood_and_n(model: Node, data) -> tuple[float, int]:
    model.require_complete("score")
    data = model.prepare(data)
    return float(_scores(model, data).sum()), _observations(data)


def bic(model: Node, data) -> float:
    """``-2 log L + p log n``: ``p = model.n_parameters()`` free parameters, ``n`` the
    observations (``n_observations``: positions when the rows are sequences), as hmmlearn's
    and scikit-learn's ``bic``."""
    ll, n = _log_likelihood_and_n(model, data)
    return float(-2.0 * ll + model.n_parameters() * math.log(n))


def aic(model: Node, data) -> float:
    """``-2 log L + 2 p``: ``p = model.n_parameters()`` free parameters."""
    return float(-2.0 * score_samples(model, data).sum() + 2.0 * model.n_parameters())
