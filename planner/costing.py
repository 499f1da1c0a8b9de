"""The one floating-point cost model of an EM iteration on a ``D x M`` grid.

Every figure a plan reports comes from :func:`evaluate`: the exact planner recomputes its
answer with it, the heuristics and baselines are priced with it, ``validate_plan`` checks
plans against it and the executors predict with it. Costs are the nodes' own costs per root
row from :func:`models.cost.tree_costs` (``c_v`` below stands for any of them).

Which nodes a shard evaluates
    A node is *split* when its leaves lie on more than one shard
    (:func:`models.cost.split_nodes`). Shard ``s`` evaluates ``E_s`` = the nodes of the
    subtrees it owns (:func:`models.cost.owned_roots`) plus every split node: the split
    nodes are evaluated redundantly on every shard of a replica. With ``M = 1`` the only
    shard evaluates the whole tree. Shard sums ``X_s = sum_{v in E_s} x_v`` are taken of
    FLOPs (``F_s``), parameter (``P_s``), statistic (``S_s``) and kept working bytes
    (``W_s``); the scratch bytes ``X_s = max_{v in E_s} x_v`` (one node computes at a time).
    Data bytes ``D_s`` count every *data column* the shard touches once: the children of
    a mixture or an HMM read one column (``Node.shares_child_data``), and a shard holding
    three components of a mixture keeps one copy of it, as
    ``executors.step.restrict_columns`` does.

Rows
    Replica ``r`` takes ``rows_r`` consecutive rows (:func:`replica_rows`: proportional to
    the speed of the replica's slowest worker, integers summing to ``n_data``, each >= 1).
    ``B = models.engine.block_rows(model)`` rows form one block; ``b_r = min(rows_r, B)``.

Terms of the predicted iteration time (seconds; ``L(k) = ceil(log2 k)``, ``lat`` and
``bw`` the network's latency and bytes per second):

- compute   ``max_{r,s} rows_r * F_s / speed(r, s) + ceil(rows_r / B) * K_s * c`` (the
  busiest worker), ``K_s`` the shard's node visits per block (``NodeCost.calls_per_block``)
  and ``c = models.engine.NODE_CALL_S`` the interpreter time of one;
- coupling  (``M > 1``) ``max_r [ceil(rows_r / B) * L(M) * lat + rows_r * C * (M-1)/M / bw]
  + SYNC_WAIT_SHARE * compute`` with ``C = models.cost.coupling_bytes_per_row``: an
  allgather of the owned roots' log densities among the ``M`` shards of a replica, once per
  block, and the wait for each block's slowest shard;
- reduce    ``L(D) * (lat + max_s S_s / bw)``: every shard group tree-reduces its shard's
  statistics over the ``D`` replicas;
- broadcast ``L(D) * (lat + max_s P_s / bw)`` plus, when ``M > 1``,
  ``L(M) * (lat + P_split / bw)``: each shard's new parameters go to its ``D`` workers, and
  the split nodes' new parameters (estimated once) go to the ``M`` shards;
- M-step    ``ITERATION_S + n_nodes * ESTIMATE_S``: the coordinator estimates every node
  and runs the loop (the same for every plan of a model: it does not change which plan is
  best, only what it predicts).

The total is the sum of the five terms (the phases are synchronous).

Memory of worker ``(r, s)`` (bytes, its predicted peak)::

    D_s * rows_r + (W_s + X_s) * b_r + [M > 1] 2 C * b_r + 3 * (P_s + S_s) + A

its rows of data (the leaves' columns and the split nodes' offsets), one block of working
arrays (``models.cost.NodeCost``: the kept arrays of every node it evaluates and the
largest scratch), two copies of one block's exchanged log densities
(:data:`COUPLING_COPIES`), three copies of its parameters
and statistics (:data:`PARAM_STAT_COPIES`), and ``A`` (:data:`WORKER_BASE_BYTES`); the worker of cell ``(0, 0)`` adds
:func:`coordinator_bytes` when it also coordinates (``Resources.coordinator_in_grid``). A worker
whose memory is unknown (``None``) is unconstrained; a plan using one
reports ``fits=None`` unless a known worker already overflows.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from emgrid.models.base import Node
from emgrid.models.cost import ceil_log2, tree_costs
from emgrid.models.engine import ESTIMATE_S, ITERATION_S, NODE_CALL_S, block_rows

from .plan import Breakdown, WorkerLoad
from .resources import Resources


#: Copies of a worker's parameters and statistics at its peak: the model it evaluates, the
#: statistics it folds, and one more of either in transit (statistics pickled for the
#: reduce, the next model arriving with its pickle). A categorical mixture whose tables
#: dominate measured 2.7 copies (``bench/memory.py``).
PARAM_STAT_COPIES = 3.0


#: What a fitting worker holds above its baseline that grows with nothing above: messages
#: in flight, Python objects. Least squares over the 266 workers of ``bench/soak.py`` (rows
#: mapped by range, so the data term is exact): 0.2-0.3 MiB; a tiny worker's rows and block
#: alone measured within 1% of its RSS (``bench/memory.py``).
WORKER_BASE_BYTES = 2**18

#: Copies of a block's exchanged log densities a worker holds while the shards of its
#: replica exchange them: its own densities as computed, and every shard's message (its own
#: packed into it), which the downward pass reads in place (``executors.coupling``). With
#: two copies, 266 of 266 workers of ``bench/soak.py``'s two-shard fits land within 25% of
#: the plan.
COUPLING_COPIES = 2.0

#: With ``M > 1`` the shards of a replica meet once per block, so each waits for the
#: block's slowest shard: block-to-block jitter that balancing cannot remove. Measured
#: beside the predicted exchange: 9-17% of the compute under MPI, 0-12% with pipes
#: (``bench/scaling.py``, two shards of equal work).
SYNC_WAIT_SHARE = 0.1


#: Copies of the whole model's parameters and statistics that the coordinator holds beyond
#: a worker's when it is a worker too (``Resources.coordinator_in_grid``): the shards'
#: statistics gathered and merged, the new model and its pickled parts for the workers.
#: Measured 1.1-2.8 on categorical mixtures whose tables dominate, 2x1 and 1x2
#: (``bench/memory.py --executor mpi``).
COORDINATOR_COPIES = 2.5


def coordinator_bytes(facts: "ModelFacts", resources: Resources) -> float:
    """What cell ``(0, 0)`` holds beyond its worker's share when it also coordinates
    (:data:`COORDINATOR_COPIES`; 0 when the coordinator is outside the grid)."""
    if not resources.coordinator_in_grid:
        return 0.0
    return COORDINATOR_COPIES * float(facts.param.sum() + facts.stat.sum())


def compute_factor(m: int) -> float:
    """The compute term times this is compute plus the shards' per-block wait (M > 1)."""
    return 1.0 + SYNC_WAIT_SHARE if m > 1 else 1.0


def fixed_bytes(param, stat):
    """A worker's bytes for parameters and statistics (``PARAM_STAT_COPIES`` copies)."""
    return PARAM_STAT_COPIES * (param + stat)


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
    data: np.ndarray  # bytes per root row
    work: np.ndarray  # bytes per root row, kept through a block's passes (they add)
    scratch: np.ndarray  # bytes per root row while the node computes (a worker holds its largest)
    work_split: np.ndarray  # ``work`` and ``scratch`` of the node when it is split (see PlacedCost)
    scratch_split: np.ndarray
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

    @property
    def n_nodes(self) -> int:
        return len(self.paths)

    @property
    def n_leaves(self) -> int:
        return len(self.leaf_paths)

    def leaf_index(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.leaf_paths)}


_FACTS: OrderedDict[int, tuple[Node, ModelFacts]] = OrderedDict()


def model_facts(model: Node) -> ModelFacts:
    """The cost arrays of ``model`` (cached by identity; model nodes are immutable)."""
    hit = _FACTS.get(id(model))
    if hit is not None and hit[0] is model:
        _FACTS.move_to_end(id(model))
        return hit[1]
    facts = _build_facts(model)
    _FACTS[id(model)] = (model, facts)
    while len(_FACTS) > 16:
        _FACTS.popitem(last=False)
    return facts


def _build_facts(model: Node) -> ModelFacts:
    costs = tree_costs(model)
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
    keys = [""] * len(paths)
    for i in range(1, len(paths)):
        par = int(parent[i])
        step = "*" if nodes[par][1].shares_child_data else paths[i].rsplit(".", 1)[-1]
        keys[i] = f"{keys[par]}.{step}"
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
        data=data,
        work=arr("work_bytes_per_row"),
        scratch=arr("scratch_bytes_per_row"),
        work_split=arr("split_work_bytes_per_row"),
        scratch_split=arr("split_scratch_bytes_per_row"),
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


# ---------------------------------------------------------------- assignment -> shard sums
@dataclass(frozen=True, eq=False)
class ShardSums:
    """Per-shard sums over the evaluated nodes ``E_s`` and the split-dependent totals."""

    split: np.ndarray  # bool per node
    node_shard: np.ndarray  # owning shard of an unsplit node, -1 for split nodes
    flops: np.ndarray  # F_s, per root row
    param: np.ndarray  # P_s
    stat: np.ndarray  # S_s
    data: np.ndarray  # D_s, per root row: every data column the shard touches, once
    work: np.ndarray  # W_s, per root row
    scratch: np.ndarray  # X_s, per root row: the largest scratch of the nodes the shard evaluates
    calls: np.ndarray  # K_s, node visits per block
    coupling_bytes_per_row: float  # C
    split_param: float  # P_split
    leaves: tuple[tuple[int, ...], ...]  # leaf indices of every shard, pre-order


def shard_sums(facts: ModelFacts, leaf_shard, n_shards: int) -> ShardSums:
    """Evaluated-node sums of every shard for ``leaf_shard[i]`` = shard of leaf ``i``.

    A node's leaves are a contiguous run in pre-order, so it is split exactly when the
    shard changes between two consecutive leaves of its run.
    """
    leaf_shard = np.asarray(leaf_shard, dtype=np.int64)
    changes = np.concatenate([[0], np.cumsum(leaf_shard[1:] != leaf_shard[:-1])])
    split = changes[facts.leaf_hi - 1] != changes[facts.leaf_lo]
    node_shard = np.where(split, -1, leaf_shard[facts.leaf_lo])
    own = ~split

    def per_shard(x: np.ndarray, when_split: np.ndarray | None = None) -> np.ndarray:
        xs = x if when_split is None else when_split
        return np.bincount(node_shard[own], weights=x[own], minlength=n_shards)[:n_shards] + float(xs[split].sum())

    scratch = np.zeros(n_shards)
    np.maximum.at(scratch, node_shard[own], facts.scratch[own])
    scratch = np.maximum(scratch, float(facts.scratch_split[split].max(initial=0.0)))
    n_groups = len(facts.group_data)
    everywhere = np.zeros(n_groups, dtype=bool)
    everywhere[facts.data_group[split]] = True
    g_own = facts.data_group[own]
    keep = ~everywhere[g_own]
    pairs = np.unique(node_shard[own][keep] * n_groups + g_own[keep])
    data = np.bincount(pairs // n_groups, weights=facts.group_data[pairs % n_groups], minlength=n_shards)[:n_shards]
    data = data + float(facts.group_data[everywhere].sum())
    if split[0]:
        par = facts.parent
        roots = own & (par >= 0)
        roots[roots] = split[par[roots]]
        couple = float(facts.couple[roots].sum())
    else:
        couple = 0.0
    order = np.argsort(leaf_shard, kind="stable")
    bounds = np.searchsorted(leaf_shard[order], np.arange(n_shards + 1))
    leaves = tuple(tuple(order[bounds[s]:bounds[s + 1]].tolist()) for s in range(n_shards))
    return ShardSums(split=split, node_shard=node_shard, flops=per_shard(facts.flops), param=per_shard(facts.param),
                     stat=per_shard(facts.stat), data=data, work=per_shard(facts.work, facts.work_split),
                     scratch=scratch, calls=per_shard(facts.calls), coupling_bytes_per_row=couple,
                     split_param=float(facts.param[split].sum()), leaves=leaves)


def block_counts(rows, block_rows: int) -> np.ndarray:
    """Blocks of ``block_rows`` each row count takes (0 rows: none)."""
    return np.ceil(np.asarray(rows, dtype=np.float64) / block_rows)


def mstep_s(facts: ModelFacts) -> float:
    """The M-step term: the coordinator estimates every node and runs the loop."""
    return ITERATION_S + facts.n_nodes * ESTIMATE_S


def leaf_bytes(facts: ModelFacts, rows: int, block: int) -> np.ndarray:
    """Every leaf's own share of a worker's memory with ``rows`` rows (blocks of ``block``):
    its parameters and statistics, its data, its working arrays."""
    lv = facts.leaf_nodes
    return (fixed_bytes(facts.param, facts.stat)[lv] + facts.data[lv] * rows
            + (facts.work + facts.scratch)[lv] * block)


# ---------------------------------------------------------------- rows
def replica_rows(n_data: int, speeds) -> list[int]:
    """Rows of each replica: proportional to ``speeds`` (each replica's slowest worker),
    integers summing to ``n_data``, each >= 1; the remainder goes, row by row, where it
    raises ``rows / speed`` least (ties to the lower index)."""
    speeds = [float(s) for s in speeds]
    d = len(speeds)
    if not 1 <= d <= n_data:
        raise ValueError(f"replica count must be between 1 and n_data={n_data}, got {d}")
    total = sum(speeds)
    rows = [max(1, int(n_data * s / total)) for s in speeds]
    excess = sum(rows) - n_data
    if excess > 0:  # only after lifting zeros to one
        heap = [(-rows[r] / speeds[r], -r) for r in range(d) if rows[r] > 1]
        heapq.heapify(heap)
        while excess > 0:
            _, neg_r = heapq.heappop(heap)
            r = -neg_r
            rows[r] -= 1
            excess -= 1
            if rows[r] > 1:
                heapq.heappush(heap, (-rows[r] / speeds[r], -r))
    heap = [((rows[r] + 1) / speeds[r], r) for r in range(d)]
    heapq.heapify(heap)
    for _ in range(n_data - sum(rows)):
        _, r = heapq.heappop(heap)
        rows[r] += 1
        heapq.heappush(heap, ((rows[r] + 1) / speeds[r], r))
    return rows


# ---------------------------------------------------------------- the iteration cost
@dataclass(frozen=True, eq=False)
class Evaluation:
    """The cost of one assignment: breakdown, per-worker loads, shard sums and fit."""

    breakdown: Breakdown
    loads: tuple[WorkerLoad, ...]  # replica-major: loads[r * M + s]
    sums: ShardSums
    fits: bool | None
    rows: tuple[int, ...]

    @property
    def total_s(self) -> float:
        return self.breakdown.total_s


@dataclass(frozen=True, eq=False)
class Priced:
    """The arrays behind an evaluation: ``[r, s]`` per worker of the grid."""

    breakdown: Breakdown
    fits: bool | None
    rows: np.ndarray
    flops: np.ndarray  # per iteration
    seconds: np.ndarray
    memory: np.ndarray  # predicted peak bytes (float)
    sums: ShardSums


def price(facts: ModelFacts, resources: Resources, n_data: int, sums: ShardSums, placement, rows=None) -> Priced:
    """Every term of the iteration time and the memory of every worker (module docstring).

    ``placement[r][s]`` is the index into ``resources.workers`` of the worker running shard
    ``s`` of replica ``r``; ``rows`` defaults to :func:`replica_rows` of the placement.
    """
    grid = np.asarray(placement, dtype=np.int64)
    d, m = grid.shape
    speeds, memories = worker_arrays(resources)
    speed = speeds[grid]
    if rows is None:
        rows = replica_rows(n_data, speed.min(axis=1))
    rows_f = np.asarray(rows, dtype=np.float64)
    block = np.minimum(rows_f, float(facts.block_rows))
    couple = sums.coupling_bytes_per_row if m > 1 else 0.0
    flops = rows_f[:, None] * sums.flops[None, :]
    seconds = flops / speed + block_counts(rows_f, facts.block_rows)[:, None] * (NODE_CALL_S * sums.calls)[None, :]
    memory = (sums.data[None, :] * rows_f[:, None]
              + (sums.work + sums.scratch + COUPLING_COPIES * couple)[None, :] * block[:, None]
              + fixed_bytes(sums.param, sums.stat)[None, :] + WORKER_BASE_BYTES)
    memory[0, 0] += coordinator_bytes(facts, resources)
    limit = memories[grid]
    known = np.isfinite(limit)
    if np.any(np.ceil(memory[known]) > limit[known]):
        fits: bool | None = False
    else:
        fits = True if known.all() else None

    net = resources.network
    lat, bw = net.latency_s, net.bytes_per_s
    compute = float(seconds.max())
    coupling = 0.0
    if m > 1:
        lm = ceil_log2(m)
        coupling = max(math.ceil(n / facts.block_rows) * lm * lat + n * couple * (m - 1) / m / bw
                       for n in (int(x) for x in rows)) + (compute_factor(m) - 1.0) * compute
    ld = ceil_log2(d)
    reduce_s = ld * (lat + float(sums.stat.max()) / bw) if ld else 0.0
    broadcast = ld * (lat + float(sums.param.max()) / bw) if ld else 0.0
    if m > 1:
        broadcast += ceil_log2(m) * (lat + sums.split_param / bw)
    mstep = mstep_s(facts)
    total = compute + coupling + reduce_s + broadcast + mstep
    bd = Breakdown(compute_s=compute, coupling_s=coupling, reduce_s=reduce_s, broadcast_s=broadcast, mstep_s=mstep,
                   total_s=total)
    return Priced(breakdown=bd, fits=fits, rows=np.asarray(rows, dtype=np.int64), flops=flops, seconds=seconds,
                  memory=memory, sums=sums)


def evaluate(facts: ModelFacts, resources: Resources, n_data: int, leaf_shard, placement: list[list[int]],
             rows=None) -> Evaluation:
    """:func:`price` of one assignment with the per-worker loads spelled out."""
    grid = [list(row) for row in placement]
    p = price(facts, resources, n_data, shard_sums(facts, leaf_shard, len(grid[0])), grid, rows)
    workers = resources.workers
    loads = tuple(
        WorkerLoad(name=workers[w].name, replica=r, shard=s, rows=int(p.rows[r]), flops=float(p.flops[r, s]),
                   compute_s=float(p.seconds[r, s]), memory_bytes=int(math.ceil(p.memory[r, s])),
                   memory_limit=workers[w].memory_bytes)
        for r, row in enumerate(grid) for s, w in enumerate(row)
    )
    return Evaluation(breakdown=p.breakdown, loads=loads, sums=p.sums, fits=p.fits,
                      rows=tuple(int(x) for x in p.rows))


def leaf_shard_array(facts: ModelFacts, shard_of_leaf: dict[str, int]) -> np.ndarray:
    """``shard_of_leaf`` as an array in leaf pre-order (the caller checks completeness)."""
    return np.array([shard_of_leaf[p] for p in facts.leaf_paths], dtype=np.int64)
