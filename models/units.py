"""Units of the cost model and the sizes of the E-step's row blocks.

``NodeCost.flops_per_row`` counts the E-step's work in one unit: an arithmetic operation on
one float64 element of a contiguous numpy array (also one element of a reduction or a
copy). Work of other kinds is weighted by its time relative to that unit on the reference
machine (one core, OpenBLAS); ``bench/cost_model.py`` fits the rate of the unit and checks
that one rate predicts every family's measured time. Work that does not grow with rows is
interpreter time, in seconds. The measurements behind each weight are in
``bench/results/cost_units.md``.
"""

from __future__ import annotations

#: per FLOP of a matrix or matrix-vector product (2 per multiply-add) with a short inner
#: dimension or few output rows (a vector's ``d x d`` whitening, an HMM's ``K x K`` step)
MATMUL_FLOPS = 0.1
#: per FLOP of a wide product: a batched kernel's parameter matrix (one row per component)
#: times its block of features (an inner dimension of ``2d + 1`` or ``d (d + 3) / 2 + 1``)
GEMM_FLOPS = 0.04
#: per element of a gather, scatter or bincount through an index array, a broadcast over
#: short rows, a transposing copy of a block's short rows (``d`` wide), or an exp or log
#: entangled with them
SLOW_FLOPS = 3.2
#: per element of an exp or log over a whole contiguous array, or of a transposing copy of
#: a few long rows (a batched kernel's component weights)
VECTOR_FLOPS = 1.5
#: per element of a running sum (``cumsum``: a chain of dependent adds)
SCAN_FLOPS = 10.0
#: per row gathered from or scattered to scattered positions (a cache miss)
ROW_ACCESS_FLOPS = 60.0

#: one Python-level visit of a node in one block's passes (``NodeCost.calls_per_block``)
NODE_CALL_S = 25e-6
#: one node's M-step (``estimate``)
ESTIMATE_S = 20e-6
#: the EM loop's own work per iteration (the convergence test, the result's bookkeeping,
#: the callback, the in-process hand-over of statistics and model)
ITERATION_S = 150e-6

#: Working-array budget of one row block (``cost.block_bytes_per_row``): blocks of a few
#: thousand rows stay in cache and are reused across iterations.
BLOCK_BYTES = 8 * 2**20
#: Working-array budget of any one leaf (or batched kernel's shared block) per block, so its
#: passes over its ``(rows, d)`` temporaries run from cache.
LEAF_BLOCK_BYTES = 4 * 2**20
MIN_BLOCK_ROWS = 256
MAX_BLOCK_ROWS = 1 << 16
