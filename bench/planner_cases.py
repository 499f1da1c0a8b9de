"""The benchmark cases of ``bench/planner.py``: heterogeneous nests on many grids.

Each case is a model builder, ``n_data`` and a resources builder; memory is "loose"
(unknown, so unconstrained) or "tight" (a fraction of what one worker would need to hold
the whole model and its rows), workers "uniform" or "mixed" (alternately twice as fast, and
with half again as much memory as the slow ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from emgrid.models import HMM, Categorical, Composite, DiagGaussian, FullGaussian, Gaussian, Mixture, Poisson, Sequence
from emgrid.models.base import Node
from emgrid.planner import Network, Resources, Worker
from emgrid.planner.costing import WORKER_BASE_BYTES, evaluate, leaf_bytes, model_facts
from emgrid.planner.resources import SHARED_MEMORY_MPI

MPI = SHARED_MEMORY_MPI  # ranks of one machine
ETHERNET = Network(latency_s=50e-6, bytes_per_s=1e9)


def fg(d: int) -> FullGaussian:
    return FullGaussian(np.zeros(d), np.eye(d))


def dg(d: int) -> DiagGaussian:
    return DiagGaussian(np.zeros(d), np.ones(d))


def mix(d: int, full: int, diag: int) -> Mixture:
    k = full + diag
    comps = [fg(d) if i % max(1, k // max(full, 1)) == 0 and i // max(1, k // max(full, 1)) < full else dg(d)
             for i in range(k)]
    return Mixture(comps, np.ones(k) / k)


def uniform_probs(k: int) -> np.ndarray:
    return np.ones(k) / k


MODELS: dict[str, Callable[[], Node]] = {
    "mix_heavy": lambda: mix(128, 4, 28),
    "mix_wide": lambda: mix(32, 16, 240),
    "comp_of_mixtures": lambda: Composite([mix(64, 2, 14), mix(32, 3, 21), mix(128, 1, 7), mix(16, 0, 32)]),
    "hmm_heavy": lambda: HMM([fg(48) for _ in range(8)], np.full((8, 8), 1 / 8), uniform_probs(8), 50.0),
    "comp_hmm": lambda: Composite([HMM([fg(32) for _ in range(6)], np.full((6, 6), 1 / 6), uniform_probs(6), 30.0),
                                   mix(64, 2, 10), Categorical(uniform_probs(5000)), Sequence(Poisson(3.0), 20.0)]),
    "large_vocab": lambda: Composite([Categorical(uniform_probs(2_000_000)), mix(16, 0, 8), Gaussian(0.0, 1.0)]),
    "big_tree": lambda: Composite([mix(8, 2, 62) for _ in range(32)]),
    "seq_nest": lambda: Sequence(mix(32, 2, 14), 40.0),
    "atomic": lambda: fg(1500),
}


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    n_data: int
    workers: int
    memory: str  # "loose" | "tight"
    speeds: str  # "uniform" | "mixed"
    network: Network
    tight_replicas: int = 0  # replicas at which "tight" is measured (0: a quarter of the workers)
    tight_fraction: float = 0.4

    def build(self, model: Node) -> Resources:
        """The resources. "Tight" memory: with ``tight_replicas`` replicas (a quarter of the
        workers by default), ``tight_fraction`` (40%) of what one worker needs for the whole
        model beyond every worker's fixed base, and at least 1.5 times the hungriest leaf's
        own need, so that splitting the model (or giving up replicas) is forced."""
        mem = None
        if self.memory == "tight":
            facts = model_facts(model)
            d = min(self.n_data, max(1, self.tight_replicas or self.workers // 4))
            rows = -(-self.n_data // d)
            # a worker's need for the whole model in a grid of d replicas (one replica holds
            # its parameters once, several three times: planner.costing.fixed_bytes)
            need = evaluate(facts, Resources.uniform(d), rows * d, np.zeros(facts.n_leaves, dtype=np.int64),
                            [[r] for r in range(d)], [rows] * d).loads[0].memory_bytes
            leaf = float(leaf_bytes(facts, rows, min(rows, facts.block_rows), d).max())
            mem = WORKER_BASE_BYTES + max(1, int(max(self.tight_fraction * (need - WORKER_BASE_BYTES), 1.5 * leaf)))
        workers = []
        for i in range(self.workers):
            fast = self.speeds == "mixed" and i % 2 == 0
            m = None if mem is None else (int(mem * 1.5) if fast else mem)
            workers.append(Worker(name=f"w{i}", memory_bytes=m, flops_per_s=4e9 if fast else 2e9))
        return Resources(workers=tuple(workers), network=self.network)


def cases() -> list[Case]:
    out = []
    for name in MODELS:
        if name == "atomic":
            out.append(Case("atomic/1e6/4/loose/uniform", name, 10**6, 4, "loose", "uniform", ETHERNET))
            out.append(Case("atomic/1/16/loose/mixed", name, 1, 16, "loose", "mixed", MPI))
            out.append(Case("atomic/1e6/16/tight/mixed", name, 10**6, 16, "tight", "mixed", ETHERNET, 16, 0.75))
            continue
        out.append(Case(f"{name}/1e6/8/loose/uniform", name, 10**6, 8, "loose", "uniform", ETHERNET))
        out.append(Case(f"{name}/1/64/loose/uniform", name, 1, 64, "loose", "uniform", MPI))
        out.append(Case(f"{name}/3/256/tight/mixed", name, 3, 256, "tight", "mixed", MPI))
        out.append(Case(f"{name}/1e6/1024/tight/uniform", name, 10**6, 1024, "tight", "uniform", ETHERNET))
        out.append(Case(f"{name}/1e6/16/tight/mixed", name, 10**6, 16, "tight", "mixed", ETHERNET, 16, 0.75))
    return out
