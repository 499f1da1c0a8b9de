"""The exact balance planner: where the work of one EM iteration goes on a worker grid.

``balance_plan`` enumerates the ``D x M`` grids, prices them with one floating-point cost
model (``planner.costing``), and solves the leaf-to-shard placement exactly with CP-SAT;
``validate_plan`` checks any plan without the solver.
"""

from emgrid.models.errors import InfeasiblePlanError, PlanError

from .build import plan_from_assignment
from .config import SolverConfig
from .plan import BalancePlan, Breakdown, ModelCut, WorkerLoad
from .resources import Network, Resources, Worker
from .solve import balance_plan
from .validate import validate_plan

__all__ = [
    "Resources", "Worker", "Network", "SolverConfig", "balance_plan", "validate_plan", "BalancePlan", "ModelCut",
    "PlanError", "InfeasiblePlanError", "plan_from_assignment", "Breakdown", "WorkerLoad",
]
