"""Solver settings of the exact planner."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SolverConfig(BaseModel):
    """How hard and how long the exact planner searches.

    ``time_limit_s`` bounds the whole ``balance_plan`` call (every grid together);
    ``relative_gap`` is the gap at which a grid's program counts as solved (``status`` is
    ``"optimal"`` when every grid is solved to it or pruned); ``seed`` and ``num_workers``
    go to CP-SAT. With ``deterministic`` (the default) CP-SAT interleaves its
    ``num_workers`` subsolvers one task at a time and every program stops at
    ``grid_deterministic_limit`` units of deterministic time, so a fixed seed gives the same
    plan unless the wall-clock limit cuts a solve first; ``deterministic=False`` runs the
    subsolvers in parallel threads (faster on many cores, not reproducible).
    ``max_units`` caps the placement units per program: larger trees place whole subtrees
    or runs of sibling leaves as one unit (see ``planner.units``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    time_limit_s: float = Field(default=10.0, gt=0)
    relative_gap: float = Field(default=1e-4, ge=0, lt=1)
    seed: int = Field(default=0, ge=0)
    num_workers: int = Field(default=8, ge=1)
    max_units: int = Field(default=256, ge=2)
    #: Deterministic-time budget of one grid's program (CP-SAT work units, about seconds).
    grid_deterministic_limit: float = Field(default=4.0, gt=0)
    #: Programs solved at most (the grids and layouts with the lowest bounds first).
    max_programs: int = Field(default=512, ge=1)
    #: Largest program solved: units times shards (bigger grids keep their heuristic plan).
    max_program_cells: int = Field(default=20_000, ge=1)
    deterministic: bool = True
    log_search: bool = False
