"""The structure of an assignment or a plan, checked in one place with one set of messages.

``plan_from_assignment`` checks its arguments with the pieces below; ``validate_plan`` and
the executors' ``optimize`` check a finished plan with :func:`check_plan_structure`, which
calls the same pieces, so one fault raises one ``PlanError`` wherever it is found. Nothing
here prices a plan: ``validate_plan`` recomputes the figures and the memory on top (a plan run
without its resources has its figures checked against each other, :func:`check_plan_figures`).
This module does not import OR-Tools.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from emgrid.models.base import Node
from emgrid.models.errors import PlanError

from .facts import ModelFacts, model_facts, resources_fingerprint
from .plan import BalancePlan
from .resources import Resources


def check_count(value, field: str, *, minimum: int = 1) -> int:
    """An exact integer >= ``minimum``; raises PlanError naming the field and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PlanError(f"{field} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise PlanError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_model(model) -> None:
    if not isinstance(model, Node):
        raise PlanError(f"model must be a model node (e.g. models.Mixture), got {type(model).__name__}")


def check_resources(resources) -> None:
    if not isinstance(resources, Resources):
        raise PlanError(f"resources must be a planner.Resources, got {type(resources).__name__}")


def check_inputs(model, resources, n_data) -> int:
    """The checks every public entry point shares; returns ``n_data`` as an int."""
    check_model(model)
    check_resources(resources)
    return check_count(n_data, "n_data")


def check_grid(d, m, *, n_data: int, n_workers: int | None, n_leaves: int | None) -> tuple[int, int]:
    """``D x M`` as ints: ``D*M <= n_workers``, ``D <= n_data``, ``M <= n_leaves`` (a bound
    given as None is not checked)."""
    d = check_count(d, "data_parallel")
    m = check_count(m, "model_parallel")
    if n_workers is not None and d * m > n_workers:
        raise PlanError(f"grid {d}x{m} needs {d * m} workers, resources have {n_workers}")
    if d > n_data:
        raise PlanError(f"data_parallel={d} exceeds n_data={n_data}: every replica needs at least one row")
    if n_leaves is not None and m > n_leaves:
        raise PlanError(f"model_parallel={m} exceeds the model's {n_leaves} leaves: every shard needs a leaf")
    return d, m


def check_leaf_shards(leaf_paths: Sequence[str], describe: Callable[[str], str], shard_of_leaf: dict, m: int, *,
                      every_shard: bool = True) -> np.ndarray:
    """``shard_of_leaf`` (leaf path -> shard) as a pre-order array, checked: it names only
    leaves of the model, every leaf once, shards ``0..m-1``, and with ``every_shard`` each
    shard holds a leaf. ``describe(path)`` names a leaf in messages."""
    if not isinstance(shard_of_leaf, dict):
        raise PlanError(f"shard_of_leaf must be a dict from leaf path to shard, got {type(shard_of_leaf).__name__}")
    known = set(leaf_paths)
    if shard_of_leaf.keys() - known:
        p = next(p for p in shard_of_leaf if p not in known)
        preview = ", ".join(repr(x) for x in leaf_paths[:6]) + (", ..." if len(leaf_paths) > 6 else "")
        raise PlanError(f"shard {shard_of_leaf[p]!r} holds {p!r}, which is not a leaf of the model "
                        f"(its leaves: {preview})")
    if len(shard_of_leaf) != len(known):
        p = next(p for p in leaf_paths if p not in shard_of_leaf)
        raise PlanError(f"the model's leaf {p!r} ({describe(p)}) is on no shard")
    # exact ints pass at once; anything else must be an integer type, and not a bool
    if not all(type(s) is int for s in shard_of_leaf.values()):
        for p, s in shard_of_leaf.items():
            if isinstance(s, bool) or not isinstance(s, numbers.Integral):
                raise PlanError(f"leaf {p!r} is on shard {s!r}; shards are 0..{m - 1}")
    arr = np.array([int(shard_of_leaf[p]) for p in leaf_paths], dtype=np.int64)
    outside = np.flatnonzero((arr < 0) | (arr >= m))
    if outside.size:
        p = leaf_paths[int(outside[0])]
        raise PlanError(f"leaf {p!r} is on shard {shard_of_leaf[p]!r}; shards are 0..{m - 1}")
    if every_shard:
        empty = np.flatnonzero(np.bincount(arr, minlength=m) == 0)
        if empty.size:
            raise PlanError(f"shard {int(empty[0])} holds no leaf; a {m}-way split needs every shard to hold one")
    return arr


def check_placement(placement, d: int, m: int, resources: Resources | None) -> list[list[int]] | None:
    """``placement[r][s]`` (worker names) checked: ``d`` rows of ``m`` names, each name once
    and, with ``resources``, one of its workers; returns their indices (None without resources)."""
    if len(placement) != d or any(len(row) != m for row in placement):
        shape = (len(placement), [len(row) for row in placement])
        raise PlanError(f"placement must be {d} rows of {m} worker names, got {shape}")
    index = None if resources is None else {w.name: i for i, w in enumerate(resources.workers)}
    seen: set[str] = set()
    for r, row in enumerate(placement):
        for s, name in enumerate(row):
            if index is not None and name not in index:
                raise PlanError(f"worker {name!r} (replica {r}, shard {s}) is not in the resources")
            if name in seen:
                raise PlanError(f"worker {name!r} appears twice in the placement; no worker runs more than one "
                                f"(replica, shard)")
            seen.add(name)
    return None if index is None else [[index[name] for name in row] for row in placement]


def check_rows(replica_rows, d: int, n_data: int) -> list[int]:
    """``d`` row counts >= 1 summing to ``n_data``."""
    rows = [check_count(r, f"replica_rows[{i}]") for i, r in enumerate(replica_rows)]
    if len(rows) != d:
        raise PlanError(f"replica_rows must hold {d} counts (one per replica), got {len(rows)}")
    if sum(rows) != n_data:
        raise PlanError(f"replica_rows sum to {sum(rows)}, not n_data={n_data}")
    return rows


@dataclass(frozen=True, eq=False)
class PlanStructure:
    """What a checked plan says, in the planner's indices."""

    leaf_shard: np.ndarray  # shard of every leaf, pre-order
    grid: list[list[int]] | None  # grid[r][s]: index into resources.workers (None without resources)
    facts: ModelFacts | None  # the model's cost arrays (None when not strict)


def check_plan_structure(plan: BalancePlan, model: Node, n_data: int, resources: Resources | None = None, *,
                         strict: bool = True) -> PlanStructure:
    """Raises PlanError naming the first structural fault of ``plan`` for ``model`` and ``n_data``.

    Always checked: ``n_data`` and the grid's rows (``D`` counts >= 1 summing to it, so
    ``D <= n_data``), ``workers_used = D*M``, ``M`` model cuts in shard order each naming
    ``D`` workers, no worker twice, and every leaf of the model on exactly one shard. With
    ``resources``: the plan was made for them (fingerprint, ``workers_total``), ``D*M`` fits
    them and every worker is theirs. With ``strict``: the plan was made for this model's
    structure (fingerprint) and every shard holds a leaf, listed in pre-order; an executor
    passes ``strict=False`` to run a hand-built plan (an idle shard, a placeholder
    fingerprint) that it can still realize.
    """
    if not isinstance(plan, BalancePlan):
        raise PlanError(f"plan must be a planner.BalancePlan, got {type(plan).__name__}")
    check_model(model)
    if resources is not None:
        check_resources(resources)
    n_data = check_count(n_data, "n_data")
    facts = model_facts(model, plan.dtype) if strict else None
    if facts is not None and plan.model_fingerprint != facts.fingerprint:
        raise PlanError(f"the plan was made for another model (fingerprint {plan.model_fingerprint}, "
                        f"this model's is {facts.fingerprint}); plan again for this model")
    if resources is not None and plan.resources_fingerprint != resources_fingerprint(resources):
        raise PlanError(f"the plan was made for other resources (fingerprint {plan.resources_fingerprint}, "
                        f"these are {resources_fingerprint(resources)}); plan again for these workers")
    if plan.n_data != n_data:
        raise PlanError(f"the plan was made for n_data={plan.n_data}, not {n_data}")
    d, m = plan.data_parallel, plan.model_parallel
    if resources is not None and plan.workers_total != resources.n_workers:
        raise PlanError(f"workers_total={plan.workers_total}, but the resources have {resources.n_workers} workers")
    if plan.workers_used != d * m:
        raise PlanError(f"workers_used={plan.workers_used}, but the grid {d}x{m} uses {d * m}")
    check_grid(d, m, n_data=n_data, n_workers=None if resources is None else resources.n_workers, n_leaves=None)

    if len(plan.model_cuts) != m:
        raise PlanError(f"the plan has {len(plan.model_cuts)} model cuts for model_parallel={m}")
    if facts is not None:
        leaf_paths, describe = facts.leaf_paths, facts.describe
    else:
        leaves = dict(model.leaves())
        leaf_paths, describe = tuple(leaves), lambda p: leaves[p].describe()
    shard_of_leaf: dict[str, int] = {}
    for s, cut in enumerate(plan.model_cuts):
        if cut.shard != s:
            raise PlanError(f"model cut {s} is labelled shard {cut.shard}; cuts must be in shard order")
        if len(cut.workers) != d:
            raise PlanError(f"shard {s} names {len(cut.workers)} workers, one per replica needs {d}")
        before = len(shard_of_leaf)
        shard_of_leaf.update(dict.fromkeys(cut.leaves, s))
        if len(shard_of_leaf) != before + len(cut.leaves):
            _raise_repeated_leaf(plan, s)
    leaf_shard = check_leaf_shards(leaf_paths, describe, shard_of_leaf, m, every_shard=strict)
    if strict:  # each shard holds the right leaves; are they listed in pre-order?
        by_shard = np.argsort(leaf_shard, kind="stable").tolist()
        start = 0
        for s, cut in enumerate(plan.model_cuts):
            stop = start + len(cut.leaves)
            if list(cut.leaves) != [leaf_paths[i] for i in by_shard[start:stop]]:
                raise PlanError(f"shard {s} lists its leaves out of pre-order")
            start = stop
    grid = check_placement(plan.worker_grid(), d, m, resources)
    check_rows(plan.replica_rows, d, n_data)
    return PlanStructure(leaf_shard=leaf_shard, grid=grid, facts=facts)


def check_plan_figures(plan: BalancePlan) -> None:
    """A plan run without the resources it was made for (``validate_plan`` needs them) still
    agrees with itself: every worker's rows are its replica's, and its predicted memory is
    within its recorded limit. PlanError naming the worker otherwise (a plan edited by hand)."""
    for w in plan.per_worker:
        if not 0 <= w.replica < len(plan.replica_rows) or w.rows != plan.replica_rows[w.replica]:
            raise PlanError(f"plan: worker {w.name!r} has {w.rows} rows but replica {w.replica} has "
                            f"{plan.replica_rows[w.replica] if 0 <= w.replica < len(plan.replica_rows) else 'none'} "
                            "(replica_rows); plan again, or pass the resources to validate it")
        if w.memory_limit is not None and w.memory_bytes > w.memory_limit:
            raise PlanError(f"plan: worker {w.name!r} needs {w.memory_bytes} bytes but its memory_limit is "
                            f"{w.memory_limit}; plan again, or pass the resources to validate it")


def _raise_repeated_leaf(plan: BalancePlan, s: int) -> None:
    """Names the first leaf that shard ``s`` repeats, of its own or of an earlier shard."""
    first: dict[str, int] = {}
    for k, cut in enumerate(plan.model_cuts[:s + 1]):
        for leaf in cut.leaves:
            if leaf in first:
                raise PlanError(f"leaf {leaf!r} is on shards {first[leaf]} and {k}; each leaf goes on exactly one")
            first[leaf] = k
