"""Manual statements: `tile` pins the inputs matching a path glob to a dim on an axis, with
the highest priority (decisions made before any axis is searched); `replicate` keeps the
inputs matching a glob whole on an axis (the propagator blocks the axis on them, and no
strategy of the axis may tile them)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from partir.ir.messages import did_you_mean
from partir.ir.propagate import Decision
from partir.ir.specs import PlanError, glob_match
from partir.strategies.base import AxisContext, Constraints, Strategy

if TYPE_CHECKING:
    from partir.goal import Goal

MANUAL_PRIORITY = -1


@dataclasses.dataclass(frozen=True)
class Tile(Strategy):
    """Manual: tile the inputs matching `path` (a glob) along `dim` on the axis."""

    path: str = ""
    dim: int = 0

    def conflicts_with(self, other: Strategy) -> str | None:
        return None  # several tile statements may share an axis (the DSL checks overlaps)

    def decisions(self, goal: Goal) -> list[Decision]:
        prog = goal.program
        paths = [p for p in prog.inputs if glob_match(self.path, p)]
        if not paths:
            raise PlanError(
                f"tile: no input matches {self.path!r}{did_you_mean(self.path, prog.inputs)}"
            )
        return [Decision(MANUAL_PRIORITY, prog.inputs[p], self.dim, self.axis) for p in paths]


@dataclasses.dataclass(frozen=True)
class Replicate(Strategy):
    """Manual: keep the inputs matching `path` (a glob) whole on the axis."""

    path: str = ""

    def conflicts_with(self, other: Strategy) -> str | None:
        return None  # several replicate statements may share an axis

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        prop = ctx.goal.propagator  # the inputs were matched once, by Goal.replicated
        return Constraints(forbidden={v for v in prop.blocked if prop.blocks(v, ctx.axis)})


def tile(path: str, dim: int, axis: str) -> Tile:
    return Tile(axis, path, dim)


def replicate(path: str, axis: str) -> Replicate:
    return Replicate(axis, path)
