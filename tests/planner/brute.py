"""Exhaustive optimum of the plan space, for checking the exact planner on small instances.

The plan space is the planner's: every grid ``D x M``, every distinct layout of it
(``planner.placement``), rows by the speed rule, and every assignment of leaves to ``M``
labelled shards with none empty; each is priced by ``planner.costing``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from emgrid.planner.costing import price, replica_rows, shard_sums
from emgrid.planner.facts import model_facts
from emgrid.planner.placement import candidate_layouts
from emgrid.planner.solve import enumerate_grids


def assignments(n_leaves: int, m: int):
    """Every map of ``n_leaves`` leaves onto ``m`` shards using all of them."""
    for combo in itertools.product(range(m), repeat=n_leaves):
        if len(set(combo)) == m:
            yield np.array(combo, dtype=np.int64)


def brute_force(model, resources, n_data: int, grid=None) -> tuple[float, tuple | None]:
    """``(best total, (d, m, layout name, leaf shards))``; ``(inf, None)`` when nothing fits."""
    facts = model_facts(model)
    grids = [grid] if grid is not None else enumerate_grids(resources.n_workers, n_data, facts.n_leaves)
    best, arg = math.inf, None
    speeds = np.array([w.flops_per_s for w in resources.workers])
    for d, m in grids:
        combos = list(assignments(facts.n_leaves, m))
        for layout in candidate_layouts(resources, d, m):
            rows = replica_rows(n_data, speeds[np.asarray(layout.grid)].min(axis=1))
            for leaf_shard in combos:
                p = price(facts, resources, n_data, shard_sums(facts, leaf_shard, m), layout.grid, rows)
                if p.fits is not False and p.breakdown.total_s < best:
                    best, arg = p.breakdown.total_s, (d, m, layout.name, leaf_shard)
    return best, arg
