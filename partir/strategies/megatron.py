"""`megatron`: tensor parallelism. The search may tile the weights that feed a matmul
(rank >= 2, through converts and reshapes) on any dim the axis divides and no earlier axis
tiles; data inputs are kept whole on the axis. It does not pin the residual stream: the cost
model charges whatever a choice implies, and the search keeps the cheap ones. It cannot
share an axis with data parallelism (`batch`, `fsdp`), which tiles what it keeps whole.
"""

from __future__ import annotations

import dataclasses

from partir.ir.groups import Action, matmul_operands
from partir.strategies.base import AxisContext, Constraints, Strategy


@dataclasses.dataclass(frozen=True)
class Megatron(Strategy):
    """Tensor parallelism: only weights of matmul chains may be tiled on the axis; data
    inputs are not; the search finds which weights and dims."""

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        weights = matmul_operands(ctx.goal.program)
        actions = [
            Action(g.name, d, g.members)
            for g in ctx.groups
            if g.params and len(g.shape) >= 2 and any(v in weights for v in g.params)
            for d in ctx.free_dims(g.members[0])
        ]
        return Constraints(actions=actions, forbidden=set(ctx.data))

    def conflicts_with(self, other: Strategy) -> str | None:
        if other.name in ("batch", "fsdp"):
            return (
                f"{other.name} tiles the data inputs on axis {self.axis!r} and megatron keeps "
                "them whole there; put data parallelism and megatron on different mesh axes"
            )
        return None


def megatron(axis: str) -> Megatron:
    return Megatron(axis)
