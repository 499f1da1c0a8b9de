"""One grid layout's CP-SAT program: build it from the constraint families and solve it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from . import constraints
from .config import SolverConfig
from .constraints import Instance
from .costing import block_counts
from .placement import Layout
from .resources import Resources
from .scaling import Scale
from .units import UnitTree
from .variables import ShardVars


def make_instance(ut: UnitTree, resources: Resources, layout: Layout, rows, block_rows: int, scale: Scale,
                  reference_s: float, coordinator_bytes: float = 0.0) -> Instance:
    """The program data of ``layout`` with ``rows`` per replica; ``coordinator_bytes`` come
    off the memory of cell ``(0, 0)`` (``Resources.coordinator_in_grid``)."""
    g = np.asarray(layout.grid, dtype=np.int64)
    ws = resources.workers
    speed = np.array([w.flops_per_s for w in ws])[g]
    rows = np.asarray(rows, dtype=np.int64)
    blocks = block_counts(rows, block_rows)
    compute_pairs = []
    for s in range(g.shape[1]):
        pairs = sorted({(float(rows[r] / speed[r, s]), float(blocks[r])) for r in range(g.shape[0])},
                       reverse=True)
        keep: list[tuple[float, float]] = []  # by decreasing x: keep each whose y beats every kept one
        for x, y in pairs:
            if not keep or y > max(k[1] for k in keep):
                keep.append((x, y))
        compute_pairs.append(tuple(keep))
    mem_rows = []
    for s in range(g.shape[1]):
        pairs = sorted({(int(rows[r]), ws[g[r, s]].memory_bytes - (math.ceil(coordinator_bytes) if r == s == 0 else 0))
                        for r in range(g.shape[0]) if ws[g[r, s]].memory_bytes is not None},
                       key=lambda p: (p[1], -p[0]))
        keep = []  # drop pairs with no more rows and no less memory than a kept one
        for n, lim in pairs:
            if not any(n2 >= n and lim2 <= lim for n2, lim2 in keep):
                keep.append((n, lim))
        mem_rows.append(tuple(keep))
    profiles: dict[tuple, list[int]] = {}
    for s in range(g.shape[1]):
        profiles.setdefault(tuple((ws[w].flops_per_s, ws[w].memory_bytes) for w in g[:, s]), []).append(s)
    net = resources.network
    return Instance(ut=ut, d=g.shape[0], m=g.shape[1], rows=rows, compute_pairs=tuple(compute_pairs),
                    mem_rows=tuple(mem_rows),
                    classes=tuple(tuple(c) for c in profiles.values()), latency_s=net.latency_s,
                    bytes_per_s=net.bytes_per_s, block_rows=block_rows, scale=scale,
                    time_cap=scale.time_cap(reference_s))


@dataclass(frozen=True)
class ProgramResult:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown" | "model_invalid"
    unit_shard: np.ndarray | None
    objective_ticks: float | None
    bound_ticks: float | None
    wall_s: float
    deterministic_s: float


def build(inst: Instance) -> tuple[cp_model.CpModel, ShardVars]:
    """The program: every constraint family, the objective the sum of their shares."""
    model = cp_model.CpModel()
    v = ShardVars(model, inst.ut, inst.m)
    shares = [family(model, v, inst) for family in constraints.FAMILIES]
    model.minimize(sum(shares))
    return model, v


def solve_program(inst: Instance, hint: np.ndarray | None, cfg: SolverConfig, time_limit_s: float) -> ProgramResult:
    t0 = time.perf_counter()
    model, v = build(inst)
    if hint is not None:
        v.hint(model, hint)
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = max(0.01, time_limit_s - (time.perf_counter() - t0))
    p.max_deterministic_time = cfg.grid_deterministic_limit
    p.num_workers = cfg.num_workers
    p.random_seed = cfg.seed
    p.relative_gap_limit = cfg.relative_gap
    if cfg.deterministic and cfg.num_workers > 1:
        # one subsolver task at a time, in a fixed order: reproducible for a fixed seed
        # (larger interleaved batches stall the core-based bound search on these programs)
        p.interleave_search = True
        p.interleave_batch_size = 1
    p.log_search_progress = cfg.log_search
    code = solver.solve(model)
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible",
            cp_model.MODEL_INVALID: "model_invalid"}.get(code, "unknown")
    has = code in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    bound = solver.best_objective_bound if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN) else None
    return ProgramResult(status=name, unit_shard=v.extract(solver) if has else None,
                         objective_ticks=solver.objective_value if has else None, bound_ticks=bound,
                         wall_s=time.perf_counter() - t0, deterministic_s=solver.deterministic_time)
