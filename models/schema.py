"""Parameter schemas: what a family's fields are, from which its checks, parameters, specs
and parameter count follow.

A family lists its fields in ``schema``, in spec order: :class:`Param` for a numeric
parameter, :class:`Children` for its child nodes, :class:`Size` for a size a template states
because its data cannot (a vector leaf's ``dim``), :class:`Meta` for names and encodings
(a record's field names, a categorical's values). ``Node._init_fields`` checks the values
given to a constructor against it and sets them; ``params()``, ``to_spec()``,
``from_spec()`` and ``n_parameters()`` read it.

Any parameter may be left unset (``None``): the node is then a *template*, whose unset
fields the fit fills from the data (``models.init``). An unset parameter's shape still
follows from the schema (the number of children, a :class:`Size`), so a template's cost is
known before its values are.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .errors import ModelError, SpecError

#: Constraint kinds of a :class:`Param`.
REAL = "real"  # any finite value
POSITIVE = "positive"  # every entry > 0
SIMPLEX = "simplex"  # entries >= 0 summing to 1 along ``axis``
SPD = "spd"  # a symmetric positive definite matrix (its Cholesky factor is kept)


@dataclass(frozen=True)
class Param:
    """One numeric parameter of a family.

    ``shape`` fixes the parameter's shape: each entry is ``"K"`` (the number of children),
    the name of a :class:`Size` field (given, or taken from the first parameter that has
    it), or the name of an earlier 1-D parameter (its size); ``like`` names an earlier
    parameter whose shape it shares. A dimension of 0 is rejected. ``free`` says
    whether the parameter is a free parameter of the density (a sequence's ``mean_length``
    is not: lengths are given). ``default``, when set, is used where a spec omits the field.
    """

    name: str
    ndim: int
    kind: str = REAL
    shape: tuple[str, ...] | None = None
    like: str | None = None
    axis: int = -1
    free: bool = True
    default: float | None = None

    def check(self, value, family: str, fields: dict, n_children: int, sizes: dict | None = None):
        """The value as a read-only float64 array, checked; returns ``(array, by-product)``
        where the by-product is the Cholesky factor of an ``SPD`` parameter, else None.
        ``sizes`` holds the :class:`Size` fields known so far; those this value decides
        (unknown until now) are set in it."""
        sizes = {} if sizes is None else sizes
        arr = as_float_array(value, self.name, family, self.ndim)
        if self.like is not None:
            ref = fields[self.like]
            if ref is not None and (arr.shape != ref.shape or ref.size == 0):
                raise ModelError(f"{family}.{self.name} must have the shape of {self.like} {ref.shape}, got {arr.shape}")
        if self.shape is not None:
            for i, s in enumerate(self.shape):
                if s in sizes and sizes[s] is None:
                    sizes[s] = int(arr.shape[i])
            want = self.shape_from(fields, n_children, sizes)
            if 0 in want:
                raise ModelError(f"{family}.{self.name} must not be empty, got shape {arr.shape}")
            if arr.shape != want:
                raise ModelError(f"{family}.{self.name} must have shape {want}, got {arr.shape}")
        extra = None
        if self.kind == POSITIVE:
            check_positive(arr, self.name, family)
        elif self.kind == SIMPLEX:
            check_probs(arr, self.name, family, axis=self.axis)
        elif self.kind == SPD:
            extra = check_spd(arr, self.name, family)
        return arr, extra

    def shape_from(self, fields: dict, n_children: int, sizes: dict) -> tuple[int, ...] | None:
        """The shape the schema gives this parameter (None where a size is not known yet)."""
        if self.ndim == 0:
            return ()
        if self.like is not None:
            ref = fields.get(self.like)
            return None if ref is None else ref.shape
        if self.shape is None:
            return None
        out = []
        for s in self.shape:
            if s == "K":
                out.append(n_children)
            elif s in sizes:
                if sizes[s] is None:
                    return None
                out.append(int(sizes[s]))
            elif fields.get(s) is not None:
                out.append(int(fields[s].size))
            else:
                return None
        return tuple(out)

    def n_free(self, arr: np.ndarray) -> int:
        """Free parameters this value holds: a simplex of size V counts V - 1, a ``d x d``
        covariance ``d (d + 1) / 2``, a parameter that is not ``free`` 0."""
        if not self.free:
            return 0
        if self.kind == SIMPLEX:
            return int(arr.size - arr.size // arr.shape[self.axis]) if arr.size else 0
        if self.kind == SPD:
            d = arr.shape[0]
            return d * (d + 1) // 2
        return int(arr.size)

    def to_json(self, arr: np.ndarray):
        return arr.tolist() if arr.ndim else float(arr)


@dataclass(frozen=True)
class Children:
    """The child nodes of a family: ``many`` (a list, at least one) or one child.

    ``noun`` names one child in errors; with ``same_type`` every child must read the same
    data type (a mixture's components, an HMM's emissions).
    """

    name: str
    many: bool = True
    noun: str = "node"
    same_type: bool = False

    def check(self, value, family: str, node_type: type) -> tuple:
        """The children as a tuple of nodes, checked."""
        if not self.many:
            if not isinstance(value, node_type):
                raise ModelError(f"{family}.{self.name} must be a model node, got {type(value).__name__}")
            return (value,)
        children = tuple(value)
        if not children:
            raise ModelError(f"{family}.{self.name} must hold at least one {self.noun}, got 0")
        for i, c in enumerate(children):
            if not isinstance(c, node_type):
                raise ModelError(f"{family}.{self.name}[{i}] must be a model node, got {type(c).__name__}")
        if self.same_type:
            check_same_type(children, family, self.name)
        return children


@dataclass(frozen=True)
class Size:
    """A size a template states because its data cannot, e.g. a vector leaf's ``dim``.

    It is a constructor keyword and a spec field of templates only: with ``of`` given, the
    size is ``of``'s (they must agree), and a complete node's spec leaves it out. ``None``
    means the data decide it (``models.init.complete_shapes``), when ``from_data``, or the
    table's columns, while the field ``by`` holds a pattern of column names (a string, such
    as a vector leaf's ``columns="*"``: ``models.tables.bind`` resolves it).
    """

    name: str
    of: str
    from_data: bool = False
    by: str | None = None

    def waits(self, values: dict) -> bool:
        """Whether the size may stay unset: the field ``by`` holds a pattern still to resolve."""
        return self.by is not None and isinstance(values.get(self.by), str)

    def check(self, value, family: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ModelError(f"{family}.{self.name} must be an integer >= 1, got {value!r}")
        return int(value)


@dataclass(frozen=True)
class Meta:
    """A field that is no number to fit and no size: names and encodings a node keeps as
    given, such as a record's field names or a categorical's values in code order.

    The family checks its value in its constructor; it is written to specs when set (a
    JSON list or mapping) and left out when None.
    """

    name: str

    def to_json(self, value):
        """The value with tuples as lists, as a spec file holds it."""
        if isinstance(value, (tuple, list)):
            return [self.to_json(v) for v in value]
        if isinstance(value, dict):
            return {k: self.to_json(v) for k, v in value.items()}
        return value


Field = Param | Children | Size | Meta


# ---------------------------------------------------------------- value checks
def frozen(arr: np.ndarray) -> np.ndarray:
    """``arr`` made read-only, for a constructor to keep without a copy: only for an array
    that nothing else holds (a fresh result, an unpickled field), see :func:`as_float_array`."""
    arr.setflags(write=False)
    return arr


_KEPT = threading.local()


@contextmanager
def arrays_kept():
    """Within it, constructors keep the float64 arrays they are given (frozen) instead of
    copying them: for arrays nothing else holds, such as a node's unpickled fields."""
    before = getattr(_KEPT, "on", False)
    _KEPT.on = True
    try:
        yield
    finally:
        _KEPT.on = before


def as_float_array(value, name: str, family: str, ndim: int) -> np.ndarray:
    """A checked read-only float64 copy of ``value``. Kept as it is, frozen: a read-only
    float64 array that owns its data (:func:`frozen`: no one can write to it), and under
    :func:`arrays_kept` any float64 array."""
    if isinstance(value, np.ndarray) and value.dtype == np.float64 and value.ndim == ndim and (
            getattr(_KEPT, "on", False) or (not value.flags.writeable and value.flags.owndata)):
        if not np.isfinite(value).all():
            raise ModelError(f"{family}.{name} must be finite, got {value}")
        return frozen(value)
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ModelError(f"{family}.{name} must be numeric, got {value!r}") from None
    if arr.ndim != ndim:
        raise ModelError(f"{family}.{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ModelError(f"{family}.{name} must be finite, got {arr}")
    arr.setflags(write=False)
    return arr


def check_positive(arr: np.ndarray, name: str, family: str) -> None:
    if (arr <= 0).any():
        raise ModelError(f"{family}.{name} must be > 0, got {arr.min() if arr.ndim else float(arr)}")


def check_probs(p: np.ndarray, name: str, family: str, axis: int = -1) -> None:
    if p.size == 0:
        raise ModelError(f"{family}.{name} must not be empty")
    low = p.min()
    if low < 0:
        raise ModelError(f"{family}.{name} must be >= 0, got {low}")
    sums = p.sum(axis=axis)
    if not (np.abs(sums - 1.0) <= 1e-6 + 1e-5).all():  # np.allclose(sums, 1, atol=1e-6) for finite sums
        raise ModelError(f"{family}.{name} must sum to 1, got sum {np.round(sums, 6)}")


def check_spd(a: np.ndarray, name: str, family: str) -> np.ndarray:
    """Checks a symmetric positive definite matrix; returns its lower Cholesky factor."""
    # exactly symmetric (every fitted covariance), else np.allclose(a, a.T, rtol=1e-8, atol=1e-12)
    if not (a == a.T).all() and not (np.abs(a - a.T) <= 1e-12 + 1e-8 * np.abs(a.T)).all():
        raise ModelError(f"{family}.{name} must be symmetric")
    try:
        return np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        raise ModelError(f"{family}.{name} must be positive definite (smallest eigenvalue {np.linalg.eigvalsh(a).min():.3g})") from None


def check_same_type(children, family: str, field: str) -> None:
    types = [c.data_type() for c in children]
    for i, t in enumerate(types[1:], 1):
        if t != types[0]:
            raise ModelError(
                f"{family}.{field} must share one data type; {field}[0] reads {types[0]}, {field}[{i}] reads {t}"
            )


# ---------------------------------------------------------------- spec fields
def spec_field(spec: dict, key: str, family: str):
    if key not in spec:
        raise SpecError(f"{family} spec is missing field {key!r}")
    return spec[key]


def spec_repeat(spec: dict, count_key: str, child_key: str, family: str) -> list:
    """The child specs of the shorthand ``{count_key: K, child_key: spec}``: K copies of one
    child spec (``{"family": "Mixture", "k": 8, "component": {...}}``)."""
    if count_key not in spec or child_key not in spec:
        missing = count_key if count_key not in spec else child_key
        raise SpecError(f"{family} spec shorthand needs both {count_key!r} and {child_key!r}; {missing!r} is missing")
    k = spec[count_key]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SpecError(f"{family} spec field {count_key!r} must be an integer >= 1, got {k!r}")
    child = spec[child_key]
    if not isinstance(child, dict):
        raise SpecError(f"{family} spec field {child_key!r} must be one model spec, got {type(child).__name__}")
    return [child] * k


def spec_list(spec: dict, key: str, family: str) -> list:
    """A spec field that holds a list of child specs."""
    value = spec_field(spec, key, family)
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{family} spec field {key!r} must be a list of model specs, got {type(value).__name__}")
    return list(value)


#: The most nodes a spec may describe. They are counted from the spec before anything is
#: built (each ``k`` shorthand multiplies its component's count): a mixture of 100,000
#: components takes about 0.5 s to build and 10 s to plan on this machine, and every later
#: pass walks each node.
MAX_SPEC_NODES = 100_000


def spec_node_count(spec, repeat_of) -> int:
    """The nodes ``spec`` describes, counted without building any: every mapping in it is one
    node (an over-count for a record's ``columns`` mapping), and the child of a shorthand
    ``{count_key: K, child_key: spec}`` counts K times. ``repeat_of(family)`` gives a family's
    ``(count_key, child_key)`` or None. A sub-spec met twice (a dict shared in a Python spec)
    is counted once per use but walked once."""
    counts: dict[int, int] = {}
    todo = [(spec, False)]
    while todo:
        obj, ready = todo.pop()
        if id(obj) in counts and not ready:
            continue
        kids, times = _spec_children(obj, repeat_of)
        if not ready:
            todo.append((obj, True))
            todo.extend((c, False) for c in kids if id(c) not in counts)
            continue
        own = 1 if isinstance(obj, dict) else 0
        counts[id(obj)] = own + sum(counts[id(c)] * t for c, t in zip(kids, times))
    return counts[id(spec)]


def _spec_children(obj, repeat_of) -> tuple[list, list[int]]:
    """The mappings and lists directly inside ``obj``, each with how many times it counts."""
    if isinstance(obj, (list, tuple)):
        kids = [v for v in obj if isinstance(v, (dict, list, tuple))]
        return kids, [1] * len(kids)
    if not isinstance(obj, dict):
        return [], []
    repeat = repeat_of(obj.get("family")) if isinstance(obj.get("family"), str) else None
    kids, times = [], []
    for key, v in obj.items():
        if not isinstance(v, (dict, list, tuple)):
            continue
        kids.append(v)
        k = obj.get(repeat[0]) if repeat is not None and key == repeat[1] else None
        times.append(k if isinstance(k, int) and not isinstance(k, bool) and k > 1 else 1)
    return kids, times


def check_spec_size(spec, repeat_of) -> None:
    """Refuses (SpecError) a spec describing more than :data:`MAX_SPEC_NODES` nodes."""
    n = spec_node_count(spec, repeat_of)
    if n > MAX_SPEC_NODES:
        raise SpecError(f"model spec describes {n:,} nodes (each 'k' or 'n_states' shorthand multiplies its "
                        f"child's); the limit is {MAX_SPEC_NODES:,} (models.schema.MAX_SPEC_NODES)")
