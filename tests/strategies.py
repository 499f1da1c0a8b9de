"""Hypothesis strategies for emgrid model trees and their data.

Leaves are drawn by their families' own ``strategy`` hooks (``models.base.Leaf``), for
every leaf family the package registers (:func:`package_families`), so a new family is
drawn as soon as it is registered; a family without the hook fails with its name.

Every strategy draws valid objects: parameters inside their families' domains, internal
nodes whose children agree on their data type, and trees small enough that a test example
runs in milliseconds (at most ``MAX_LEAVES`` leaves, at most ``MAX_POSITIONS`` expected leaf
rows per root row under nested sequences). Data is drawn by the model itself,
``model.sample(n, seed)``, with a drawn seed, so every example replays exactly.

The planner and executor tests reuse :func:`models` and :func:`models_with_data`.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from emgrid.models import FAMILIES, HMM, Composite, Gaussian, Leaf, Mixture, Sequence
from emgrid.models.base import Node

#: Most leaves a drawn tree holds.
MAX_LEAVES = 8
#: Most expected leaf rows per root row (product of mean lengths along any path).
MAX_POSITIONS = 25.0
MAX_COMPONENTS = 3


def _floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


# ---------------------------------------------------------------- parameter pieces
def simplex(k: int, low: float = 0.05) -> st.SearchStrategy[np.ndarray]:
    """A probability vector of length ``k`` with every entry at least about ``low / k``.

    >>> simplex(3).example()
    array([0.215, 0.116, 0.669])
    """
    return st.lists(_floats(low, 1.0), min_size=k, max_size=k).map(lambda v: np.array(v) / np.sum(v))


def stochastic_matrices(k: int, low: float = 0.05) -> st.SearchStrategy[np.ndarray]:
    """A ``(k, k)`` row-stochastic matrix.

    >>> stochastic_matrices(2).example()
    array([[0.465, 0.535],
           [0.377, 0.623]])
    """
    return st.lists(simplex(k, low), min_size=k, max_size=k).map(np.array)


def mean_lengths(low: float = 2.0, high: float = 5.0) -> st.SearchStrategy[float]:
    """A sequence's or HMM's mean length.

    >>> mean_lengths().example()
    4.720325761238291
    """
    return _floats(low, high)


# ---------------------------------------------------------------- leaves
def package_families() -> list[type[Leaf]]:
    """The leaf families registered in ``emgrid.models.FAMILIES`` by the package itself, in
    registration order: the ones drawn by default. A family defined elsewhere (a user's, a
    test's) is drawn where it is passed explicitly (``leaves(families=[...])``), so that
    defining one in a test does not change what every other test draws."""
    return [cls for cls in FAMILIES.values() if issubclass(cls, Leaf) and cls.__module__.startswith("emgrid.models.")]


def leaf_strategy(cls: type[Leaf], like: Leaf | None = None) -> st.SearchStrategy[Leaf]:
    """The family's own strategy (its ``strategy`` hook), ``like``'s sizes when given; a
    family without one is a clear error naming it."""
    if cls.strategy.__func__ is Leaf.strategy.__func__:
        raise TypeError(f"leaf family {cls.family!r} ({cls.__module__}) defines no strategy(st, like) hook, which "
                        "tests/strategies.py draws it from: add one beside its class (README, 'Adding a family')")
    return cls.strategy(st, like)


def gaussians() -> st.SearchStrategy[Gaussian]:
    """``Gaussian(mean in [-5, 5], var in [0.1, 5])``.

    >>> gaussians().example()
    Gaussian(mean=-3.441, var=3.964)
    """
    return leaf_strategy(Gaussian)


def leaves(families: list[type[Leaf]] | None = None) -> st.SearchStrategy[Node]:
    """Any leaf family (every one of :func:`package_families`, or ``families``) with valid
    random parameters and small dimensions, each drawn by its family's ``strategy`` hook.

    >>> leaves().example()
    Gaussian(mean=0., var=0.1)
    >>> leaves().example()
    Poisson(rate=3.882)
    """
    return st.one_of(*(leaf_strategy(cls) for cls in (package_families() if families is None else families)))


# ---------------------------------------------------------------- tree measures
def n_leaves(model: Node) -> int:
    return len(model.leaves())


def positions_per_row(model: Node) -> float:
    """Most expected leaf rows per row of ``model`` along any root-to-leaf path."""
    if model.is_leaf:
        return 1.0
    return max(model.child_rows(i) * positions_per_row(c) for i, c in enumerate(model.children))


# ---------------------------------------------------------------- same structure, new parameters
def like(model: Node) -> st.SearchStrategy[Node]:
    """A node with ``model``'s structure and data type (families, dimensions, sizes) and
    freshly drawn parameters: the way mixtures and HMMs draw agreeing components. A leaf
    comes from its family's ``strategy`` hook, an internal node from :data:`INTERNAL_LIKE`.

    >>> like(Composite([Gaussian(0, 1), Categorical([0.5, 0.5])])).example()   # as a tree:
    Composite of 2
      Gaussian(mean=2.864, var=0.274)
      Categorical(probs=[0.438 0.562])
    """
    if isinstance(model, Leaf):
        return leaf_strategy(type(model), model)
    build = INTERNAL_LIKE.get(model.family)
    if build is None:
        raise TypeError(f"like() has no rule for the internal family {model.family!r}: add one to "
                        "tests.strategies.INTERNAL_LIKE")
    return build(model, st.tuples(*(like(c) for c in model.children)))


#: Per internal family: ``(model, its children's strategy) -> a strategy of nodes like it``.
INTERNAL_LIKE = {
    "Composite": lambda model, kids: kids.map(Composite),
    "Mixture": lambda model, kids: st.builds(Mixture, kids, simplex(len(model.children))),
    "HMM": lambda model, kids: st.builds(HMM, kids, stochastic_matrices(len(model.children)),
                                         simplex(len(model.children)), mean_lengths()),
    "Sequence": lambda model, kids: st.tuples(kids, mean_lengths()).map(lambda cl: Sequence(cl[0][0], cl[1])),
}


def _components(children: st.SearchStrategy[Node], max_k: int) -> st.SearchStrategy[tuple]:
    """One drawn child plus up to ``max_k - 1`` more of its structure, within ``MAX_LEAVES``."""

    def more(first: Node):
        top = max(1, min(max_k, MAX_LEAVES // n_leaves(first)))
        return st.integers(1, top).flatmap(lambda k: st.tuples(st.just(first), *[like(first)] * (k - 1)))

    return children.flatmap(more)


# ---------------------------------------------------------------- internal nodes
def mixture_of(children: st.SearchStrategy[Node], max_components: int = MAX_COMPONENTS) -> st.SearchStrategy[Mixture]:
    """A ``Mixture`` of 1..3 components of one structure, the first drawn from ``children``.

    >>> mixture_of(leaves()).example()   # as a tree:
    Mixture K=3
      DiagGaussian(mean=[-1.23  -4.079  4.157], var=[2.112 4.937 5.   ])
      DiagGaussian(mean=[ 2.402  0.    -0.   ], var=[4.945 2.471 2.629])
      DiagGaussian(mean=[2.591 2.146 4.553], var=[3.328 0.547 3.94 ])
    """
    return _components(children, max_components).flatmap(
        lambda comps: simplex(len(comps)).map(lambda w: Mixture(comps, w)))


def hmm_of(children: st.SearchStrategy[Node], max_states: int = MAX_COMPONENTS) -> st.SearchStrategy[Node]:
    """An ``HMM`` with 1..3 states whose emissions share the first one's structure, mean
    length 2..5; the child itself when a sequence would exceed ``MAX_POSITIONS``.

    >>> hmm_of(leaves()).example()   # as a tree:
    HMM K=3 L~3.57
      FullGaussian(mean=[-0.], cov=[[1.9]])
      FullGaussian(mean=[-0.], cov=[[0.682]])
      FullGaussian(mean=[1.822], cov=[[1.951]])
    """

    def build(comps):
        room = MAX_POSITIONS / positions_per_row(comps[0])
        if room < 2.0:
            return st.just(comps[0])
        k = len(comps)
        return st.tuples(stochastic_matrices(k), simplex(k), mean_lengths(2.0, min(5.0, room))).map(
            lambda apl: HMM(comps, *apl))

    return _components(children, max_states).flatmap(build)


def sequence_of(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    """A ``Sequence`` of the drawn child with mean length 2..5; the child itself when a
    sequence would exceed ``MAX_POSITIONS``.

    >>> sequence_of(leaves()).example()   # as a tree:
    Sequence L~2.73
      Categorical(probs=[0.862 0.138])
    """

    def build(child):
        room = MAX_POSITIONS / positions_per_row(child)
        if room < 2.0:
            return st.just(child)
        return mean_lengths(2.0, min(5.0, room)).map(lambda L: Sequence(child, L))

    return children.flatmap(build)


def composite_of(children: st.SearchStrategy[Node], max_fields: int = 3) -> st.SearchStrategy[Composite]:
    """A ``Composite`` of 1..3 drawn fields (trailing fields dropped beyond ``MAX_LEAVES``).

    >>> composite_of(leaves()).example()   # as a tree:
    Composite of 3
      Exponential(rate=3.895)
      FullGaussian(mean=[-2.988], cov=[[0.342]])
      DiagGaussian(mean=[0.], var=[0.269])
    """

    def build(fields):
        kept, total = [], 0
        for f in fields:
            if kept and total + n_leaves(f) > MAX_LEAVES:
                break
            kept.append(f)
            total += n_leaves(f)
        return Composite(kept)

    return st.lists(children, min_size=1, max_size=max_fields).map(build)


def models(max_leaves: int = MAX_LEAVES, families: list[type[Leaf]] | None = None) -> st.SearchStrategy[Node]:
    """Random nested model trees: leaves (of :func:`leaves`'s families, or ``families``)
    under Composite, Mixture, HMM and Sequence nodes in any nesting where data types agree,
    at most ``MAX_LEAVES`` leaves.

    >>> models().example()   # as a tree:
    HMM K=3 L~4.37
      Mixture K=1
        HMM K=2 L~2.11
          Mixture K=1
            Exponential(rate=5.)
          Mixture K=1
            Exponential(rate=0.873)
      Mixture K=1
        HMM K=2 L~3.36
          ...
    >>> models().example()
    Sequence L~2
      Sequence L~3
        Mixture K=1
          Poisson(rate=10.)
    """
    return st.recursive(
        leaves(families),
        lambda children: st.one_of(composite_of(children), mixture_of(children), hmm_of(children),
                                   sequence_of(children)),
        max_leaves=max_leaves,
    )


# ---------------------------------------------------------------- data
def seeds() -> st.SearchStrategy[int]:
    """A seed for ``numpy.random.default_rng``.

    >>> seeds().example()
    306
    """
    return st.integers(0, 2**32 - 1)


def data_for(model: Node, min_rows: int = 1, max_rows: int = 60) -> st.SearchStrategy:
    """Rows drawn by ``model.sample(n, seed)`` with drawn ``n`` and seed, in the canonical
    encoding (an array, a tuple of columns, or a ``Ragged``).

    >>> data_for(Gaussian(0, 1), 3, 3).example()
    array([-0.695,  0.032,  0.809])
    """
    return st.tuples(st.integers(min_rows, max_rows), seeds()).map(
        lambda ns: model.sample(ns[0], np.random.default_rng(ns[1])))


def weights_for(n: int, low: float = 0.0, high: float = 3.0) -> st.SearchStrategy[np.ndarray]:
    """``n`` row weights in ``[low, high]`` with at least one positive.

    >>> weights_for(4).example()
    array([2.719, 1.016, 1.507, 0.   ])
    """
    return st.lists(_floats(low, high), min_size=n, max_size=n).map(np.array).filter(lambda w: w.max() > 0)


def models_with_data(model_strategy: st.SearchStrategy[Node] | None = None, min_rows: int = 1,
                     max_rows: int = 60) -> st.SearchStrategy[tuple[Node, object]]:
    """``(model, data)``: a drawn model and rows it sampled itself.

    >>> models_with_data(gaussians(), 3, 3).example()
    (Gaussian(mean=0., var=0.1), array([ 0.04 , -0.042,  0.203]))
    >>> models_with_data().example()   # a Sequence and a Ragged of its rows
    (Sequence(...), Ragged(values=array([...]), offsets=array([0, 2, 2, 5, ...])))
    """
    model_strategy = models() if model_strategy is None else model_strategy
    return model_strategy.flatmap(lambda m: data_for(m, min_rows, max_rows).map(lambda x: (m, x)))


@st.composite
def split_in_two(draw, model_strategy: st.SearchStrategy[Node] | None = None) -> tuple[Node, dict[str, int]]:
    """``(model, shard_of_leaf)``: a model of two or more leaves, each leaf on shard 0 or 1,
    both shards used.

    >>> split_in_two().example()
    (Composite(...), {'0': 1, '1.0': 0, '1.1': 1})
    """
    model = draw(models() if model_strategy is None else model_strategy)
    leaves = [p for p, _ in model.leaves()]
    assume(len(leaves) >= 2)
    shards = draw(st.lists(st.integers(0, 1), min_size=len(leaves), max_size=len(leaves)), label="shards")
    if len(set(shards)) == 1:
        shards[draw(st.integers(0, len(leaves) - 1), label="the leaf on the other shard")] ^= 1
    return model, dict(zip(leaves, shards))
