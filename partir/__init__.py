"""partir: find SPMD partitioning plans for JAX programs."""

from partir import strategies
from partir.dsl import GoalError, load_goal, load_goal_text
from partir.goal import Goal, Search
from partir.ir.cost import Collective, Cost
from partir.ir.program import TraceError
from partir.ir.rules import UnknownPrimitiveWarning
from partir.ir.specs import PlanError
from partir.jax_api import jit
from partir.solver.baselines import expert_plans as baselines
from partir.solver.mesh_search import solve_goal as solve
from partir.solver.plan import Plan, evaluate
from partir.solver.plan import make_plan as plan
from partir.solver.prune import InfeasibleMemory
from partir.solver.verify import verify

__all__ = [
    "Collective",
    "Cost",
    "Goal",
    "GoalError",
    "InfeasibleMemory",
    "Plan",
    "PlanError",
    "Search",
    "TraceError",
    "UnknownPrimitiveWarning",
    "baselines",
    "evaluate",
    "jit",
    "load_goal",
    "load_goal_text",
    "plan",
    "solve",
    "strategies",
    "verify",
]
