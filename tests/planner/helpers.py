"""Small models and resources shared by the planner tests."""

from __future__ import annotations

import numpy as np

from emgrid.models import HMM, Categorical, Composite, DiagGaussian, FullGaussian, Gaussian, Mixture, Poisson, Sequence
from emgrid.planner import Network, Resources, SolverConfig, Worker
from emgrid.planner.costing import WORKER_BASE_BYTES, evaluate
from emgrid.planner.facts import model_facts

#: CP-SAT settings of every test: fixed seed, two search workers, short limit.
SOLVER = SolverConfig(seed=0, num_workers=2, time_limit_s=20.0)
#: A network where splitting a model pays off (MPI on one machine).
FAST_NET = Network(latency_s=1e-6, bytes_per_s=1e10)


def fg(d: int) -> FullGaussian:
    return FullGaussian(np.zeros(d), np.eye(d))


def dg(d: int) -> DiagGaussian:
    return DiagGaussian(np.zeros(d), np.ones(d))


def probs(k: int) -> np.ndarray:
    return np.ones(k) / k


def heavy_mixture(d: int = 64, full: int = 3, diag: int = 13) -> Mixture:
    """A few full-covariance components among many cheap diagonal ones."""
    return Mixture([fg(d) for _ in range(full)] + [dg(d) for _ in range(diag)], probs(full + diag))


def nest() -> Composite:
    """A heterogeneous nest: mixtures, an HMM, a sequence and a categorical."""
    return Composite([
        heavy_mixture(24, 2, 4),
        HMM([Gaussian(float(i), 1.0) for i in range(3)], np.full((3, 3), 1 / 3), probs(3), 6.0),
        Sequence(Poisson(2.0), 5.0),
        Categorical(probs(50)),
    ])


def small_nest() -> Composite:
    """Five leaves at three depths."""
    return Composite([Mixture([fg(6), dg(6), dg(6)], probs(3)), Sequence(Poisson(1.0), 4.0), Gaussian(0.0, 1.0)])


def uniform(n: int, memory=None, flops: float = 1e9, network: Network = FAST_NET) -> Resources:
    return Resources.uniform(n, memory_bytes=memory, flops_per_s=flops, network=network)


def mixed(speeds, memories, network: Network = FAST_NET) -> Resources:
    return Resources(workers=tuple(Worker(name=f"w{i}", flops_per_s=s, memory_bytes=m)
                                   for i, (s, m) in enumerate(zip(speeds, memories))), network=network)


def whole_model_memory(model, n_rows: int) -> int:
    """Bytes one worker needs to hold the whole model and ``n_rows`` rows."""
    facts = model_facts(model)
    return evaluate(facts, Resources.uniform(1), n_rows, np.zeros(facts.n_leaves, dtype=np.int64),
                    [[0]]).loads[0].memory_bytes


def memory_share(model, n_rows: int, fraction: float) -> int:
    """A worker memory holding ``fraction`` of what the whole model and ``n_rows`` rows need
    beyond the fixed base every worker has (``WORKER_BASE_BYTES``)."""
    return WORKER_BASE_BYTES + max(1, int(fraction * (whole_model_memory(model, n_rows) - WORKER_BASE_BYTES)))
