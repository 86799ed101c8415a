"""Compose one mesh axis's strategies into the constraints the search works under.

Each strategy's own module says what it means (`batch.py`, `zero.py`, ...). Here they are
chained, as optax chains its transformations: every strategy on the axis gets its own
priority in block order, their constraints add up, nothing they forbid is tiled (an action or
a required decision on a forbidden value is dropped), and then each strategy checks that the
combination leaves it something to do. The search's goal is the goal's objective.
"""

from __future__ import annotations

import dataclasses

from partir.goal import Goal
from partir.ir.groups import Action, Group
from partir.ir.propagate import Decision, State
from partir.ir.specs import PlanError, glob_match
from partir.strategies.base import AxisContext, Constraints, Strategy
from partir.strategies.manual import Replicate, Tile


@dataclasses.dataclass
class AxisProblem:
    axis: str
    required: list[Decision]
    actions: list[Action]
    forbidden: set[int]
    strategies: list[Strategy]
    deferred: list[tuple[int, Strategy]] = dataclasses.field(default_factory=list)


def schedule_axes(goal: Goal) -> list[str]:
    """Mesh axes in schedule order: first appearance in the schedule, then the rest."""
    order: list[str] = []
    for s in goal.schedule:  # each on an axis of the mesh (the Goal checked)
        if s.axis not in order and not isinstance(s, Tile | Replicate):
            order.append(s.axis)
    return order


def manual_decisions(goal: Goal) -> list[Decision]:
    """The `tile` statements' decisions, made before any axis is searched."""
    return [d for s in goal.schedule if isinstance(s, Tile) for d in s.decisions(goal)]


def tile_of(goal: Goal, d: Decision) -> Tile | None:
    """The tile statement that made manual decision `d`."""
    path = goal.program.input_paths[d.value]
    return next(
        (
            s
            for s in goal.schedule
            if isinstance(s, Tile)
            and s.axis == d.axis
            and s.dim == d.dim
            and glob_match(s.path, path)
        ),
        None,
    )


def compile_axis(
    goal: Goal, axis: str, state: State, groups: list[Group], priority: int
) -> AxisProblem:
    """The constraints of every strategy on `axis`, relative to `state` (earlier axes);
    the Goal checked that they do not contradict each other."""
    strategies = [s for s in goal.schedule if s.axis == axis]
    ctx = AxisContext(goal, axis, state, groups)
    own = [s.constrain(ctx, priority + k) for k, s in enumerate(strategies)]
    combined = Constraints()
    for c in own:
        combined += c
    for s, c in zip(strategies, own):
        try:
            s.check(ctx, c, combined)
        except PlanError as e:
            raise goal.strategy_error(s, str(e)) from None
    forbidden = combined.forbidden
    actions = [a for a in combined.actions if not forbidden & set(a.values)]
    required = [d for d in combined.required if d.value not in forbidden]
    return AxisProblem(axis, required, _dedupe(actions), forbidden, strategies, combined.deferred)


def zero_decisions(
    goal: Goal, state: State, groups: list[Group], deferred: list[tuple[int, Strategy]]
) -> list[Decision]:
    """The deferred strategies' decisions (ZeRO's, FSDP's) for `state`, in order."""
    out: list[Decision] = []
    for priority, s in deferred:
        out += s.deferred_decisions(AxisContext(goal, s.axis, state, groups), priority)
    return out


def _dedupe(actions: list[Action]) -> list[Action]:
    seen, out = set(), []
    for a in actions:
        if (a.values, a.dim) not in seen:
            seen.add((a.values, a.dim))
            out.append(a)
    return out
