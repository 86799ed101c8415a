"""`zero(stage)`: ZeRO. Each parameter group's optimizer moments (stage 1, 2) and the
parameters too (stage 3) are tiled on the axis along their largest dim that the axis divides
and that every other strategy left whole, as the baseline plans do.

ZeRO goes last whatever the block order ("batch first, then Megatron, then ZeRO", as
Shardy's priorities): were it applied with its axis block, it would take the dims Megatron
needs on a later axis (checked on gpt: ZeRO-3 took w_in's hidden dim and left Megatron only
the worse one). So its decisions are deferred, and the search scores every plan with them
applied. Stage 2 needs no decision of its own: tiled moments propagate back into the
gradients, which become reduce-scatters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from partir.ir.groups import largest_dividing_dim
from partir.ir.propagate import Decision
from partir.strategies.base import AxisContext, Constraints, Strategy


@dataclasses.dataclass(frozen=True)
class Zero(Strategy):
    """ZeRO: tile optimizer state (stage 1), and gradients (2), and parameters (3) on the
    axis, along a dim that the axis divides."""

    stage: int = 3

    arguments = ("stage",)

    def __post_init__(self) -> None:
        self.check_argument("stage", self.stage)

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        return Constraints(deferred=[(priority + 1, self)])

    def deferred_decisions(self, ctx: AxisContext, priority: int) -> list[Decision]:
        return zero_decisions(ctx, priority, params=self.stage == 3)

    @classmethod
    def check_argument(cls, key: str, value: Any, show: Callable[[Any], str] = repr) -> Any:
        if isinstance(value, bool) or value not in (1, 2, 3):
            raise ValueError(f"zero stage must be 1, 2 or 3, not {show(value)}")
        return int(value)


def zero(axis: str, stage: int = 3) -> Zero:
    return Zero(axis, stage)


def zero_decisions(ctx: AxisContext, priority: int, *, params: bool) -> list[Decision]:
    """Per group, the moments (and the parameters, with `params`) tiled on the largest
    whole dim the axis divides; groups the axis already tiles are left as they are."""
    prop, prog = ctx.goal.propagator, ctx.goal.program
    out = []
    for g in ctx.groups:
        values = g.moments + (g.params if params else ())
        if not values:
            continue
        sharding = prop.sharding(ctx.state, values[0])
        if any(ctx.axis in axes for axes in sharding):
            continue
        shape = prog.values[values[0]].shape
        d = largest_dividing_dim(shape, ctx.size, exclude={d for d, a in enumerate(sharding) if a})
        if d is not None:
            out += [Decision(priority, v, d, ctx.axis) for v in values]
    return out
