"""The baselines of ``bench/planner.py``, each priced with emgrid's cost model.

- ``mixle``: the mixle package's own ``balance_plan`` (0.8.x) run on the *equivalent mixle
  model* (same families, parameters and nesting); its grid, axis and contiguous cuts are
  mapped back onto emgrid's leaves (leaves outside mixle's chosen axis go to shard 0, the
  nearest emgrid equivalent of mixle replicating them). Its rows are those mixle's own data
  chunking gives (``mixle.utils.parallel.planner._chunk_ranges``: proportional to
  throughput, here each replica's slowest worker's, floors topped up where the share is
  most short), and its workers are placed in the best of three orders (the resources'
  order, fastest first by replica, fastest first by shard), all priced and the fastest
  fitting one kept;
- ``lpt`` and ``contiguous``: the planner's own heuristics on single leaves, for the best
  fitting grid ``D = min(n, P // M)`` over ``M`` in 1..64 and the powers of two beyond;
- ``megatron``: the smallest ``M`` whose equal-count contiguous split fits, ``D = P // M``.
"""

from __future__ import annotations

import numpy as np

from emgrid.models import HMM, Categorical, Composite, DiagGaussian, Exponential, FullGaussian, Gaussian, Mixture, Poisson
from emgrid.models import Sequence
from emgrid.models.base import Node
from emgrid.planner import BalancePlan, Resources, plan_from_assignment
from emgrid.planner.costing import model_facts, replica_rows
from emgrid.planner.heuristics import columns, contiguous, equal_count, lpt
from emgrid.planner.placement import default_layout, make_layout
from emgrid.planner.search import shard_counts
from emgrid.planner.units import build_units


# ---------------------------------------------------------------- mixle
def to_mixle(model: Node, index: dict, path: str = ""):
    """The equivalent mixle distribution; ``index[id(mixle node)] = emgrid path``."""
    from mixle.stats.combinator.composite import CompositeDistribution
    from mixle.stats.combinator.sequence import SequenceDistribution
    from mixle.stats.latent.hidden_markov import HiddenMarkovModelDistribution
    from mixle.stats.latent.mixture import MixtureDistribution
    from mixle.stats.multivariate.diagonal_gaussian import DiagonalGaussianDistribution
    from mixle.stats.multivariate.multivariate_gaussian import MultivariateGaussianDistribution
    from mixle.stats.univariate.continuous.exponential import ExponentialDistribution
    from mixle.stats.univariate.continuous.gaussian import GaussianDistribution
    from mixle.stats.univariate.discrete.categorical import CategoricalDistribution
    from mixle.stats.univariate.discrete.poisson import PoissonDistribution

    def kid(i):
        return to_mixle(model.children[i], index, f"{path}.{i}" if path else str(i))

    kids = [kid(i) for i in range(len(model.children))]
    if isinstance(model, Gaussian):
        out = GaussianDistribution(float(model.mean), float(model.var))
    elif isinstance(model, DiagGaussian):
        out = DiagonalGaussianDistribution(np.asarray(model.mean), np.asarray(model.var))
    elif isinstance(model, FullGaussian):
        out = MultivariateGaussianDistribution(np.asarray(model.mean), np.asarray(model.cov))
    elif isinstance(model, Categorical):
        out = CategoricalDistribution(dict(enumerate(np.asarray(model.probs).tolist())))
    elif isinstance(model, Poisson):
        out = PoissonDistribution(float(model.rate))
    elif isinstance(model, Exponential):
        out = ExponentialDistribution(1.0 / float(model.rate))
    elif isinstance(model, Composite):
        out = CompositeDistribution(kids)
    elif isinstance(model, Mixture):
        out = MixtureDistribution(kids, w=np.asarray(model.weights))
    elif isinstance(model, HMM):
        out = HiddenMarkovModelDistribution(kids, w=np.asarray(model.initial), transitions=np.asarray(model.transitions))
    elif isinstance(model, Sequence):
        out = SequenceDistribution(kids[0])
    else:
        raise TypeError(type(model).__name__)
    index[id(out)] = path
    return out


def _axis_paths(root) -> dict[str, object]:
    """mixle's axis path (as ``tree_axes`` spells it) of every node."""
    from mixle.stats.compute.decomposition import decomposition_for
    from mixle.utils.parallel.model_decomposition import cost_children, shard_children

    out = {}

    def walk(node, path):
        out[path or "/"] = node
        dc = decomposition_for(node)
        kids = shard_children(node, dc)
        for i, child in enumerate(cost_children(node)):
            pos = next((p for p, k in enumerate(kids) if k is child), None)
            role = dc.child_roles[pos] if pos is not None and pos < len(dc.child_roles) else f"owned_{i}"
            walk(child, f"{path}/{role}".lstrip("/"))

    walk(root, "")
    return out


def equal_rows(n: int, d: int) -> list[int]:
    return [n // d + (1 if r < n % d else 0) for r in range(d)]


def mixle_rows(n: int, throughput) -> list[int]:
    """Rows by mixle's chunking rule (``_chunk_ranges``): ``floor(w n)`` with ``w`` the
    normalized throughputs, one more where ``w - rows / n`` is largest until they sum to
    ``n``; a replica left without rows takes one from the largest (emgrid needs >= 1)."""
    w = np.asarray(throughput, dtype=np.float64)
    w = w / w.sum()
    rows = np.floor(w * n).astype(int)
    while rows.sum() < n:
        rows[int(np.argmax(w - rows / float(n)))] += 1
    while rows.sum() > n:
        rows[int(np.argmax(rows))] -= 1
    while (rows < 1).any():
        rows[int(np.argmax(rows))] -= 1
        rows[int(np.argmin(rows))] += 1
    return [int(r) for r in rows]


def mixle_plan(model: Node, resources: Resources, n_data: int) -> tuple[BalancePlan, dict]:
    """mixle's plan on the equivalent mixle model, as an emgrid plan, and mixle's own claims."""
    from mixle.stats.compute.decomposition import decomposition_for
    from mixle.utils.parallel.balance import balance_plan as mixle_balance
    from mixle.utils.parallel.model_decomposition import shard_children
    from mixle.utils.parallel.planner import DeviceSpec
    from mixle.utils.parallel.planner import Resources as MixleResources

    index: dict = {}
    root = to_mixle(model, index)
    devices = tuple(DeviceSpec(name=w.name, memory_bytes=w.memory_bytes, throughput=w.flops_per_s / 1e9)
                    for w in resources.workers)
    mp = mixle_balance(root, MixleResources(devices), n_data=n_data)
    facts = model_facts(model)
    d, m = mp.data_parallel, mp.model_parallel
    shard = {p: 0 for p in facts.leaf_paths}
    if m > 1 and mp.model_cuts:
        node = _axis_paths(root)[mp.extra["best_axis"]]
        kids = shard_children(node, decomposition_for(node))
        for k, cut in enumerate(mp.model_cuts):
            for unit in kids[cut.start:cut.stop]:
                top = index[id(unit)]
                for p in facts.leaf_paths:
                    if p == top or p.startswith(top + "."):
                        shard[p] = k
    used = sorted(set(shard.values()))
    relabel = {s: i for i, s in enumerate(used)}
    shard = {p: relabel[s] for p, s in shard.items()}
    m_eff = len(used)
    names = [w.name for w in resources.workers]
    speeds = np.array([w.flops_per_s for w in resources.workers])
    orders = {"resources": [[r * m + s for s in range(m_eff)] for r in range(d)],
              "speed/chunked": [list(row) for row in make_layout(resources, d, m_eff, "speed", "chunked").grid],
              "speed/striped": [list(row) for row in make_layout(resources, d, m_eff, "speed", "striped").grid]}
    best, how = None, None
    for order, grid in orders.items():
        rows = mixle_rows(n_data, speeds[np.asarray(grid)].min(axis=1))
        plan = plan_from_assignment(model, resources, n_data, data_parallel=d, model_parallel=m_eff,
                                    shard_of_leaf=shard, placement=[[names[i] for i in row] for row in grid],
                                    replica_rows=rows, rationale=f"mixle: {mp.rationale}")
        key = (plan.fits is False, plan.objective_s)
        if best is None or key < (best.fits is False, best.objective_s):
            best, how = plan, order
    return best, {"mixle_fits": mp.fits, "mixle_grid": f"{d}x{m}", "mixle_axis": mp.extra.get("best_axis"),
                  "mixle_order": how}


# ---------------------------------------------------------------- heuristic planners
def heuristic_plan(model: Node, resources: Resources, n_data: int, name: str) -> BalancePlan | None:
    """The best fitting plan of one leaf-level heuristic over the grids ``D = min(n, P // M)``."""
    facts = model_facts(model)
    fine = build_units(facts, facts.n_leaves)
    fn = {"lpt": lpt, "contiguous": contiguous}[name]
    best = None
    for m in shard_counts(resources.n_workers, facts.n_leaves):
        d = min(n_data, resources.n_workers // m)
        plan = _plan(model, resources, n_data, facts, fine, d, m, fn, name)
        if plan.fits is not False and (best is None or plan.objective_s < best.objective_s):
            best = plan
    return best


def megatron_plan(model: Node, resources: Resources, n_data: int) -> BalancePlan | None:
    """Smallest ``M`` whose equal-count contiguous split fits; ``D = P // M``."""
    facts = model_facts(model)
    fine = build_units(facts, facts.n_leaves)
    for m in range(1, min(resources.n_workers, facts.n_leaves) + 1):
        d = min(n_data, resources.n_workers // m)
        plan = _plan(model, resources, n_data, facts, fine, d, m, equal_count, "megatron")
        if plan.fits is not False:
            return plan
    return None


def _plan(model, resources, n_data, facts, fine, d, m, fn, name) -> BalancePlan:
    layout = default_layout(resources, d, m)
    speeds = np.array([w.flops_per_s for w in resources.workers])[np.asarray(layout.grid)]
    rows = replica_rows(n_data, speeds.min(axis=1))
    unit_shard = fn(fine, columns(facts, resources, layout.grid, rows))
    shard = {p: int(unit_shard[i]) for i, p in enumerate(facts.leaf_paths)}
    names = [w.name for w in resources.workers]
    placement = [[names[i] for i in row] for row in layout.grid]
    return plan_from_assignment(model, resources, n_data, data_parallel=d, model_parallel=m, shard_of_leaf=shard,
                                placement=placement, rationale=name)
