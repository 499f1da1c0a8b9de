"""The two passes of one E-step over a model tree, shared by every executor.

*Upward*: each node's log density per row from its children's (leaves from data).
*Downward*: each node turns its row weights into its children's row weights and folds its
own sufficient statistics. Sibling leaves of one family under a mixture or HMM go through
their family's batched matrix kernels.

The same passes run on a model shard: a shard evaluates the subtrees it owns, the shards
of a replica exchange those subtrees' log densities (the coupling), every shard evaluates
the nodes above the owned subtrees from them, then each shard folds statistics for what it
owns (the first shard also for the nodes above). With one shard owning the root this is
exactly the single-process E-step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np

from .base import Node, batch_class, child_path
from .cost import block_bytes_per_row, tree_costs
from .data import Data, n_rows, take_rows
from .stats import Stats

#: Working-array budget of one row block (``cost.block_bytes_per_row``). It gives blocks of
#: 3,000-20,000 rows for mixtures of 8-16 diagonal or full Gaussians of dimension 8-24 and
#: for HMMs of 4 states over 10 positions. On a 2-core machine (2 MiB of L2 per core) an HMM
#: of 4 states ran fastest near 4,000 rows and 2x slower at 65,536; the mixtures' times
#: between 4,000 and 16,000 rows differed less than the machine's run-to-run noise (~30%).
BLOCK_BYTES = 8 * 2**20

# ---------------------------------------------------------------- units of the cost model
# ``Node.cost().flops_per_row`` counts the E-step's work in one unit: an arithmetic
# operation on one float64 element of a contiguous numpy array (also one element of a
# reduction or a copy). Work of other kinds is weighted by its time relative to that on the
# reference machine (one core, OpenBLAS); ``bench/cost_model.py`` fits the rate of the unit
# and checks that one rate predicts every family's measured time within 3x.
#: per FLOP of a matrix or matrix-vector product (2 per multiply-add) with a short inner
#: dimension or few output rows (a vector's ``d x d`` whitening, an HMM's ``K x K`` step);
MATMUL_FLOPS = 0.1
#: per FLOP of a wide product: a batched kernel's parameter matrix (one row per component)
#: times its block of features (an inner dimension of ``2d + 1`` or ``d (d + 3) / 2 + 1``).
#: BLAS keeps these in registers; mixtures of 1-32 Gaussians (d = 8, 16) added 0.04 per
#: FLOP with each component beyond the few whose products are bound by reading the block;
GEMM_FLOPS = 0.04
#: per element of a gather, scatter or bincount through an index array, a broadcast over
#: short rows, a transposing copy of a block's short rows (``d`` wide), or an exp or log
#: entangled with them;
SLOW_FLOPS = 3.2
#: per element of an exp or log over a whole contiguous array, or of a transposing copy of
#: a few long rows (a batched kernel's component weights; numpy's vectorized loops: 0.8,
#: 1.0 and 0.7-1.0 ns per element beside 0.58 for an add, on (4-32, 8000) arrays, one core);
VECTOR_FLOPS = 1.5
#: per element of a running sum (``cumsum``: a chain of dependent adds);
SCAN_FLOPS = 10.0
#: per row gathered from or scattered to scattered positions (a cache miss; at 100 the HMM
#: was predicted 1.1x and 1.8x its time on two machines, at 60 about 0.8x and 1.3x).
ROW_ACCESS_FLOPS = 60.0
# Work that does not grow with rows is interpreter time, in seconds: it varied far less
# between machines than the FLOP rate (a node's visit took 25 and 27 us on two machines
# whose calibrated rates were 1.8e9 and 2.8e9).
#: one Python-level visit of a node in one block's passes (``NodeCost.calls_per_block``):
#: 15-33 us per node per block, 25 us typical;
NODE_CALL_S = 25e-6
#: one node's M-step (``estimate``): 11-28 us per node, 20 us typical;
ESTIMATE_S = 20e-6
#: the EM loop's own work per iteration (the convergence test, the result's bookkeeping,
#: the callback, the in-process hand-over of statistics and model): 100-140 us beyond the
#: timed E- and M-step phases, 40 us within them, of a tiny model fitted locally.
ITERATION_S = 150e-6
#: Working-array budget of any one leaf (or batched kernel's shared block) per block: its
#: passes over its ``(rows, d)`` temporaries then run from cache (a lone DiagGaussian or
#: FullGaussian of dimension 16 ran 1.3x and 1.6x faster per row at 16,384 rows than at
#: 65,536).
LEAF_BLOCK_BYTES = 4 * 2**20
MIN_BLOCK_ROWS = 256
MAX_BLOCK_ROWS = 1 << 16


#: ``block_rows`` of the models in use (every worker asks for it several times per
#: iteration; a model is immutable, and the next iteration's is a new object).
_BLOCK_ROWS: "weakref.WeakKeyDictionary[Node, int]" = weakref.WeakKeyDictionary()


def block_rows(model: Node) -> int:
    """Rows per block so that one block's working arrays stay near ``BLOCK_BYTES`` and no
    leaf's beyond ``LEAF_BLOCK_BYTES``."""
    hit = _BLOCK_ROWS.get(model)
    if hit is None:
        hit = _BLOCK_ROWS[model] = _block_rows(model)
    return hit


def _block_rows(model: Node) -> int:
    costs = tree_costs(model)
    per_row = block_bytes_per_row(costs)
    per_leaf = max(max(c.batch_bytes_per_row, c.work_bytes_per_row + c.scratch_bytes_per_row if c.is_leaf else 0.0)
                   for c in costs)
    rows = min(BLOCK_BYTES // max(per_row, 1.0), LEAF_BLOCK_BYTES // max(per_leaf, 1.0))
    return int(min(MAX_BLOCK_ROWS, max(MIN_BLOCK_ROWS, rows)))


def _batch_family(node: Node, path: str, frontier) -> type | None:
    """The leaf class when all children are leaves of one class evaluated here, else None."""
    cls = batch_class(node)
    if cls is None:
        return None
    if frontier and any(child_path(path, i) in frontier for i in range(len(node.children))):
        return None
    return cls


class _Pass:
    """Caches of one block's upward pass, consumed by the downward pass."""

    def __init__(self, frontier: dict[str, np.ndarray] | None = None):
        self.frontier = frontier or {}
        self.ld: dict[str, np.ndarray] = {}
        self.aux: dict[str, tuple] = {}

    def up(self, node: Node, data: Data, path: str) -> np.ndarray:
        if path in self.frontier:
            ld = self.frontier[path]
        elif node.is_leaf:
            ld = node._log_density(data)
        else:
            cls = _batch_family(node, path, self.frontier)
            work = None
            if cls is None:
                child_lds = [self.up(c, node._child_data(data, i), child_path(path, i)) for i, c in enumerate(node.children)]
                ld, aux = node._combine(data, child_lds)
            elif getattr(cls, "_batch_prepare", None) is None:
                child_lds = cls._batch_log_density(node.children, node._child_data(data, 0))
                ld, aux = node._combine(data, child_lds)
            else:
                # one feature block serves both passes; a parent with per-child log offsets (a
                # mixture's log weights) has the kernel add them in its product, for free
                cd = node._child_data(data, 0)
                work = cls._batch_prepare(node.children, cd)
                offsets = getattr(node, "_child_log_offsets", None)
                if offsets is None:
                    child_lds = cls._batch_log_density(node.children, cd, work)
                    ld, aux = node._combine(data, child_lds)
                else:  # child_lds below are shifted by the offsets; _split does not read them
                    child_lds = cls._batch_log_density(node.children, cd, work, offsets)
                    ld, aux = node._combine_shifted(data, child_lds)
            self.aux[path] = (child_lds, aux, cls, work)
        self.ld[path] = ld
        return ld

    def down(self, node: Node, data: Data, w: np.ndarray, path: str, out: dict, *,
             stop: frozenset = frozenset(), reached: dict | None = None, own_stats: bool = True) -> None:
        if path in stop:
            reached[path] = w
            return
        if node.is_leaf:
            out[path] = node._accumulate(data, w)
            return
        child_lds, aux, cls, work = self.aux[path]
        child_ws, own = node._split(data, w, child_lds, self.ld[path], aux)
        if own_stats and node.has_own_stats:
            out[path] = own
        if cls is not None:
            cd = node._child_data(data, 0)
            W = np.asarray(child_ws)
            folded = cls._batch_accumulate(node.children, cd, W) if work is None else cls._batch_accumulate(node.children, cd, W, work)
            for i, s in enumerate(folded):
                out[child_path(path, i)] = s
            return
        for i, c in enumerate(node.children):
            self.down(c, node._child_data(data, i), child_ws[i], child_path(path, i), out,
                      stop=stop, reached=reached, own_stats=own_stats)


def subtree_data(model: Node, data: Data, path: str) -> Data:
    """The data a subtree reads (for a node under a sequence: one entry per position)."""
    node = model
    if path:
        for part in path.split("."):
            data = node._child_data(data, int(part))
            node = node.children[int(part)]
    return data


def shard_block(model: Node, data: Data, w: np.ndarray, owned: Sequence[str],
                exchange: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                first_shard: bool) -> tuple[dict, float]:
    """One block of rows on one model shard: own stats dict and its log-likelihood share.

    ``owned`` are this shard's owned-root paths; ``exchange`` sends their per-row log
    densities to the other shards of the replica and returns every owned root's. The
    log-likelihood is returned by the first shard only, so a sum over workers counts
    every row once.
    """
    out: dict = {}
    if list(owned) == [""]:
        p = _Pass()
        ld = p.up(model, data, "")
        p.down(model, data, w, "", out)
        return out, float(w @ ld)
    passes, mine = shard_up(model, data, owned)
    return shard_down(model, data, w, owned, passes, exchange(mine), first_shard)


def shard_up(model: Node, data: Data, owned: Sequence[str]) -> tuple[dict, dict[str, np.ndarray]]:
    """First half of :func:`shard_block`: the upward pass of every owned subtree.

    Returns the passes' caches (for :func:`shard_down`) and the owned roots' per-row log
    densities, which are what this shard sends to the other shards of its replica.
    """
    passes, mine = {}, {}
    for r in owned:
        p = _Pass()
        mine[r] = p.up(model.node_at(r), subtree_data(model, data, r), r)
        passes[r] = p
    return passes, mine


def shard_down(model: Node, data: Data, w: np.ndarray, owned: Sequence[str], passes: dict,
               every: dict[str, np.ndarray], first_shard: bool) -> tuple[dict, float]:
    """Second half of :func:`shard_block`, given every owned root's log density of the replica."""
    out: dict = {}
    upper = _Pass(frontier=every)
    ld = upper.up(model, data, "")
    reached: dict = {}
    upper.down(model, data, w, "", out, stop=frozenset(every), reached=reached, own_stats=first_shard)
    for r in owned:
        passes[r].down(model.node_at(r), subtree_data(model, data, r), reached[r], r, out)
    return out, (float(w @ ld) if first_shard else 0.0)


def e_step(model: Node, data: Data, w: np.ndarray | None = None, *, rows_per_block: int | None = None) -> tuple[Stats, float]:
    """Statistics and weighted log-likelihood of prepared data, block by block."""
    n = n_rows(data)
    w = np.ones(n) if w is None else w
    step = rows_per_block or block_rows(model)
    total: dict[str, list] = {}
    ll = 0.0
    for a in range(0, n, step):
        b = min(n, a + step)
        out, part = shard_block(model, take_rows(data, a, b), w[a:b], [""], lambda x: x, True)
        _fold_into(total, out)
        ll += part
    return (Stats({k: tuple(v) for k, v in total.items()}) if n > 0 else None), ll


def _fold_into(total: dict[str, list], out: dict) -> None:
    """``total += out`` key by key, in place (the same sums as ``Stats.__add__``, fewer arrays)."""
    for key, own in out.items():
        mine = total.get(key)
        if mine is None:
            total[key] = [np.array(v) if isinstance(v, np.ndarray) else v for v in own]  # copies
            continue
        for i, v in enumerate(own):
            m = mine[i]
            if type(m) is np.ndarray and m.dtype.kind == "f" and m.shape == getattr(v, "shape", None):
                m += v
            else:
                mine[i] = m + v


def log_density(model: Node, data: Data) -> np.ndarray:
    """Per-row log density of prepared data."""
    return _Pass().up(model, data, "")


def accumulate(model: Node, data: Data, w: np.ndarray) -> Stats:
    return e_step(model, data, w)[0]


def em_step(model: Node, data: Data, w: np.ndarray | None = None) -> tuple[Node, float]:
    """One EM iteration on prepared data: ``(new model, log-likelihood of the old one)``."""
    stats, ll = e_step(model, data, w)
    return model.estimate(stats), ll
