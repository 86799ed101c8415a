"""Checks (and, later, hypothesis strategies) for property-based suites."""

from partir.testing.checks import (
    InvalidPlan,
    NumericsMismatch,
    check_numerics,
    check_plan,
    max_relative_error,
    real_args,
)

__all__ = [
    "InvalidPlan",
    "NumericsMismatch",
    "check_numerics",
    "check_plan",
    "max_relative_error",
    "real_args",
]
