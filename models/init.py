"""Templates completed from the data: shapes first (before planning), then values (per start).

- :func:`complete_shapes` fills what the plan needs and only the data can say: a leaf's
  sizes that its data decide (``Leaf._sizes_from_data``: a ``Categorical()``'s number of
  values is the largest value of its column plus one) and a sequence's or HMM's
  ``mean_length`` (the mean length of its rows). It reads just those columns (the offsets,
  the integer values), memory-mapped when the data live on disk.
- :func:`initialize` fills every other unset parameter from a bounded, seeded, uniform
  sample of rows drawn by global row index (:func:`sample_index`), so every executor, every
  grid and every MPI rank builds the same starting model for the same seed without any
  process holding more than the sample. Recursively, on the rows each node receives:

  * a leaf: its own statistics of its rows (``_accumulate``, under the support rule of
    ``models.support``: a row outside its support weighs 0), then its M-step; a leaf
    that is one part of a partition adds ``PRIOR_ROWS`` rows' worth of the statistics of
    every row the partition split, so a value its part lacks keeps some probability;
  * a ``Composite``: each field on its column; a ``Sequence``: its child on the positions,
    each weighted by its row's weight;
  * a ``Mixture``: its rows partitioned, greedy k-means++ and a few Lloyd iterations on
    the standardized columns where its components read floats or vectors (or records with
    such fields; drawn again while some cluster has fewer rows than its component needs,
    ``Node.rows_needed``),
    a random partition otherwise; each component then completed from its part, the
    weights set to the parts' shares;
  * an ``HMM``: its positions partitioned the same way for the emissions, except that
    emissions reading integers are started, with ``init="auto"``, from what the values
    mean: Poisson counts (an ordered level per state) from rates drawn at random around
    the data's (:func:`_poisson_levels`), categorical codes partitioned by k-means of each
    position's context (the values around it, :mod:`models.context`); with more than
    ``context.MAX_VALUES`` distinct values they start instead from every position weighted
    by a seeded random tilt of its value per state (a random partition of many positions
    would give every state nearly the overall histogram, a start EM barely moves from).
    Transitions and initial probabilities count the partition's consecutive labels and
    first labels, plus about one (seeded, jittered) pseudo-count each, so none starts at
    zero; near-uniform ones without a partition, and states that persist
    (``STAY``) with the drawn rates.

  No two components start equal: they are fitted to disjoint parts of the sample, or to
  its positions under different random tilts.
"""

from __future__ import annotations

import numpy as np

from .base import Node
from .categorical import floor_probs
from .composite import Composite
from .context import context_labels
from .data import Data, Ragged, n_rows, take_index
from .errors import ConfigError, ModelError
from .hmm import HMM
from .kmeans import kmeans_labels, random_labels
from .mixture import Mixture
from .floors import RATE_FLOOR
from .poisson import Poisson
from .schema import Children, Param, Size
from .sequence import Sequence
from .support import leaf_accumulate, leaf_rows
from .tree import child_path

__all__ = ["INIT_METHODS", "complete_shapes", "data_shapes_unset", "check_init", "sample_index", "sample_rows", "initialize"]

#: ``init`` values: k-means where components read floats or vectors, k-means of contexts (or
#: random value tilts) for an HMM's integer emissions and random partitions elsewhere
#: (``auto``), or one method everywhere it applies (``random``: random partitions everywhere).
INIT_METHODS = ("auto", "kmeans", "random")
#: The sample initialization reads: ``min(n, max(SAMPLE_MIN_ROWS, SAMPLE_ROWS_PER_LEAF * leaves))``.
SAMPLE_MIN_ROWS = 2000
SAMPLE_ROWS_PER_LEAF = 200
#: Relative jitter of an HMM's initial transitions around uniform.
TRANSITION_JITTER = 0.2
#: Shape of the Gamma draws that tilt an HMM's integer emissions per state and value
#: (:func:`_value_tilts`): 1 gives each value's weight a coefficient of variation of 1.
TILT_SHAPE = 1.0
#: An HMM's probability of staying in its state at a start from drawn Poisson rates
#: (:func:`_poisson_levels`), the rest spread evenly over the other states.
STAY = 0.9
#: How many times k-means is drawn, at most, for a partition whose every cluster holds the
#: rows its component needs (:func:`_partition`).
KMEANS_DRAWS = 5
#: Rows' worth of a partition's pooled statistics added to each leaf part's own.
PRIOR_ROWS = 1.0


def _where(path: str) -> str:
    return repr(path) if path else "'<root>'"


def _children_name(node: Node) -> str:
    return next(f.name for f in node.schema if isinstance(f, Children))


def _rebuild(node: Node, children, **values) -> Node:
    name = _children_name(node)
    many = next(f.many for f in node.schema if isinstance(f, Children))
    return node.with_fields(**{name: list(children) if many else children[0]}, **values)


# ---------------------------------------------------------------- shapes
def complete_shapes(model: Node, data: Data) -> Node:
    """``model`` with every size and ``mean_length`` the data decide filled in (the same
    node when there is none); ``data`` is prepared (or an ``NpyDataset``'s ``open()``)."""
    return _shapes(model, data, "")


def _shapes(node: Node, data, path: str) -> Node:
    if node.is_leaf:
        if not _from_data(node):
            return node
        sizes = node._sizes_from_data(data, f"{node.family} at path {_where(path)}")
        return node.with_fields(**sizes) if sizes else node
    kids = [_shapes(c, node._child_data(data, i), child_path(path, i)) for i, c in enumerate(node.children)]
    values = {}
    if node.reads_ragged and node.mean_length is None:
        offsets = data.offsets
        n, total = len(offsets) - 1, int(offsets[-1])
        if total == 0:
            raise ModelError(f"{node.family} at path {_where(path)} cannot be completed from the data: its "
                             f"{n} sequence(s) hold no positions")
        values["mean_length"] = total / n
    if not values and all(a is b for a, b in zip(kids, node.children)):
        return node
    return _rebuild(node, kids, **values)


def _from_data(node: Node) -> list[str]:
    """A leaf's unset sizes that its data decide (``Size`` fields with ``from_data``)."""
    unset = node.own_unset()
    return [f.name for f in node.schema if isinstance(f, Size) and f.from_data and f.name in unset]


def data_shapes_unset(model: Node) -> list[tuple[str, str]]:
    """The unset ``(path, field)`` that :func:`complete_shapes` takes from the data."""
    out = []
    for path, node in model.nodes():
        sizes = _from_data(node) if node.is_leaf else []
        for name in node.own_unset():
            if name in sizes or (node.reads_ragged and name == "mean_length"):
                out.append((path, name))
    return out


def check_init(model: Node, init: str) -> None:
    """Raises ConfigError before any work when ``init`` is unknown, or is ``"kmeans"`` for a
    mixture or HMM whose components have no float or vector data to cluster."""
    if init not in INIT_METHODS:
        raise ConfigError(f"init must be one of {', '.join(INIT_METHODS)}, got {init!r}")
    if init != "kmeans":
        return
    for path, node in model.nodes():
        if isinstance(node, (Mixture, HMM)) and node.is_template and not _clusterable(node.children[0]):
            raise ConfigError(f"init='kmeans' needs components that read floats or vectors; the {node.family} at "
                              f"path {_where(path)} reads {node.children[0].data_type()} (use init='auto' or 'random')")


def _clusterable(node: Node) -> bool:
    t = node.data_type()
    if t == "float" or t.startswith("vec["):
        return True
    return isinstance(node, Composite) and any(_clusterable(c) for c in node.children)


# ---------------------------------------------------------------- the sample
def sample_index(model: Node, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted global row indices of a uniform sample without replacement."""
    m = min(n, max(SAMPLE_MIN_ROWS, SAMPLE_ROWS_PER_LEAF * len(model.leaves())))
    if m == n:
        return np.arange(n, dtype=np.int64)
    return np.sort(rng.choice(n, size=m, replace=False)).astype(np.int64)


def sample_rows(data: Data, index: np.ndarray) -> Data:
    """The rows ``index`` (sorted) as arrays in memory, reading only their bytes when the
    data are memory-mapped: a sequence's two offsets per row, then its positions."""
    if isinstance(data, tuple):
        return tuple(sample_rows(c, index) for c in data)
    if isinstance(data, Ragged):
        starts = np.asarray(data.offsets[index], dtype=np.int64)
        ends = np.asarray(data.offsets[index + 1], dtype=np.int64)
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        pos = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1], dtype=np.int64)
        return Ragged.unchecked(sample_rows(data.values, pos), offsets)
    return np.ascontiguousarray(data[index])


# ---------------------------------------------------------------- values
def initialize(model: Node, data: Data, n_data: int, *, seed: int, start: int = 0, init: str = "auto") -> Node:
    """Start ``start`` of a seeded initialization: ``model`` (shapes complete) with every
    unset parameter filled from a sample of ``data``; a complete model is returned as is.
    Data held elsewhere (a Spark DataFrame's rows) give the sample's rows by their global
    indices through their ``rows_at(index)``, so every executor seeds from the same rows."""
    check_init(model, init)
    if not model.is_template:
        return model
    rng = np.random.default_rng([seed, start])
    index = sample_index(model, n_data, rng)
    rows = data.rows_at(index) if hasattr(data, "rows_at") else sample_rows(data, index)
    return _fill(model, rows, np.ones(n_rows(rows)), rng, init, "")


def _fill(node: Node, data, w: np.ndarray, rng, init: str, path: str) -> Node:
    if not node.is_template:
        return node
    if node.is_leaf:
        return _leaf(node, data, w, path)
    if isinstance(node, (Mixture, HMM)):
        return _mixture(node, data, w, rng, init, path)
    if isinstance(node, Sequence):
        child = _fill(node.child, data.values, np.repeat(w, data.lengths), rng, init, child_path(path, 0))
        return _rebuild(node, [child])
    kids = [_fill(c, node._child_data(data, i), w, rng, init, child_path(path, i)) for i, c in enumerate(node.children)]
    return _rebuild(node, kids)


def _leaf(node: Node, data, w: np.ndarray, path: str, prior=None) -> Node:
    """The leaf's M-step on its rows (plus ``prior``, pooled statistics scaled to
    ``PRIOR_ROWS`` rows); parameters the template gives are kept."""
    own = leaf_accumulate(node, leaf_rows(node, data), w)
    if prior is not None:
        own = tuple(a + b for a, b in zip(own, prior))
    fitted = node._estimate(own, ())
    if fitted.is_template:
        raise ModelError(f"{node.family} at path {_where(path)} cannot be initialized: its rows in the "
                         f"initialization sample carry no weight")
    given = {f.name: getattr(node, f.name) for f in node.schema
             if isinstance(f, Param) and getattr(node, f.name) is not None}
    return fitted.with_fields(**given) if given else fitted


def _mixture(node, data, w, rng, init: str, path: str) -> Node:
    """A mixture's or an HMM's children from a partition of its rows (positions for an HMM)."""
    hmm = isinstance(node, HMM)
    rows, rw = (data.values, np.repeat(w, data.lengths)) if hmm else (data, w)
    k, m = len(node.children), n_rows(rows)
    if m < k:
        what = "positions" if hmm else "rows"
        raise ModelError(f"{node.family} at path {_where(path)} has {k} components but the initialization "
                         f"sample holds {m} {what}; give fewer components or more data")
    labels = tilts = None
    if hmm and k > 1 and init == "auto" and all(isinstance(c, Poisson) and c.is_template for c in node.children):
        return _poisson_levels(node, rows, rw, k, rng)
    if hmm and k > 1 and init == "auto" and node.children[0].data_type() == "int":
        labels = context_labels(rows, data.offsets, rw, k, rng)
        tilts = _value_tilts(rows, k, rng) if labels is None else None
    if labels is None and tilts is None:
        labels = _partition(node.children[0], rows, rw, k, rng, init) if k > 1 else np.zeros(m, dtype=np.int64)
    kids, pooled = [], {}
    for j, c in enumerate(node.children):
        if tilts is not None:  # every position, weighted by the tilt of its value
            part_rows, part_w = rows, rw * tilts[:, j]
        else:
            part = np.flatnonzero(labels == j)
            part_rows, part_w = take_index(rows, part), rw[part]
        if c.is_leaf and c.is_template:
            key = c.describe()
            if key not in pooled:
                own = leaf_accumulate(c, leaf_rows(c, rows), rw)
                pooled[key] = tuple(PRIOR_ROWS / rw.sum() * s for s in own)
            kids.append(_leaf(c, part_rows, part_w, child_path(path, j), pooled[key]))
        else:
            kids.append(_fill(c, part_rows, part_w, rng, init, child_path(path, j)))
    values = {}
    if hmm:
        if node.transitions is None:
            jitter = 1.0 + TRANSITION_JITTER * (rng.random((k, k)) - 0.5)
            counts = jitter if labels is None else jitter + _pair_counts(labels, rw, data.offsets, k)
            values["transitions"] = counts / counts.sum(axis=1, keepdims=True)
        if node.initial is None:
            first = data.offsets[:-1][data.lengths > 0]
            counts = np.ones(k) if labels is None else 1.0 + np.bincount(labels[first], rw[first], minlength=k)
            values["initial"] = counts / counts.sum()
    elif node.weights is None:
        mass = np.bincount(labels, weights=rw, minlength=k)
        values["weights"] = floor_probs(mass / mass.sum())
    return _rebuild(node, kids, **values)


def _poisson_levels(node: HMM, rows, w: np.ndarray, k: int, rng) -> HMM:
    """An HMM of Poisson states started from ``k`` rates drawn from the Gamma distribution
    with the counts' mean and variance (at least the mean), in increasing order, with
    states that persist (``STAY``) and uniform initial probabilities (given ones kept).

    A count series' states are levels that last (what makes it an HMM and not a mixture).
    Partitions of the positions start every state from nearly the same rate with fast
    switching, and EM then spends hundreds of iterations on a plateau (the 107 annual
    earthquake counts, 4 states: -327.8 after 100 iterations from k-means of the values
    and their neighbours); rates spread like the data's, with persistent states, reach
    -326.5 or above within 20 (hmmlearn draws its Poisson rates alike, and its
    transitions at random)."""
    x = np.asarray(rows, dtype=np.float64)
    mean = float(w @ x / w.sum())
    var = max(float(w @ (x - mean) ** 2 / w.sum()), mean, 1e-12)
    rates = np.sort(rng.gamma(mean * mean / var, var / mean, size=k)) if mean > 0 else np.zeros(k)
    rates = np.maximum(rates, RATE_FLOOR)
    kids = [Poisson(float(r)) for r in rates]
    values = {}
    if node.transitions is None:
        a = np.full((k, k), (1.0 - STAY) / (k - 1))
        np.fill_diagonal(a, STAY)
        values["transitions"] = a
    if node.initial is None:
        values["initial"] = np.full(k, 1.0 / k)
    return _rebuild(node, kids, **values)


def _value_tilts(rows, k: int, rng) -> np.ndarray:
    """Per position and state, the weight ``g_j(x)`` that state ``j`` gives the position's
    value ``x``, one draw of ``Gamma(TILT_SHAPE)`` per state and distinct value (in sorted
    order of the values, so the draws follow the sample alone). Each state starts from the
    data's histogram tilted by its own ``g_j``: diverse states around the data, where a
    random partition of the positions would give every state nearly the overall histogram."""
    values, inverse = np.unique(np.asarray(rows), return_inverse=True)
    g = rng.gamma(TILT_SHAPE, size=(values.size, k))
    return g[inverse.reshape(-1)]


def _pair_counts(labels: np.ndarray, w: np.ndarray, offsets: np.ndarray, k: int) -> np.ndarray:
    """``(k, k)``: the weight of consecutive positions of one sequence labelled ``(i, j)``."""
    follows = np.ones(labels.size, dtype=bool)
    follows[offsets[:-1][offsets[:-1] < labels.size]] = False  # a sequence's first position follows none
    at = np.flatnonzero(follows)
    return np.bincount(labels[at - 1] * k + labels[at], weights=w[at], minlength=k * k).reshape(k, k)


def _partition(component: Node, rows, w, k: int, rng, init: str) -> np.ndarray:
    """Labels of the rows: k-means of their features, drawn again (up to ``KMEANS_DRAWS``
    times) while some cluster holds fewer rows than a component needs; random otherwise."""
    X = _features(rows, component) if init != "random" else None
    if X is None:
        return random_labels(n_rows(rows), k, rng)
    need = component.rows_needed()
    draws = KMEANS_DRAWS if need > 1 and X.shape[0] >= k * need else 1
    for _ in range(draws):
        labels = kmeans_labels(X, w, k, rng)
        if np.bincount(labels, minlength=k).min() >= need:
            break
    return labels


def _features(data, node: Node) -> np.ndarray | None:
    """The rows as a float matrix k-means can cluster: a float column, vectors, or a
    record's float and vector fields, each column standardized (the Gaussians fit the same
    whatever a column's unit, so its unit must not decide the partition either: on raw
    columns the one with the largest numbers alone would); None when the data hold none."""
    X = _columns(data, node)
    if X is None:
        return None
    sd = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def _columns(data, node: Node) -> np.ndarray | None:
    t = node.data_type()
    if t == "float":
        return np.asarray(data, dtype=np.float64)[:, None]
    if t.startswith("vec["):
        return np.asarray(data, dtype=np.float64)
    if isinstance(node, Composite):
        parts = [f for i, c in enumerate(node.children) if (f := _columns(data[i], c)) is not None]
        return np.hstack(parts) if parts else None
    if isinstance(node, Mixture):
        return _columns(data, node.children[0])
    return None
