"""`zero(stage)`: ZeRO. Each parameter group's optimizer moments (stage 1, 2) and the
parameters too (stage 3) are tiled on the axis along a dim that the axis divides and that
every other strategy left whole: during the search the largest, as the baseline plans do;
in the committed plan the dim the cost model chose (`dims`, set by the solver after the
search), which may be another or none at all (a tiny norm scale can cost more to gather
than it saves).

ZeRO goes last whatever the block order ("batch first, then Megatron, then ZeRO", as
Shardy's priorities): were it applied with its axis block, it would take the dims Megatron
needs on a later axis (checked on gpt: ZeRO-3 took w_in's hidden dim and left Megatron only
the worse one). So its decisions are deferred, and the search scores every plan with them
applied. Stage 2 needs no decision of its own: tiled moments propagate back into the
gradients, which become reduce-scatters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from partir.ir.groups import dims_that_divide, largest_dividing_dim
from partir.ir.propagate import Decision
from partir.strategies.base import AxisContext, Constraints, Strategy

GroupKey = tuple[str, tuple[int, ...]]
"""A group's name and shape: one group, the same in the program and its shallow copies."""

ZeroDims = tuple[tuple[GroupKey, "int | None"], ...]
"""(group key, dim or None) pairs: the dims a ZeRO-tiling strategy (zero, fsdp) was given
in place of its default; a group not named takes the largest dim. A tuple, so the strategy
stays a hashable value."""


@dataclasses.dataclass(frozen=True)
class Zero(Strategy):
    """ZeRO: tile optimizer state (stage 1), and gradients (2), and parameters (3) on the
    axis, along a dim that the axis divides."""

    stage: int = 3
    dims: ZeroDims = ()
    """The cost model's choice per group: a dim, or None for whole (see ZeroDims)."""

    arguments = ("stage",)

    def __post_init__(self) -> None:
        self.check_argument("stage", self.stage)

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        return Constraints(deferred=[(priority + 1, self)])

    def deferred_decisions(self, ctx: AxisContext, priority: int) -> list[Decision]:
        return zero_decisions(ctx, priority, params=self.stage == 3, dims=dict(self.dims))

    @classmethod
    def check_argument(cls, key: str, value: Any, show: Callable[[Any], str] = repr) -> Any:
        if isinstance(value, bool) or value not in (1, 2, 3):
            raise ValueError(f"zero stage must be 1, 2 or 3, not {show(value)}")
        return int(value)


def zero(axis: str, stage: int = 3) -> Zero:
    return Zero(axis, stage)


def zero_options(ctx: AxisContext, *, params: bool) -> dict[GroupKey, list[int]]:
    """Per group that ZeRO tiles (in `ctx.state`), the dims it may take: the whole dims the
    axis divides, the default (largest) first."""
    prop, prog = ctx.goal.propagator, ctx.goal.program
    out = {}
    for g in ctx.groups:
        values = g.moments + (g.params if params else ())
        if not values:
            continue
        sharding = prop.sharding(ctx.state, values[0])
        if any(ctx.axis in axes for axes in sharding):
            continue
        shape = prog.values[values[0]].shape
        taken = {d for d, a in enumerate(sharding) if a}
        first = largest_dividing_dim(shape, ctx.size, exclude=taken)
        if first is not None:
            others = [d for d in dims_that_divide(shape, ctx.size) if d not in taken | {first}]
            out[(g.name, g.shape)] = [first, *others]
    return out


def zero_decisions(
    ctx: AxisContext, priority: int, *, params: bool, dims: Mapping[GroupKey, int | None] = {}
) -> list[Decision]:
    """Per group, the moments (and the parameters, with `params`) tiled on the dim `dims`
    names for it (None: left whole), else on the largest whole dim the axis divides; groups
    the axis already tiles are left as they are."""
    options = zero_options(ctx, params=params)
    out = []
    for g in ctx.groups:
        key = (g.name, g.shape)
        if key not in options:
            continue
        d = dims.get(key, options[key][0])
        if d is not None and d in options[key]:
            values = g.moments + (g.params if params else ())
            out += [Decision(priority, v, d, ctx.axis) for v in values]
    return out
