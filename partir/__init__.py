"""partir: find SPMD partitioning plans for JAX programs."""

from partir import strategies as strategies
from partir.goal import Goal as Goal
from partir.goal import Search as Search
from partir.ir.cost import Collective as Collective
from partir.ir.cost import Cost as Cost
from partir.ir.specs import PlanError as PlanError
from partir.solver.plan import Plan as Plan
from partir.solver.plan import evaluate as evaluate
from partir.solver.plan import make_plan as plan
from partir.solver.verify import verify as verify

__all__ = [
    "Collective",
    "Cost",
    "Goal",
    "Plan",
    "PlanError",
    "Search",
    "evaluate",
    "plan",
    "strategies",
    "verify",
]
