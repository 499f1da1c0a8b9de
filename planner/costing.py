"""The one floating-point cost model of an EM iteration on a ``D x M`` grid.

Every figure a plan reports comes from :func:`evaluate`: the exact planner recomputes its
answer with it, the heuristics and baselines are priced with it, ``validate_plan`` checks
plans against it and the executors predict with it. Costs are the nodes' own costs per root
row from :func:`models.cost.tree_costs`, held as arrays in :class:`planner.facts.ModelFacts`
(``c_v`` below stands for any of them).

Which nodes a shard evaluates
    A node is *spanning* when its leaves lie on more than one shard
    (:func:`models.shard.spanning_nodes`). Shard ``s`` evaluates ``E_s`` = the nodes of the
    subtrees whose roots it holds (:func:`models.shard.shard_roots`) plus every spanning
    node: the spanning nodes are evaluated redundantly on every shard of a replica. With
    ``M = 1`` the only shard evaluates the whole tree. Shard sums ``X_s = sum_{v in E_s} x_v`` are taken of
    FLOPs (``F_s``), parameter (``P_s``), statistic (``S_s``) and kept working bytes
    (``W_s``); the scratch bytes ``X_s = max_{v in E_s} x_v`` (one node computes at a time).
    Data bytes ``D_s`` count every *data column* the shard touches once: the children of
    a mixture or an HMM read one column (``Node.shares_child_data``), and a shard holding
    three components of a mixture keeps one copy of it, as
    ``models.shard.restrict_columns`` does.

Rows
    Replica ``r`` takes ``rows_r`` consecutive rows (:func:`replica_rows`: proportional to
    the speed of the replica's slowest worker, integers summing to ``n_data``, each >= 1).
    ``B = models.engine.block_rows(model)`` rows form one block; ``b_r = min(rows_r, B)``.

Terms of the predicted iteration time (seconds; ``L(k) = ceil(log2 k)``, ``lat`` and
``bw`` the network's latency and bytes per second):

- compute   ``max_{r,s} rows_r * F_s / speed(r, s) + ceil(rows_r / B) * K_s * c`` (the
  busiest worker), ``K_s`` the shard's node visits per block (``NodeCost.calls_per_block``)
  and ``c = models.units.NODE_CALL_S`` the interpreter time of one;
- coupling  (``M > 1``) ``max_r [ceil(rows_r / B) * L(M) * lat + rows_r * C * (M-1)/M / bw]
  + SYNC_WAIT_SHARE * compute`` with ``C = models.shard.coupling_bytes_per_row``: an
  allgather of the owned roots' log densities among the ``M`` shards of a replica, once per
  block, and the wait for each block's slowest shard;
- reduce    ``L(D) * (lat + max_s S_s / bw)``: every shard's column reduces its shard's
  statistics over the ``D`` replicas to its head (``executors.mstep``);
- broadcast ``L(D) * (lat + max_s P_s / bw)`` plus, when ``M > 1``,
  ``L(M) * (lat + P_spanning / bw)``: each head's new subtrees go to its column's ``D``
  workers, and the spanning nodes' new parameters (estimated once, by the coordinator) to the
  ``M`` shards;
- M-step    ``ITERATION_S + n_nodes * ESTIMATE_S``: each column's head estimates its shard's
  subtrees and the coordinator the spanning nodes (``executors.mstep``), priced as one pass
  over every node plus the loop (the same for every plan of a model: it does not change
  which plan is best, only what it predicts).

The total is the sum of the five terms (the phases are synchronous).

Memory of worker ``(r, s)`` (bytes, its predicted peak)::

    D_s * rows_r + (W_s + X_s) * b_r + [M > 1] 2 C * b_r + H_s(D) + A(D)

    H_s(D) = 3 (P_s + S_s)          for D > 1
             P_s + S_s + Q_s        for D = 1
    A(D)   = A0 + [D = 1] max_v U_v

its rows of data (the leaves' columns and the spanning nodes' offsets), one block of working
arrays (``models.cost.NodeCost``: the kept arrays of every node it evaluates and the
largest scratch), two copies of one block's exchanged log densities
(:data:`COUPLING_COPIES`), its parameters and statistics (:func:`fixed_bytes`: three copies
when a column's reduce and new subtrees move them, :data:`PARAM_STAT_COPIES`; with one
replica once, with the kernels' caches ``Q_s``), and ``A`` (:func:`base_bytes`: the fixed
:data:`WORKER_BASE_BYTES`, with one replica also the largest node M-step ``U_v``,
:func:`mstep_peak_bytes`); the worker of cell ``(0, 0)`` adds
:func:`coordinator_bytes` when it also coordinates (``Resources.coordinator_in_grid``). A worker
whose memory is unknown (``None``) is unconstrained; a plan using one
reports ``fits=None`` unless a known worker already overflows.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from emgrid.models.cost import ceil_log2
from emgrid.models.units import ESTIMATE_S, ITERATION_S, NODE_CALL_S

# ``model_facts`` and ``leaf_shard_array`` are imported from here by bench/ as well.
from .facts import ModelFacts, leaf_shard_array, model_facts, worker_arrays  # noqa: F401
from .plan import Breakdown, WorkerLoad
from .resources import Resources


#: Copies of a worker's parameters and statistics at its peak when its shard's column has
#: other replicas (``D > 1``): the model it evaluates, the statistics it folds, and one
#: more of either in transit (a partial sum received in the column's reduce, the head's
#: new subtrees pickled for its column, the next model arriving). ``bench/memory.py``
#: measures it on a categorical mixture whose tables dominate (``bench/results/memory.md``).
#: With ``D = 1`` nothing is in transit: see :func:`fixed_bytes`.
PARAM_STAT_COPIES = 3.0


#: What a fitting worker holds above its baseline that grows with nothing above: messages
#: in flight, Python objects. Fitted by least squares to the workers' peak memory in
#: ``bench/soak.py`` (``bench/results/soak.md``; the terms in ``bench/results/memory.md``).
WORKER_BASE_BYTES = 2**18

#: Copies of a block's exchanged log densities a worker holds while the shards of its
#: replica exchange them: its own densities as computed, and every shard's message (its own
#: packed into it), which the downward pass reads in place (``executors.coupling``).
#: ``bench/soak.py`` compares two-shard workers with the plan (``bench/results/soak.md``).
COUPLING_COPIES = 2.0

#: With ``M > 1`` the shards of a replica meet once per block, so each waits for the
#: block's slowest shard: block-to-block jitter that balancing cannot remove, about a tenth
#: of the compute for two shards of equal work (``bench/scaling.py``, figures in
#: ``bench/results/scaling.md``).
SYNC_WAIT_SHARE = 0.1


#: Copies of the spanning nodes' parameters and statistics that the coordinator holds
#: beyond a worker's when it is a worker too (``Resources.coordinator_in_grid``): the
#: skeleton it estimates and the new one, its pickle for the workers, the columns' reports
#: and their join (``executors.mstep``; ``bench/memory.py --executor mpi`` measures it:
#: ``bench/results/memory_mpi.md``). The shards' own statistics and subtrees never reach it.
COORDINATOR_COPIES = 3.0


def coordinator_bytes(facts: ModelFacts, resources: Resources) -> float:
    """What cell ``(0, 0)`` holds beyond its worker's share when it also coordinates
    (:data:`COORDINATOR_COPIES` of the internal nodes' parameters and statistics, which
    bound the spanning nodes' of every placement; 0 when the coordinator is outside the grid).

    One figure for every placement keeps it a constant of the program; the internal nodes
    are mixture weights, HMM transitions, records: small beside the leaves."""
    if not resources.coordinator_in_grid:
        return 0.0
    internal = np.ones(len(facts.param), dtype=bool)
    internal[facts.leaf_nodes] = False
    return COORDINATOR_COPIES * float(facts.param[internal].sum() + facts.stat[internal].sum())


def compute_factor(m: int) -> float:
    """The compute term times this is compute plus the shards' per-block wait (M > 1)."""
    return 1.0 + SYNC_WAIT_SHARE if m > 1 else 1.0


def fixed_bytes(param, stat, cache, d: int):
    """A worker's bytes for parameters and statistics on a grid of ``d`` replicas.

    ``d > 1``: :data:`PARAM_STAT_COPIES` copies. ``d = 1``: what the worker holds, once:
    parameters, statistics and the kernels' caches (``NodeCost.cache_bytes``), its column
    being itself (no reduce, no new subtrees to send); its M-step's peak is
    :func:`mstep_peak_bytes`, added once per worker."""
    if d == 1:
        return param + stat + cache
    return PARAM_STAT_COPIES * (param + stat)


def least_fixed_bytes(param, stat, cache):
    """The smaller of :func:`fixed_bytes` over every ``d`` (for bounds that hold on every grid)."""
    return np.minimum(fixed_bytes(param, stat, cache, 1), fixed_bytes(param, stat, cache, 2))


def mstep_peak_bytes(facts: ModelFacts, d: int) -> float:
    """What a worker of a ``d = 1`` grid holds beyond :func:`fixed_bytes` while it
    re-estimates its subtrees (``executors.mstep.estimate_releasing``: one node at a time
    is held twice): the model's largest ``NodeCost.mstep_peak_bytes``, the same for every
    shard so that it stays a constant of the program. 0 for ``d > 1``, whose copies cover it."""
    return float(facts.mstep.max(initial=0.0)) if d == 1 else 0.0


def base_bytes(facts: ModelFacts, d: int) -> float:
    """Every worker's bytes that no placement changes: :data:`WORKER_BASE_BYTES` and the M-step's peak."""
    return WORKER_BASE_BYTES + mstep_peak_bytes(facts, d)


# ---------------------------------------------------------------- assignment -> shard sums
@dataclass(frozen=True, eq=False)
class ShardSums:
    """Per-shard sums over the evaluated nodes ``E_s`` and the totals over the spanning nodes."""

    spanning: np.ndarray  # bool per node
    node_shard: np.ndarray  # owning shard of a non-spanning node, -1 for spanning nodes
    flops: np.ndarray  # F_s, per root row
    param: np.ndarray  # P_s
    stat: np.ndarray  # S_s
    cache: np.ndarray  # the caches kept beside P_s
    data: np.ndarray  # D_s, per root row: every data column the shard touches, once
    work: np.ndarray  # W_s, per root row
    scratch: np.ndarray  # X_s, per root row: the largest scratch of the nodes the shard evaluates
    calls: np.ndarray  # K_s, node visits per block
    coupling_bytes_per_row: float  # C
    spanning_param: float  # P_spanning
    spanning_stat: float  # S_spanning
    leaves: tuple[tuple[int, ...], ...]  # leaf indices of every shard, pre-order


def shard_sums(facts: ModelFacts, leaf_shard, n_shards: int) -> ShardSums:
    """Evaluated-node sums of every shard for ``leaf_shard[i]`` = shard of leaf ``i``.

    A node's leaves are a contiguous run in pre-order, so it is spanning exactly when the
    shard changes between two consecutive leaves of its run.
    """
    leaf_shard = np.asarray(leaf_shard, dtype=np.int64)
    changes = np.concatenate([[0], np.cumsum(leaf_shard[1:] != leaf_shard[:-1])])
    spanning = changes[facts.leaf_hi - 1] != changes[facts.leaf_lo]
    node_shard = np.where(spanning, -1, leaf_shard[facts.leaf_lo])
    own = ~spanning

    def per_shard(x: np.ndarray, when_spanning: np.ndarray | None = None) -> np.ndarray:
        xs = x if when_spanning is None else when_spanning
        return np.bincount(node_shard[own], weights=x[own], minlength=n_shards)[:n_shards] + float(xs[spanning].sum())

    scratch = np.zeros(n_shards)
    np.maximum.at(scratch, node_shard[own], facts.scratch[own])
    scratch = np.maximum(scratch, float(facts.scratch_spanning[spanning].max(initial=0.0)))
    n_groups = len(facts.group_data)
    everywhere = np.zeros(n_groups, dtype=bool)
    everywhere[facts.data_group[spanning]] = True
    g_own = facts.data_group[own]
    keep = ~everywhere[g_own]
    pairs = np.unique(node_shard[own][keep] * n_groups + g_own[keep])
    data = np.bincount(pairs // n_groups, weights=facts.group_data[pairs % n_groups], minlength=n_shards)[:n_shards]
    data = data + float(facts.group_data[everywhere].sum())
    if spanning[0]:
        par = facts.parent
        roots = own & (par >= 0)
        roots[roots] = spanning[par[roots]]
        couple = float(facts.couple[roots].sum())
    else:
        couple = 0.0
    order = np.argsort(leaf_shard, kind="stable")
    bounds = np.searchsorted(leaf_shard[order], np.arange(n_shards + 1))
    leaves = tuple(tuple(order[bounds[s]:bounds[s + 1]].tolist()) for s in range(n_shards))
    return ShardSums(spanning=spanning, node_shard=node_shard, flops=per_shard(facts.flops), param=per_shard(facts.param),
                     stat=per_shard(facts.stat), cache=per_shard(facts.cache), data=data, work=per_shard(facts.work, facts.work_spanning),
                     scratch=scratch, calls=per_shard(facts.calls), coupling_bytes_per_row=couple,
                     spanning_param=float(facts.param[spanning].sum()), spanning_stat=float(facts.stat[spanning].sum()),
                     leaves=leaves)


def iteration_bytes(sums: ShardSums, d: int) -> tuple[float, float]:
    """The numbers the reduce and the broadcast move per iteration over the whole grid, as
    the executors count them (``FitResult.bytes_moved``, which adds pickle's framing): each
    shard's column tree-reduces ``D - 1`` partial sums of its statistics (the spanning
    nodes' only in the lead shard's) and its head reports the spanning nodes' statistics;
    the update sends each head's new subtrees to the ``D - 1`` others of its column and the
    spanning nodes' parameters to every worker (``executors.mstep``)."""
    m = len(sums.stat)
    own_param = float(sums.param.sum()) - m * sums.spanning_param
    reduce_b = (d - 1) * (float(sums.stat.sum()) - (m - 1) * sums.spanning_stat) + sums.spanning_stat
    broadcast_b = (d - 1) * own_param + d * m * sums.spanning_param
    return reduce_b, broadcast_b


def block_counts(rows, block_rows: int) -> np.ndarray:
    """Blocks of ``block_rows`` each row count takes (0 rows: none)."""
    return np.ceil(np.asarray(rows, dtype=np.float64) / block_rows)


def mstep_s(facts: ModelFacts) -> float:
    """The M-step term: the coordinator estimates every node and runs the loop."""
    return ITERATION_S + facts.n_nodes * ESTIMATE_S


def leaf_bytes(facts: ModelFacts, rows: int, block: int, d: int) -> np.ndarray:
    """Every leaf's own share of a worker's memory with ``rows`` rows (blocks of ``block``)
    on a grid of ``d`` replicas: its parameters and statistics, its data, its working arrays."""
    lv = facts.leaf_nodes
    return (fixed_bytes(facts.param, facts.stat, facts.cache, d)[lv] + facts.data[lv] * rows
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


def capped_rows(n_data: int, speeds, caps) -> list[int] | None:
    """Rows proportional to ``speeds`` as :func:`replica_rows`, but none above its replica's
    ``caps`` (the most rows its memory holds, :func:`row_caps`): a replica at its cap keeps
    it and the others share the rest, again by speed. None when the caps cannot hold
    ``n_data`` rows or some replica cannot hold one."""
    speeds = [float(s) for s in speeds]
    caps = [int(c) for c in caps]
    d = len(speeds)
    if d > n_data or min(caps) < 1 or sum(caps) < n_data:
        return None
    rows = [0] * d
    free, left = list(range(d)), n_data
    while free:  # water-filling: fix each replica whose share exceeds its cap, share the rest again
        total = sum(speeds[r] for r in free)
        over = [r for r in free if left * speeds[r] / total > caps[r]]
        if not over:
            break
        for r in over:
            rows[r] = caps[r]
            left -= caps[r]
        free = [r for r in free if r not in over]
    if free:
        if left < len(free):
            return None
        for r, x in zip(free, replica_rows(left, [speeds[r] for r in free])):
            rows[r] = x
    for r in range(d):  # rounding may lift a replica a row above its cap: move those rows on
        extra = rows[r] - caps[r]
        if extra <= 0:
            continue
        rows[r] = caps[r]
        for q in sorted(range(d), key=lambda q: rows[q] / speeds[q]):
            move = min(extra, caps[q] - rows[q])
            rows[q] += move
            extra -= move
        if extra:
            return None
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
    couple = sums.coupling_bytes_per_row if m > 1 else 0.0
    flops = rows_f[:, None] * sums.flops[None, :]
    seconds = flops / speed + block_counts(rows_f, facts.block_rows)[:, None] * (NODE_CALL_S * sums.calls)[None, :]
    memory = cell_memory(facts, resources, sums, m, rows_f)
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
        broadcast += ceil_log2(m) * (lat + sums.spanning_param / bw)
    mstep = mstep_s(facts)
    total = compute + coupling + reduce_s + broadcast + mstep
    bd = Breakdown(compute_s=compute, coupling_s=coupling, reduce_s=reduce_s, broadcast_s=broadcast, mstep_s=mstep,
                   total_s=total)
    return Priced(breakdown=bd, fits=fits, rows=np.asarray(rows, dtype=np.int64), flops=flops, seconds=seconds,
                  memory=memory, sums=sums)


def cell_memory(facts: ModelFacts, resources: Resources, sums: ShardSums, m: int, rows) -> np.ndarray:
    """``(d, m)`` bytes of every cell with ``rows[r]`` rows per replica (module docstring):
    data per row, working arrays per block row, fixed bytes for the grid's ``d``, the
    worker base, and the coordinator's bytes on cell ``(0, 0)``."""
    rows_f = np.asarray(rows, dtype=np.float64)
    d = rows_f.size
    block = np.minimum(rows_f, float(facts.block_rows))
    couple = sums.coupling_bytes_per_row if m > 1 else 0.0
    memory = (sums.data[None, :] * rows_f[:, None]
              + (sums.work + sums.scratch + COUPLING_COPIES * couple)[None, :] * block[:, None]
              + fixed_bytes(sums.param, sums.stat, sums.cache, d)[None, :] + base_bytes(facts, d))
    memory[0, 0] += coordinator_bytes(facts, resources)
    return memory


def row_caps(facts: ModelFacts, resources: Resources, n_data: int, sums: ShardSums, placement) -> np.ndarray:
    """The most rows (at most ``n_data``; 0: not one) each replica of ``placement`` can hold
    with the shards of ``sums``, every cell within its worker's memory as :func:`price`
    checks it (memory is non-decreasing in rows: bisection, all replicas at once)."""
    grid = np.asarray(placement, dtype=np.int64)
    d, m = grid.shape
    limit = worker_arrays(resources)[1][grid]
    lo, hi = np.zeros(d, dtype=np.int64), np.full(d, int(n_data), dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi + 1) // 2
        good = np.all(np.ceil(cell_memory(facts, resources, sums, m, mid)) <= limit, axis=1)
        lo, hi = np.where(good, mid, lo), np.where(good, hi, mid - 1)
    return lo


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
