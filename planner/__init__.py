"""The exact balance planner: where the work of one EM iteration goes on a worker grid.

``balance_plan`` enumerates the ``D x M`` grids, prices them with one floating-point cost
model (``planner.costing``), and solves the leaf-to-shard placement exactly with CP-SAT;
``validate_plan`` checks any plan without the solver.

OR-Tools loads with ``planner.solve``, on first use of ``balance_plan``: plan types,
resources, ``plan_from_assignment`` and ``validate_plan`` (what the executors need to run
a plan) import without it.
"""

from emgrid.models.errors import InfeasiblePlanError, PlanError

from .build import plan_from_assignment
from .config import SolverConfig
from .plan import BalancePlan, Breakdown, ModelCut, WorkerLoad
from .resources import Network, Resources, Worker
from .validate import validate_plan

__all__ = [
    "Resources", "Worker", "Network", "SolverConfig", "balance_plan", "validate_plan", "BalancePlan", "ModelCut",
    "PlanError", "InfeasiblePlanError", "plan_from_assignment", "Breakdown", "WorkerLoad",
]


def __getattr__(name: str):
    if name == "balance_plan":
        from .solve import balance_plan

        globals()["balance_plan"] = balance_plan
        return balance_plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
