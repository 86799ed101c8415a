"""`megatron`: tensor parallelism. The search may tile the weights that feed a matmul
(rank >= 2, through converts and reshapes) on any dim the axis divides and no earlier axis
tiles, or that only earlier megatron axes tile (it then goes minor: megatron on `tensor:0`
and `tensor:1`, the two parts of a split axis, cuts query heads the whole 16 ways), and a table that is only looked up (an untied embedding) on its looked-up dim, as
Megatron-LM's vocab-parallel embedding does (each device looks up the rows it holds; an
all-reduce completes the lookup); data inputs are kept whole on the axis. It does not pin
the residual stream: the cost model charges whatever a choice implies, and the search keeps
the cheap ones. It cannot share an axis with data parallelism (`batch`, `fsdp`), which tiles
what it keeps whole.

A scanned layer stack's layer dim stays an action: each iteration then gathers its layer
(ZeRO over the layers, on the megatron axis), and on MaxText's llama2 at data 2 x fsdp 2 x
tensor 2 the search's plan tiled the value kernels' layer dim and XLA moved 0.97x MaxText's
bytes; with the layer dim left out it moved 1.06x.
"""

from __future__ import annotations

import dataclasses

from partir.ir.groups import Action, gathered_tables, matmul_operands
from partir.strategies.base import AxisContext, Constraints, Strategy


@dataclasses.dataclass(frozen=True)
class Megatron(Strategy):
    """Tensor parallelism: only weights of matmul chains may be tiled on the axis; data
    inputs are not; the search finds which weights and dims."""

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        weights = matmul_operands(ctx.goal.program)
        tables = gathered_tables(ctx.goal.program)
        stacks_on = {
            s.axis for s in ctx.goal.schedule if isinstance(s, Megatron) and s.axis != self.axis
        }
        actions = []
        for g in ctx.groups:
            if not g.params or len(g.shape) < 2:
                continue
            free = ctx.free_dims(g.members[0], minor_to=stacks_on)
            if any(v in weights for v in g.params):
                actions += [Action(g.name, d, g.members) for d in free]
            else:
                looked_up = {tables[v] for v in g.params if v in tables}
                actions += [Action(g.name, d, g.members) for d in free if d in looked_up]
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
