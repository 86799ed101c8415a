"""`expert`: expert parallelism for mixture-of-experts layers. The experts dim (dim 0) of
every MoE weight (rank >= 3, a path with `moe` or `experts` in it) is tiled on the axis
where the axis divides it and no earlier axis tiles it."""

from __future__ import annotations

import dataclasses

from partir.ir.propagate import Decision
from partir.strategies.base import AxisContext, Constraints, Strategy


@dataclasses.dataclass(frozen=True)
class Expert(Strategy):
    """Expert parallelism: tile the experts dim of mixture-of-experts weights."""

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        required = []
        for g in ctx.groups:
            moe = "moe" in g.name.split("/") or "experts" in g.name
            if moe and g.params and len(g.shape) >= 3 and 0 in ctx.free_dims(g.members[0]):
                required += [Decision(priority, v, 0, ctx.axis) for v in g.members]
        return Constraints(required=required)


def expert(axis: str) -> Expert:
    return Expert(axis)
