"""The family contract: the hooks a family fills, and the tree-wide operations built on them.

A family declares its fields in ``schema`` (``models.schema``) and fills a few *own* hooks
(its work with children excluded); the recursive log density, statistics and M-step are the
engine's (``models.engine``), so that the same passes run on a whole tree in one process
and on one model shard of a grid. The hooks, when the engine calls them and what they
return are listed on :class:`Node`, :class:`Leaf` and :class:`Internal`.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import numpy as np

from . import engine
from . import latent as latent_labels
from .cost import BatchCost, NodeCost
from .data import Data, n_rows
from .errors import DataError, ModelError, SpecError
from .estimate import estimate_tree
from .schema import (Children, Field, Meta, Param, Size, arrays_kept, check_spec_size, spec_field, spec_list,
                     spec_repeat)
from .stats import OwnStats, Stats
from .support import Support
from .tables import is_table, read_table
from .answers import Answering
from .template import Templated
from .tree import batch_class, child_path

__all__ = ["FAMILIES", "Node", "Leaf", "Internal", "from_spec", "child_path", "batch_class"]

#: Every family by name (filled as family classes are defined): what specs name.
FAMILIES: dict[str, type["Node"]] = {}


class Node(Templated, Answering):
    """A node of a model tree.

    A family subclasses :class:`Leaf` or :class:`Internal`, sets ``family`` and ``schema``,
    and fills the hooks below. Every hook receives data already in the canonical encoding
    (``models.data``) and returns new objects; nodes are immutable.

    ============================================  ================================  =================================
    hook (every family)                           called                            returns
    ============================================  ================================  =================================
    ``__init__(**fields)``                        by users and ``from_spec``        calls ``_init_fields`` (checks)
    ``data_type() -> str``                        on construction of a parent      a signature of the data it reads
    ``_prepare(data, where) -> Data``             once per ``prepare``              the canonical encoding, checked
    ``_estimate(own, children) -> Node``          M-step, children already fitted   a new node
    ``_sample(n, rng) -> Data``                   ``sample``                        ``n`` rows
    ``cost() -> NodeCost``                        ``models.cost.tree_costs``        own per-row cost
    ``describe() -> str``                         plans, errors                     a short name (default: family)
    ``child_rows(i) -> float``                    costs                             rows of child ``i`` per row (1)
    ``child_data_shares() -> ndarray``            costs (``shares_child_data``)     each child's share of the rows
    ``_regularize(own, reg) -> own``              ``models.regularize``             pseudo-statistics added (none)
    ``_fit_warnings(at, rows) -> list[str]``      ``models.diagnose``               lines about its fit (none)
    ``rows_needed() -> int``                      ``models.init`` (k-means parts)   rows its M-step needs (1)
    ============================================  ================================  =================================

    Everything a family changes lives in its class: the hooks above, and on :class:`Leaf`
    its support, its table reading and its test oracle. Defining the class (with
    ``family`` set) registers it in :data:`FAMILIES`, which specs, the facade
    (``from emgrid import <family>``) and the test strategies read.

    The fields, their checks, ``params``, ``to_spec``, ``from_spec`` and ``n_parameters`` come
    from ``schema`` (see ``models.schema``). A parameter given as ``None`` is unset and the
    node a *template* (``is_template``, ``unset_fields``): it plans, prepares data and
    round-trips through specs, but ``log_density``, ``accumulate``, ``estimate`` and
    ``sample`` raise a ModelError naming the unset field until ``models.init`` fills it.
    A family whose data is ragged (``reads_ragged``) has a ``mean_length`` and takes
    ``cost(length=...)`` for the mean length its data has.
    """

    family: ClassVar[str] = ""
    #: the family's fields in spec order (numeric parameters and children)
    schema: ClassVar[tuple[Field, ...]] = ()
    #: the names of ``schema``'s fields (set from it)
    spec_fields: ClassVar[tuple[str, ...]] = ()
    #: whether ``_distribute`` returns statistics of its own (a composite has none)
    has_own_stats: ClassVar[bool] = True
    #: whether every child reads this node's data column (a mixture's components)
    shares_child_data: ClassVar[bool] = False
    #: its data is a ``Ragged`` of its children's rows, ``mean_length`` of them per row on
    #: average (a sequence, an HMM)
    reads_ragged: ClassVar[bool] = False
    #: spec shorthand for many copies of one child template: ``(count key, child key)``,
    #: e.g. ``("k", "component")`` for ``{"family": "Mixture", "k": 8, "component": {...}}``
    repeat: ClassVar[tuple[str, str] | None] = None
    children: tuple["Node", ...] = ()
    _sizes: dict = {}
    _unset: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls.spec_fields = tuple(f.name for f in cls.schema)
        if cls.family:
            FAMILIES[cls.family] = cls

    def _init_fields(self, **values) -> dict[str, np.ndarray]:
        """Checks ``values`` against ``schema`` in its order and sets them: each parameter as
        a read-only float64 array attribute of its name (None when unset), the children as
        ``children``, the :class:`Size` fields in ``_sizes``. Returns the checks' by-products
        by field name (the Cholesky factor of a covariance)."""
        fields: dict[str, np.ndarray | None] = {}
        extras: dict[str, np.ndarray] = {}
        sizes = {f.name: f.check(values.get(f.name), self.family) for f in self.schema if isinstance(f, Size)}
        unset = []
        for f in self.schema:
            if isinstance(f, Children):
                self.children = f.check(values[f.name], self.family, Node)
                continue
            if isinstance(f, Size):
                continue
            if isinstance(f, Meta):
                setattr(self, f.name, values.get(f.name))
                continue
            value = values.get(f.name)
            if value is None:
                fields[f.name] = None
                setattr(self, f.name, None)
                unset.append(f.name)
                continue
            arr, extra = f.check(value, self.family, fields, len(self.children), sizes)
            fields[f.name] = arr
            setattr(self, f.name, arr)
            if extra is not None:
                extras[f.name] = extra
        for f in self.schema:
            if isinstance(f, Size) and sizes[f.name] is None and not f.from_data and not f.waits(values):
                raise ModelError(f"{self.family} template needs {f.name}=<int> (the size of its data), "
                                 f"since {f.of} is unset; got {f.name}=None")
        self._sizes = sizes
        self._unset = tuple(unset)
        return extras

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
        """Converts user data to the canonical encoding and checks it; raises DataError.

        A table (``models.tables``: a DataFrame, a pyarrow Table, a dict of columns, a
        ``.parquet`` or ``.csv`` path, a ``Table``) is read by column name first."""
        if is_table(data):
            data = read_table(self, data)
        data = self._prepare(data, "data")
        if n_rows(data) == 0:
            raise DataError("data has no rows; at least one row is required")
        return data

    def _prepare(self, data, where: str) -> Data:
        """The canonical encoding of ``data``; errors name ``where`` (e.g. ``data[0].values``)."""
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
        self.require_complete("compute the log density of")
        return engine.log_density(self, self.prepare(data))

    def accumulate(self, data, weights=None) -> Stats:
        """Additive sufficient statistics of (weighted) rows, keyed by node path."""
        self.require_complete("accumulate statistics of")
        data = self.prepare(data)
        return engine.accumulate(self, data, self.prepare_weights(weights, n_rows(data)))

    def estimate(self, stats: Stats, path: str = "") -> "Node":
        """The M-step: a new node fitted to ``stats`` (as returned by ``accumulate``), by the
        one recursion of ``models.estimate``."""
        if not path:
            self.require_complete("estimate")
        return estimate_tree(self, stats, path)

    def sample(self, n: int, rng: np.random.Generator | int | None = None, *, latent: bool = False):
        """``n`` rows drawn from the model, in the canonical encoding; with ``latent``,
        ``(rows, labels)``: the same rows and, by path of every Mixture and HMM, the child
        that generated each row (``models.latent``)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ModelError(f"sample n must be an integer >= 0, got {n!r}")
        self.require_complete("sample from", density=False)
        rng = np.random.default_rng(rng)
        if latent:
            return latent_labels.sample_latent(self, int(n), rng)
        return self._sample(int(n), rng)

    def cost(self) -> NodeCost:
        """This node's own per-row cost (children excluded)."""
        raise NotImplementedError

    def params(self) -> dict[str, np.ndarray]:
        """The node's own parameters as arrays, in schema order (their nbytes are ``param_bytes``).

        An unset parameter of a template is a read-only NaN array of the shape the schema
        gives it (what the planner's fingerprint and byte counts read)."""
        fields = {f.name: getattr(self, f.name) for f in self.schema if isinstance(f, Param)}
        out = {}
        for f in self.schema:
            if not isinstance(f, Param):
                continue
            value = fields[f.name]
            if value is None:
                shape = f.shape_from(fields, len(self.children), self._sizes)
                if shape is None:
                    size = next((s.name for s in self.schema if isinstance(s, Size) and self._sizes.get(s.name) is None),
                                f.name)
                    raise ModelError(f"{self.family}.{size} is unset, so {f.name}'s shape is unknown; "
                                     f"models.complete_shapes(model, data) takes it from the data")
                value = np.broadcast_to(np.float64(np.nan), shape)
            out[f.name] = value
        return out

    def own_n_parameters(self) -> int:
        """Free parameters of this node's own density (children excluded)."""
        values = self.params()
        return sum(f.n_free(values[f.name]) for f in self.schema if isinstance(f, Param))

    def n_parameters(self) -> int:
        """Free parameters of the whole tree (the ``p`` of ``bic`` and ``aic``): each
        parameter's entries, a simplex of ``V`` entries as ``V - 1`` and a ``d x d``
        covariance as ``d (d + 1) / 2`` (``models.schema.Param.n_free``); a sequence's
        ``mean_length`` is not one. The counts equal scikit-learn's ``_n_parameters`` for its
        mixtures and hmmlearn's ``_get_n_fit_scalars_per_param`` for its HMMs (``K - 1``
        initial and ``K (K - 1)`` transition probabilities, plus the emissions')."""
        return sum(node.own_n_parameters() for _, node in self.nodes())

    def to_spec(self) -> dict:
        """A JSON-ready dict: ``{"family": ..., <fields in schema order>...}``.

        A template leaves its unset parameters out and states the sizes they would have
        (``dim``); a template whose children are copies of one template uses the
        ``repeat`` shorthand. A complete model's spec holds every parameter and no size."""
        out: dict = {"family": self.family}
        for f in self.schema:
            if isinstance(f, Children):
                specs = [c.to_spec() for c in self.children]
                if f.many and self._repeats(specs):
                    out[self.repeat[0]] = len(specs)
                    out[self.repeat[1]] = specs[0]
                else:
                    out[f.name] = specs if f.many else specs[0]
            elif isinstance(f, Size):
                if getattr(self, f.of) is None and self._sizes.get(f.name) is not None:
                    out[f.name] = self._sizes[f.name]
            elif getattr(self, f.name) is not None:
                out[f.name] = f.to_json(getattr(self, f.name))
        return out

    def _repeats(self, specs: list[dict]) -> bool:
        """Whether ``specs`` are copies of one template spec (written as the shorthand)."""
        return (self.repeat is not None and len(specs) > 1 and self.children[0].is_template
                and all(s == specs[0] for s in specs[1:]))

    @classmethod
    def _from_spec(cls, spec: dict) -> "Node":
        """The node a spec describes (its fields checked against ``schema`` by ``from_spec``);
        an omitted parameter is unset unless the schema gives a default."""
        values = {}
        for f in cls.schema:
            if isinstance(f, Children):
                if f.many and cls.repeat is not None and (cls.repeat[0] in spec or cls.repeat[1] in spec):
                    if f.name in spec:
                        raise SpecError(f"{cls.family} spec gives both {f.name!r} and the shorthand "
                                        f"{cls.repeat[0]!r}/{cls.repeat[1]!r}; give one")
                    values[f.name] = [from_spec(c) for c in spec_repeat(spec, *cls.repeat, cls.family)]
                else:
                    values[f.name] = ([from_spec(c) for c in spec_list(spec, f.name, cls.family)] if f.many
                                      else from_spec(spec_field(spec, f.name, cls.family)))
            else:
                values[f.name] = spec.get(f.name, getattr(f, "default", None))
        return cls(**values)

    @staticmethod
    def from_spec(spec: dict) -> "Node":
        return from_spec(spec)

    def copy(self) -> "Node":
        return from_spec(self.to_spec())

    def __reduce__(self):
        # the fields only: the kernels' caches (a categorical's log-probabilities, a
        # covariance's Cholesky factor) are rebuilt by the constructor on arrival, so a model
        # crosses the wire at the size of its parameters (and rebuilt, equals itself bitwise)
        return (_rebuild, (type(self), self._fields()))

    def __copy__(self):
        # a shallow copy shares everything, caches included (``models.shard.with_children``)
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def _fields(self) -> dict:
        """The constructor's arguments that give this node again (``with_fields``' base)."""
        current: dict = {}
        for f in self.schema:
            if isinstance(f, Children):
                current[f.name] = list(self.children) if f.many else self.children[0]
            elif isinstance(f, Size):
                current[f.name] = self._sizes.get(f.name)
            else:
                current[f.name] = getattr(self, f.name)
        return current

    def __repr__(self) -> str:
        return f"{self.family}(...)" if self.children else f"{self.family}({self._param_repr()})"

    def _param_repr(self) -> str:
        parts = [f"{k}={self._sizes[k]}" for k in self._sizes if self._sizes[k] is not None and self._unset]
        for f in self.schema:
            if isinstance(f, Param):
                v = getattr(self, f.name)
                parts.append(f"{f.name}=unset" if v is None
                             else f"{f.name}={np.array2string(np.asarray(v), precision=3, threshold=6)}")
        return ", ".join(parts)

    def describe(self) -> str:
        """A short human name used in plans and errors, e.g. ``FullGaussian d=400``."""
        return self.family

    # ---------------------------------------------------------------- own hooks
    def _sample(self, n: int, rng: np.random.Generator) -> Data:
        """``n`` rows drawn from this node (children sample through their own ``_sample``)."""
        raise NotImplementedError

    def _estimate(self, own: OwnStats, children: tuple["Node", ...]) -> "Node":
        """A new node from its own statistics (``()`` without ``has_own_stats``) and its
        children already fitted."""
        raise NotImplementedError

    def _regularize(self, own: OwnStats, reg) -> OwnStats:
        """``own`` with the pseudo-statistics of ``reg`` (a ``models.regularize.Regularization``:
        ``reg_covar`` for a variance, ``pseudo_count`` for every count behind a probability)
        that this family takes, or ``own`` itself when none applies (the default). Called on
        the reduced statistics before the M-step, so every executor regularizes alike."""
        return own

    def _fit_warnings(self, at: str, rows) -> list[str]:
        """Lines about what this fitted node says of its own fit (a collapsed component, a
        variance held at its floor), each starting with ``at`` (e.g. ``"Mixture at path '0'"``);
        none by default. ``rows`` is None, or a function that returns the prepared rows this
        node was fitted to (its subtree's data), for a line that names the cause they show."""
        return []

    def rows_needed(self) -> int:
        """Rows this node's first M-step needs to be well posed: initialization draws
        k-means partitions again while a part holds fewer (``models.init``). 1 by default; a
        variance needs 2 and a ``d x d`` covariance ``d + 1`` (fewer span no volume: the
        start would be singular); a node whose children read its rows (a record, a mixture)
        needs what its neediest child needs."""
        return 1


def _rebuild(cls, fields: dict) -> Node:
    # the arrays are the unpickled copies (or, from ``copy.deepcopy``, fresh ones) that
    # nothing else holds: the constructor keeps them instead of copying each
    with arrays_kept():
        return cls(**fields)


#: The deepest nesting of nodes a spec may have (a model's recursion runs that deep in every
#: pass; real models nest a few levels). Deeper specs are refused before anything is built.
MAX_SPEC_DEPTH = 100
_building = threading.local()


def spec_depth(spec, limit: int | None = None) -> int:
    """Levels of nested mappings in a spec (the root is 1), counted without recursion. A
    sub-spec met again (a dict shared in a Python spec) is walked again only when met deeper,
    and the walk stops once it passes ``limit``, so a shared or cyclic spec ends quickly."""
    deepest, todo, seen = 0, [(spec, 0)], {}
    while todo:
        obj, depth = todo.pop()
        if seen.get(id(obj), -1) >= depth:
            continue
        seen[id(obj)] = depth
        if isinstance(obj, dict):
            depth += 1
            deepest = max(deepest, depth)
            if limit is not None and deepest > limit:
                return deepest
            todo.extend((v, depth) for v in obj.values() if isinstance(v, (dict, list, tuple)))
        elif isinstance(obj, (list, tuple)):
            todo.extend((v, depth) for v in obj if isinstance(v, (dict, list, tuple)))
    return deepest


def from_spec(spec) -> Node:
    """Builds a model from a spec dict (as ``to_spec`` writes); raises SpecError or ModelError.

    A spec nested deeper than :data:`MAX_SPEC_DEPTH`, or describing more nodes than
    ``models.schema.MAX_SPEC_NODES``, is refused (SpecError) before any node is built."""
    if isinstance(spec, Node):
        return spec
    if getattr(_building, "depth_checked", False):
        return _from_spec(spec)
    depth = spec_depth(spec, MAX_SPEC_DEPTH)
    if depth > MAX_SPEC_DEPTH:
        raise SpecError(f"model spec is nested more than {MAX_SPEC_DEPTH} levels deep (the limit)")
    check_spec_size(spec, lambda family: getattr(FAMILIES.get(family), "repeat", None))
    _building.depth_checked = True
    try:
        return _from_spec(spec)
    finally:
        _building.depth_checked = False


def _from_spec(spec) -> Node:
    if not isinstance(spec, dict):
        raise SpecError(f"a model spec must be a mapping with a 'family' key, got {type(spec).__name__}")
    family = spec.get("family")
    if family is None:
        raise SpecError(f"model spec is missing field 'family' (keys: {sorted(spec)})")
    cls = FAMILIES.get(family)
    if cls is None:
        raise SpecError(f"unknown model family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    unknown = sorted(set(spec) - {"family", *cls.spec_fields, *(cls.repeat or ())})
    if unknown:
        raise SpecError(f"{family} spec has unknown field(s) {unknown}; allowed: {list(cls.spec_fields)}")
    return cls._from_spec(spec)


class Leaf(Node):
    """A node with data of its own and no children.

    ===================================================  ============================  ==============================
    hook                                                 called                        returns
    ===================================================  ============================  ==============================
    ``_log_density(data)``                               upward pass, alone            ``(n,)`` log densities
    ``_accumulate(data, w)``                             downward pass, alone          own statistics (a tuple)
    ``batch_prepare(leaves, data)``  (classmethod)       upward pass, sibling batch    ``work`` shared by both passes
    ``batch_log_density(leaves, data, work, offsets)``   upward pass, sibling batch    ``(K, n)``, a fresh array
    ``batch_accumulate(leaves, data, W, work)``          downward pass, sibling batch  one own-statistics per leaf
    ``batch_cost(leaves)``                               ``tree_costs``                ``BatchCost`` or None
    ===================================================  ============================  ==============================

    A *sibling batch* is every child of a parent whose children share one data column and
    are leaves of one class (``models.tree.batch_class``): a mixture's components, an HMM's
    emissions. The defaults run the per-leaf hooks one leaf at a time; a family overrides
    them with matrix forms that give the same numbers.

    Every kernel above sees only rows inside the leaf's :attr:`support`: the engine applies
    the support rule once for every family (``models.support``). More hooks of a leaf:

    ===================================================  ==============================  ============================
    hook                                                 called                          returns
    ===================================================  ==============================  ============================
    ``support`` (property)                               both passes, every block        ``Support`` or None (all)
    ``value_coded`` (class attribute)                    ``models.tables``               reads through ``values``
    ``_bind_values(values, column, at)``                 ``models.tables.bind``          the leaf bound to a column
    ``_sizes_from_data(data, at)``                       ``init.complete_shapes``        sizes the data decide
    ``strategy(st, like)`` (classmethod, tests)          ``tests/strategies.py``         a hypothesis strategy
    ``oracle_log_density(x)`` (tests)                    ``tests/models/test_oracles``   an independent density
    ``oracle_estimate(x, w)`` (tests)                    ``tests/models/test_oracles``   the weighted MLE's params
    ===================================================  ==============================  ============================
    """

    #: ``batch_log_density`` adds the parent's per-child log offsets inside its own product
    #: (where they cost nothing); the engine then passes them and the parent combines
    #: shifted log densities. Only kernels that build a shared block (``batch_cost`` not
    #: None) do so; the others receive ``offsets=None`` and the parent adds them itself.
    batch_takes_offsets: ClassVar[bool] = False
    #: Its batched kernels keep float32 data in float32 (``optimize(..., dtype="float32")``):
    #: log densities and the row weights they receive back stay float32, and their
    #: statistics come back float64. Other families' kernels receive float64 row weights
    #: (their log densities promote to float64 wherever a float64 parameter enters).
    float32_kernels: ClassVar[bool] = False
    #: What the plan counts of its own FLOPs and block bytes in float32, as a share of
    #: float64's: 1.0 unless its kernels always run in float32 (a kernel that may widen a
    #: block to float64 is planned as float64, so no worker's memory is under-counted).
    float32_share: ClassVar[float] = 1.0

    #: whether its table column holds values of any type (strings, integers, booleans) that
    #: its ``values`` field (a ``Meta``, in code order) encodes as the codes it reads: a
    #: table's column is read through that list (``models.tables``, kind ``"cat"``), and a
    #: fit from a table sets it from the column (:meth:`_bind_values`)
    value_coded: ClassVar[bool] = False

    @property
    def support(self) -> Support | None:
        """The values this leaf's density is positive on: an ``Interval`` (or any
        ``models.support.Support``), or None for every value of its data type (the default).

        A leaf receives rows outside it as rows of a mixture or an HMM whose other children
        accept them (``models.columns.prepare_by_any``). The engine then gives those rows
        log density -inf and weight 0 for this leaf, for every family alike
        (``models.support``): the kernels below see only rows inside, each row outside
        replaced by a value inside (with weight exactly 0)."""
        return None

    def _log_density(self, data: Data) -> np.ndarray:
        raise NotImplementedError

    def _accumulate(self, data: Data, w: np.ndarray) -> OwnStats:
        raise NotImplementedError

    def _bind_values(self, values: list, column: str, at: str) -> "Leaf":
        """A ``value_coded`` leaf bound to a table column: ``values`` are the column's distinct
        values in code order (``models.columns.value_list``); ``at`` names the leaf in errors."""
        raise NotImplementedError

    def _sizes_from_data(self, data: Data, at: str) -> dict[str, int]:
        """The unset sizes that the data decide (its ``Size`` fields with ``from_data``), read
        from its prepared column, which may be memory-mapped (read it in chunks); ``at``
        names the leaf in errors. None by default (an empty dict)."""
        return {}

    # ---------------------------------------------------------------- test hooks
    # What the tests read (tests/strategies.py, tests/models/test_oracles.py), beside the
    # family so that adding a family needs nothing but its module.
    @classmethod
    def strategy(cls, st, like: "Leaf | None" = None):
        """A hypothesis strategy of leaves of this family with valid, random parameters and
        small sizes; with ``like``, of ``like``'s sizes (its dimension, its number of values).
        ``st`` is ``hypothesis.strategies`` (so that this module never imports hypothesis)."""
        raise NotImplementedError(f"{cls.family} defines no strategy(st, like) for the tests' strategies")

    def oracle_log_density(self, x: Data) -> np.ndarray:
        """An independent log density of every row (a closed form written plainly, for the
        tests to compare the kernels with), -inf outside the support."""
        raise NotImplementedError(f"{self.family} defines no oracle_log_density(x) for the oracle tests")

    def oracle_estimate(self, x: Data, w: np.ndarray) -> dict[str, np.ndarray]:
        """The weighted maximum-likelihood parameters of rows ``x`` (inside the support) under
        row weights ``w``, by name as ``params()`` gives them, in a closed form written plainly
        (what ``estimate(accumulate(x, w))`` must give where no floor binds)."""
        raise NotImplementedError(f"{self.family} defines no oracle_estimate(x, w) for the oracle tests")

    @classmethod
    def batch_prepare(cls, leaves: tuple["Leaf", ...], data: Data):
        """The work both passes of a sibling batch share (a feature block and the stacked
        parameters), built once per row block; None when there is none."""
        return None

    @classmethod
    def batch_log_density(cls, leaves: tuple["Leaf", ...], data: Data, work, offsets: np.ndarray | None) -> np.ndarray:
        """Log densities of every leaf, ``(K, n)``, a fresh array; plus ``offsets[k]`` in row
        ``k`` when given (only to kernels with ``batch_takes_offsets``)."""
        return np.stack([leaf._log_density(data) for leaf in leaves])

    @classmethod
    def batch_accumulate(cls, leaves: tuple["Leaf", ...], data: Data, W: np.ndarray, work) -> list[OwnStats]:
        """Each leaf's own statistics under its row weights ``W[k]``."""
        return [leaf._accumulate(data, w) for leaf, w in zip(leaves, W)]

    @classmethod
    def batch_cost(cls, leaves: tuple["Leaf", ...]) -> BatchCost | None:
        """The cost of a batch that builds a shared block, per row of the leaves' data; None
        when the batch costs what its leaves cost alone."""
        return None


class Internal(Node):
    """A node whose density combines its children's.

    ==============================================  ================================  ===============================
    hook                                            called                            returns
    ==============================================  ================================  ===============================
    ``_child_data(data, i)``                        both passes, per child            the data child ``i`` reads
    ``child_log_offsets()``                         upward pass, before a batch       ``(K,)`` offsets or None
    ``_combine(data, child_lds, shifted)``          upward pass, children evaluated   ``(ld, aux)``
    ``_distribute(data, w, child_lds, ld, aux)``    downward pass                     ``(child_ws, own)``
    ==============================================  ================================  ===============================
    """

    def _child_data(self, data: Data, i: int) -> Data:
        """The data child ``i`` reads: a field of a record, a sequence's positions, or this
        node's data itself (``shares_child_data``)."""
        raise NotImplementedError

    def child_log_offsets(self) -> np.ndarray | None:
        """Per-child constants the node adds to its children's log densities (a mixture's log
        weights), which a batched kernel with ``batch_takes_offsets`` adds inside its own
        product instead; None when there are none (or one is not finite)."""
        return None

    def _combine(self, data: Data, child_lds, shifted: bool) -> tuple[np.ndarray, object]:
        """Own log density per row from the children's: ``child_lds`` is a list of ``(n_i,)``
        arrays, or a batched kernel's ``(K, n)`` array (``shifted``: with
        ``child_log_offsets()`` already added). Returns ``(ld, aux)``; ``aux`` goes to
        ``_distribute``."""
        raise NotImplementedError

    def _distribute(self, data: Data, w: np.ndarray, child_lds, ld: np.ndarray, aux) -> tuple[list, OwnStats]:
        """Row weights for each child (a list, or a ``(K, n)`` array) and this node's own
        statistics, from its row weights ``w`` and the upward pass's results."""
        raise NotImplementedError
