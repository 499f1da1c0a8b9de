"""A model's placed costs as pre-order arrays (:class:`ModelFacts`), and the fingerprints
that tie a plan to its model and resources.

Everything here is computed once per model or resources object and cached by identity
(model nodes and resources are immutable); :mod:`planner.costing` prices assignments
from these arrays.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from emgrid.models.base import Node
from emgrid.models.cost import tree_costs
from emgrid.models.engine import block_rows
from emgrid.models.shard import column_keys

from .resources import Resources


@dataclass(frozen=True, eq=False)
class ModelFacts:
    """A model's placed costs as pre-order arrays, with the tree structure beside them."""

    paths: tuple[str, ...]
    families: tuple[str, ...]
    descriptions: tuple[str, ...]
    parent: np.ndarray  # node index of the parent, -1 for the root
    children: tuple[tuple[int, ...], ...]
    is_leaf: np.ndarray
    flops: np.ndarray  # own FLOPs per root row
    param: np.ndarray
    stat: np.ndarray
    cache: np.ndarray  # bytes kept beside the parameters (``NodeCost.cache_bytes``)
    mstep: np.ndarray  # the node's M-step's peak beyond the old node (``NodeCost.mstep_peak_bytes``)
    data: np.ndarray  # bytes per root row
    work: np.ndarray  # bytes per root row, kept through a block's passes (they add)
    scratch: np.ndarray  # bytes per root row while the node computes (a worker holds its largest)
    work_spanning: np.ndarray  # ``work`` and ``scratch`` of the node when it is spanning (see PlacedCost)
    scratch_spanning: np.ndarray
    calls: np.ndarray  # Python-level visits per block (whatever its rows)
    couple: np.ndarray  # bytes per root row shipped when the node is an owned root
    data_group: np.ndarray  # data column of every node (nodes reading one column share it)
    group_data: np.ndarray  # bytes per root row of every data column
    leaf_nodes: np.ndarray  # node index of every leaf, pre-order
    leaf_paths: tuple[str, ...]
    leaf_lo: np.ndarray  # node v covers leaves [leaf_lo[v], leaf_hi[v])
    leaf_hi: np.ndarray
    block_rows: int
    fingerprint: str
    dtype: str = "float64"  # the float type the figures are for (``models.cost.in_dtype``)

    @property
    def n_nodes(self) -> int:
        return len(self.paths)

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_paths)

    def leaf_index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.leaf_paths)}

    def describe(self, path: str) -> str:
        """What the node at ``path`` is (family and shape), for messages."""
        return self.descriptions[self.paths.index(path)]


_FACTS: OrderedDict[tuple[int, str], tuple[Node, ModelFacts]] = OrderedDict()


def model_facts(model: Node, dtype: str = "float64") -> ModelFacts:
    """The cost arrays of ``model`` with data and E-step in ``dtype`` (cached by identity;
    model nodes are immutable)."""
    key = (id(model), dtype)
    hit = _FACTS.get(key)
    if hit is not None and hit[0] is model:
        _FACTS.move_to_end(key)
        return hit[1]
    facts = _build_facts(model, dtype)
    _FACTS[key] = (model, facts)
    while len(_FACTS) > 16:
        _FACTS.popitem(last=False)
    return facts


def _build_facts(model: Node, dtype: str) -> ModelFacts:
    costs = tree_costs(model, dtype)
    nodes = model.nodes()
    paths = tuple(c.path for c in costs)
    index = {p: i for i, p in enumerate(paths)}
    parent = np.full(len(paths), -1, dtype=np.int64)
    children: list[list[int]] = [[] for _ in paths]
    for i, p in enumerate(paths):
        if p:
            par = index[p.rsplit(".", 1)[0] if "." in p else ""]
            parent[i] = par
            children[par].append(i)
    is_leaf = np.array([c.is_leaf for c in costs])
    leaf_nodes = np.flatnonzero(is_leaf)
    lo = np.zeros(len(paths), dtype=np.int64)
    hi = np.zeros(len(paths), dtype=np.int64)
    leaf_pos = {int(v): k for k, v in enumerate(leaf_nodes)}
    for v in range(len(paths) - 1, -1, -1):
        if is_leaf[v]:
            lo[v], hi[v] = leaf_pos[v], leaf_pos[v] + 1
        else:
            lo[v], hi[v] = lo[children[v][0]], hi[children[v][-1]]
    arr = lambda name: np.array([float(getattr(c, name)) for c in costs])  # noqa: E731
    data = arr("data_bytes_per_row")
    column = column_keys(model)
    keys = [column[p] for p in paths]
    key_ids = {k: g for g, k in enumerate(dict.fromkeys(keys))}
    data_group = np.array([key_ids[k] for k in keys], dtype=np.int64)
    group_data = np.zeros(len(key_ids))
    np.maximum.at(group_data, data_group, data)
    return ModelFacts(
        paths=paths,
        families=tuple(c.family for c in costs),
        descriptions=tuple(c.description for c in costs),
        parent=parent,
        children=tuple(tuple(c) for c in children),
        is_leaf=is_leaf,
        flops=arr("flops_per_row"),
        param=arr("param_bytes"),
        stat=arr("stat_bytes"),
        cache=arr("cache_bytes"),
        mstep=arr("mstep_bytes"),
        data=data,
        work=arr("work_bytes_per_row"),
        scratch=arr("scratch_bytes_per_row"),
        work_spanning=arr("split_work_bytes_per_row"),
        scratch_spanning=arr("split_scratch_bytes_per_row"),
        calls=arr("calls_per_block"),
        couple=arr("owned_root_coupling_bytes_per_row"),
        data_group=data_group,
        group_data=group_data,
        leaf_nodes=leaf_nodes,
        leaf_paths=tuple(paths[v] for v in leaf_nodes),
        leaf_lo=lo,
        leaf_hi=hi,
        block_rows=int(block_rows(model)),
        fingerprint=model_fingerprint(model, nodes),
        dtype=dtype,
    )


def model_fingerprint(model: Node, nodes=None) -> str:
    """SHA-256 of the tree's structure: paths, families and parameter *shapes* (not values),
    so a fitted model keeps the plan made for its initial state."""
    items = [
        [path, node.family, sorted((k, list(np.shape(v))) for k, v in node.params().items())]
        for path, node in (nodes or model.nodes())
    ]
    return hashlib.sha256(json.dumps(items, separators=(",", ":")).encode()).hexdigest()[:16]


_WORKERS: OrderedDict[int, tuple[Resources, np.ndarray, np.ndarray]] = OrderedDict()


def worker_arrays(resources: Resources) -> tuple[np.ndarray, np.ndarray]:
    """Every worker's FLOP rate and memory (``inf`` when unknown), cached per resources object."""
    hit = _WORKERS.get(id(resources))
    if hit is not None and hit[0] is resources:
        return hit[1], hit[2]
    speed = np.array([w.flops_per_s for w in resources.workers], dtype=np.float64)
    memory = np.array([np.inf if w.memory_bytes is None else float(w.memory_bytes) for w in resources.workers])
    speed.setflags(write=False)
    memory.setflags(write=False)
    _WORKERS[id(resources)] = (resources, speed, memory)
    while len(_WORKERS) > 16:
        _WORKERS.popitem(last=False)
    return speed, memory


def resources_fingerprint(resources: Resources) -> str:
    """SHA-256 of every worker's name, memory and speed and of the network."""
    return hashlib.sha256(resources.model_dump_json().encode()).hexdigest()[:16]


def leaf_shard_array(facts: ModelFacts, shard_of_leaf: dict[str, int]) -> np.ndarray:
    """``shard_of_leaf`` as an array in leaf pre-order (the caller checks completeness)."""
    return np.array([shard_of_leaf[p] for p in facts.leaf_paths], dtype=np.int64)
