"""The node contract every family implements, and the tree-wide operations built on it.

A family implements a few *own* hooks (its work with children excluded); the recursive
log-density, statistics and M-step are the engine's (``models.engine``) so that the same
passes run on a whole tree in one process and on one model shard of a grid.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .cost import NodeCost
from .data import Data, Ragged, n_rows
from .errors import DataError, ModelError, SpecError
from .stats import OwnStats, Stats

FAMILIES: dict[str, type["Node"]] = {}


def child_path(path: str, i: int) -> str:
    """Path of child ``i`` below ``path`` (dotted child indices, root ``""``)."""
    return f"{path}.{i}" if path else str(i)


class Node:
    """A node of a model tree. Subclasses set ``family`` and implement the own hooks."""

    family: ClassVar[str] = ""
    spec_fields: ClassVar[tuple[str, ...]] = ()
    has_own_stats: ClassVar[bool] = True
    shares_child_data: ClassVar[bool] = False
    #: its data is a ``Ragged`` of its children's rows, ``mean_length`` of them per row on
    #: average (a sequence, an HMM)
    reads_ragged: ClassVar[bool] = False
    children: tuple["Node", ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.family:
            FAMILIES[cls.family] = cls

    # ---------------------------------------------------------------- tree structure
    @property
    def is_leaf(self) -> bool:
        return not self.children

    def nodes(self, prefix: str = "") -> list[tuple[str, "Node"]]:
        """Every ``(path, node)`` of the tree in pre-order."""
        out = [(prefix, self)]
        for i, c in enumerate(self.children):
            out.extend(c.nodes(child_path(prefix, i)))
        return out

    def leaves(self) -> list[tuple[str, "Node"]]:
        """Every ``(path, leaf)`` in the fixed pre-order."""
        return [(p, n) for p, n in self.nodes() if n.is_leaf]

    def node_at(self, path: str) -> "Node":
        node = self
        if path:
            for part in path.split("."):
                i = int(part)
                if not 0 <= i < len(node.children):
                    raise ModelError(f"path {path!r} does not exist in this model")
                node = node.children[i]
        return node

    def child_rows(self, i: int) -> float:
        """Rows of child ``i`` per row of this node (mean sequence length for sequences)."""
        return 1.0

    def child_data_shares(self) -> np.ndarray:
        """For a node whose children read one column (``shares_child_data``): the share of
        its rows each child generates (a mixture's weights; uniform here)."""
        return np.full(len(self.children), 1.0 / max(1, len(self.children)))

    # ---------------------------------------------------------------- data
    def data_type(self) -> str:
        """A signature of the data this node reads; nodes nest where signatures agree."""
        raise NotImplementedError

    def prepare(self, data) -> Data:
        """Converts user data to the canonical encoding and checks it; raises DataError."""
        data = self._prepare(data, "data")
        if n_rows(data) == 0:
            raise DataError("data has no rows; at least one row is required")
        return data

    def _prepare(self, data, where: str) -> Data:
        raise NotImplementedError

    def prepare_weights(self, weights, n: int) -> np.ndarray:
        if weights is None:
            return np.ones(n)
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (n,):
            raise DataError(f"weights must have shape ({n},), got {w.shape}")
        if not np.all(np.isfinite(w)):
            raise DataError("weights must be finite, got NaN or inf")
        if np.any(w < 0):
            raise DataError(f"weights must be >= 0, got {float(w.min())}")
        if not np.any(w > 0):
            raise DataError("weights are all zero; at least one row needs positive weight")
        return w

    # ---------------------------------------------------------------- public contract
    def log_density(self, data) -> np.ndarray:
        """Log density of every row, shape ``(n_rows,)``."""
        from .engine import log_density

        return log_density(self, self.prepare(data))

    def accumulate(self, data, weights=None) -> Stats:
        """Additive sufficient statistics of (weighted) rows, keyed by node path."""
        from .engine import accumulate

        data = self.prepare(data)
        return accumulate(self, data, self.prepare_weights(weights, n_rows(data)))

    def estimate(self, stats: Stats, path: str = "") -> "Node":
        """The M-step: a new node fitted to ``stats`` (as returned by ``accumulate``)."""
        new_children = tuple(c.estimate(stats, child_path(path, i)) for i, c in enumerate(self.children))
        if not self.has_own_stats:
            return self._estimate((), new_children)
        try:
            own = stats[path]
        except KeyError:
            raise ModelError(f"statistics hold nothing for node {path or '<root>'!r} ({self.family})") from None
        return self._estimate(own, new_children)

    def sample(self, n: int, rng: np.random.Generator | int | None = None) -> Data:
        """``n`` rows drawn from the model, in the canonical encoding."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ModelError(f"sample n must be an integer >= 0, got {n!r}")
        rng = np.random.default_rng(rng)
        return self._sample(int(n), rng)

    def cost(self) -> NodeCost:
        """This node's own per-row cost (children excluded)."""
        raise NotImplementedError

    def params(self) -> dict[str, np.ndarray]:
        """The node's own parameters as arrays (their nbytes are ``param_bytes``)."""
        return {}

    def to_spec(self) -> dict:
        """A JSON-ready dict: ``{"family": ..., <params>..., <children>...}``."""
        raise NotImplementedError

    @staticmethod
    def from_spec(spec: dict) -> "Node":
        from .spec import from_spec

        return from_spec(spec)

    def copy(self) -> "Node":
        return Node.from_spec(self.to_spec())

    def __repr__(self) -> str:
        return f"{self.family}(...)" if self.children else f"{self.family}({self._param_repr()})"

    def _param_repr(self) -> str:
        return ", ".join(f"{k}={np.array2string(np.asarray(v), precision=3, threshold=6)}" for k, v in self.params().items())

    def describe(self) -> str:
        """A short human name used in plans and errors, e.g. ``FullGaussian d=400``."""
        return self.family

    # ---------------------------------------------------------------- own hooks
    def _sample(self, n: int, rng: np.random.Generator) -> Data:
        raise NotImplementedError

    def _estimate(self, own: OwnStats, children: tuple["Node", ...]) -> "Node":
        raise NotImplementedError


def batch_class(node: Node) -> type | None:
    """The leaf class whose batched kernels evaluate all of ``node``'s children in one
    pass (they read one data column and are leaves of one class), else None."""
    if not node.shares_child_data or len(node.children) < 2:
        return None
    cls = type(node.children[0])
    if not all(type(c) is cls and c.is_leaf for c in node.children):
        return None
    return cls


class Leaf(Node):
    """A node with data of its own and no children."""

    def _log_density(self, data: Data) -> np.ndarray:
        raise NotImplementedError

    def _accumulate(self, data: Data, w: np.ndarray) -> OwnStats:
        raise NotImplementedError

    # Batched kernels over sibling leaves of one class (a mixture's or an HMM's
    # components). The defaults loop; families override with matrix forms.
    @classmethod
    def _batch_log_density(cls, leaves: tuple["Leaf", ...], data: Data) -> np.ndarray:
        return np.stack([leaf._log_density(data) for leaf in leaves])

    @classmethod
    def _batch_accumulate(cls, leaves: tuple["Leaf", ...], data: Data, W: np.ndarray) -> list[OwnStats]:
        return [leaf._accumulate(data, w) for leaf, w in zip(leaves, W)]

    def to_spec(self) -> dict:
        out = {"family": self.family}
        for k, v in self.params().items():
            v = np.asarray(v)
            out[k] = v.tolist() if v.ndim else float(v)
        return out


class Internal(Node):
    """A node whose density combines its children's."""

    def _child_data(self, data: Data, i: int) -> Data:
        raise NotImplementedError

    def _combine(self, data: Data, child_lds) -> tuple[np.ndarray, object]:
        """Own log density per row from the children's; returns ``(ld, aux)`` for ``_split``."""
        raise NotImplementedError

    def _split(self, data: Data, w: np.ndarray, child_lds, ld: np.ndarray, aux) -> tuple[list, OwnStats]:
        """Row weights for each child and this node's own statistics."""
        raise NotImplementedError


# ---------------------------------------------------------------- validation helpers
def as_float_array(value, name: str, family: str, ndim: int) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ModelError(f"{family}.{name} must be numeric, got {value!r}") from None
    if arr.ndim != ndim:
        raise ModelError(f"{family}.{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ModelError(f"{family}.{name} must be finite, got {arr}")
    arr.setflags(write=False)
    return arr


def check_positive(arr: np.ndarray, name: str, family: str) -> None:
    if np.any(arr <= 0):
        raise ModelError(f"{family}.{name} must be > 0, got {arr.min() if arr.ndim else float(arr)}")


def check_probs(p: np.ndarray, name: str, family: str, axis: int = -1) -> None:
    if p.size == 0:
        raise ModelError(f"{family}.{name} must not be empty")
    if np.any(p < 0):
        raise ModelError(f"{family}.{name} must be >= 0, got {p.min()}")
    sums = p.sum(axis=axis)
    if not np.allclose(sums, 1.0, atol=1e-6):
        raise ModelError(f"{family}.{name} must sum to 1, got sum {np.round(sums, 6)}")


def float_column(data, where: str, family: str) -> np.ndarray:
    """A finite float64 column of shape (n,)."""
    if isinstance(data, (tuple, Ragged)):
        raise DataError(f"{where}: {family} expects a 1-D float array, got {type(data).__name__}")
    try:
        x = np.asarray(data)
        if x.dtype.kind not in "biufO":
            raise DataError(f"{where}: {family} expects real numbers, got dtype {x.dtype}")
        x = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{where}: {family} expects numbers, got {type(data).__name__}") from None
    if x.ndim != 1:
        raise DataError(f"{where}: {family} expects shape (n,), got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise DataError(f"{where}: {family} data holds NaN or inf (first at row {int(np.argmin(np.isfinite(x)))})")
    return x


def int_column(data, where: str, family: str) -> np.ndarray:
    """An int64 column of shape (n,); floats are accepted only when integral."""
    if isinstance(data, (tuple, Ragged)):
        raise DataError(f"{where}: {family} expects a 1-D integer array, got {type(data).__name__}")
    x = np.asarray(data)
    if x.dtype.kind == "f":
        if not np.all(np.isfinite(x)):
            raise DataError(f"{where}: {family} data holds NaN or inf")
        if np.any(x != np.round(x)):
            raise DataError(f"{where}: {family} expects integers, got non-integral values such as {x[x != np.round(x)][0]}")
        x = x.astype(np.int64)
    elif x.dtype.kind not in "iub":
        raise DataError(f"{where}: {family} expects integers, got dtype {x.dtype}")
    if x.ndim != 1:
        raise DataError(f"{where}: {family} expects shape (n,), got {x.shape}")
    return x.astype(np.int64, copy=False)


def spec_field(spec: dict, key: str, family: str):
    if key not in spec:
        raise SpecError(f"{family} spec is missing field {key!r}")
    return spec[key]


def spec_list(spec: dict, key: str, family: str) -> list:
    """A spec field that holds a list of child specs."""
    value = spec_field(spec, key, family)
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{family} spec field {key!r} must be a list of model specs, got {type(value).__name__}")
    return list(value)


def prepare_by_any(children: tuple[Node, ...], data, where: str) -> Data:
    """Data of a node whose children share one data type (a mixture's components, an HMM's
    emissions), prepared by the first child whose support holds every row.

    The node's support is the union of its children's, and same-type leaves have nested
    supports (``Categorical`` values ``0..V-1`` inside a ``Poisson``'s counts, an
    ``Exponential``'s ``x >= 0`` inside a ``Gaussian``'s reals), so the order of the
    children does not decide which data are accepted. When no child accepts the data, the
    first child's error is raised.
    """
    first_error = None
    for child in children:
        try:
            return child._prepare(data, where)
        except DataError as e:
            if first_error is None:
                first_error = e
    raise first_error
