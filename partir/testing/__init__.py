"""Checks and hypothesis strategies for property-based suites (see docs/testing.md)."""

from partir.testing.checks import (
    InvalidPlan,
    NumericsMismatch,
    check_numerics,
    check_plan,
    max_relative_error,
    real_args,
)
from partir.testing.strategies import (
    BAD_GOAL_KINDS,
    bad_goal_texts,
    goal_texts,
    goals,
    input_shapes,
    meshes,
    programs,
    schedules,
    shardings,
    specs,
)

__all__ = [
    "BAD_GOAL_KINDS",
    "InvalidPlan",
    "NumericsMismatch",
    "bad_goal_texts",
    "check_numerics",
    "check_plan",
    "goal_texts",
    "goals",
    "input_shapes",
    "max_relative_error",
    "meshes",
    "programs",
    "real_args",
    "schedules",
    "shardings",
    "specs",
]
