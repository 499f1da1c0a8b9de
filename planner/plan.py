"""The balance plan: a frozen, JSON-serializable record of the grid, the placement and why.

Field names of the seed planner are kept (``data_parallel``, ``model_parallel``,
``workers_used`` ...); an exact planner adds its proof status, bound, solve time and the
per-term breakdown of the predicted iteration time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .explain import explain as explain_plan


class ModelCut(BaseModel):
    """One model shard: the leaves it holds, the worker of each replica that runs it, its cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shard: int = Field(ge=0)
    workers: tuple[str, ...]  # workers[r] runs this shard for replica r
    leaves: tuple[str, ...]  # leaf paths held by this shard
    flops_per_row: float  # own FLOPs per root row of the nodes this shard evaluates
    param_bytes: int
    stat_bytes: int
    data_bytes_per_row: float
    work_bytes_per_row: float  # kept arrays of the nodes it evaluates
    scratch_bytes_per_row: float = 0.0  # the largest scratch among them


class WorkerLoad(BaseModel):
    """What one worker of the grid does per iteration and what it holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    replica: int
    shard: int
    rows: int
    flops: float  # per iteration
    compute_s: float
    memory_bytes: int  # predicted peak
    memory_limit: int | None


class Breakdown(BaseModel):
    """Predicted seconds per iteration, term by term (``total_s`` is their sum)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_s: float
    coupling_s: float
    reduce_s: float
    broadcast_s: float
    mstep_s: float = 0.0  # the coordinator's M-step and the loop's own work
    total_s: float


class BalancePlan(BaseModel):
    """A ``D x M`` worker grid for one EM fit, its leaf-to-shard map, and its predicted cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    data_parallel: int = Field(ge=1)
    model_parallel: int = Field(ge=1)
    workers_used: int
    workers_total: int
    model_cuts: tuple[ModelCut, ...]
    model_flops: float  # FLOPs per root row, whole model
    model_bytes: int  # parameter bytes, whole model
    per_worker_flops: float  # busiest worker's FLOPs per iteration
    fits: bool | None  # None when some used worker's memory is unknown
    rationale: str
    extra: dict[str, float | int | str | bool | None | list | dict] = Field(default_factory=dict)
    # What an exact planner knows.
    status: Literal["optimal", "feasible"]
    objective_s: float
    lower_bound_s: float
    solve_time_s: float
    predicted_iteration_s: float
    breakdown: Breakdown
    n_data: int = Field(ge=1)
    replica_rows: tuple[int, ...]  # rows of each replica, summing to n_data
    per_worker: tuple[WorkerLoad, ...]
    model_fingerprint: str
    resources_fingerprint: str
    #: the float type of the data and the E-step the figures are for (``optimize``'s ``dtype``)
    dtype: Literal["float64", "float32"] = "float64"

    @property
    def is_model_parallel(self) -> bool:
        return self.model_parallel > 1

    @property
    def workers_idle(self) -> int:
        return max(0, self.workers_total - self.workers_used)

    def shard_of_leaf(self) -> dict[str, int]:
        return {leaf: cut.shard for cut in self.model_cuts for leaf in cut.leaves}

    def worker_grid(self) -> list[list[str]]:
        """``grid[r][s]``: the worker running shard ``s`` of replica ``r``."""
        return [[self.model_cuts[s].workers[r] for s in range(self.model_parallel)] for r in range(self.data_parallel)]

    def replica_ranges(self) -> list[tuple[int, int]]:
        """Row range ``[start, stop)`` of every replica."""
        out, start = [], 0
        for n in self.replica_rows:
            out.append((start, start + n))
            start += n
        return out

    def to_json(self, **kw) -> str:
        return self.model_dump_json(**kw)

    @classmethod
    def from_json(cls, text: str) -> "BalancePlan":
        return cls.model_validate_json(text)

    def explain(self) -> str:
        """The plan told in a few lines (:func:`planner.explain.explain`)."""
        return explain_plan(self)
