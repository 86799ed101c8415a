"""`fsdp`: fully sharded data parallelism, `batch` and `zero(stage=3)` on one axis: the data
inputs' batch dim is tiled (as `batch` does, an error when it can tile none) and every
parameter group with its moments is tiled as ZeRO-3 does, deferred to the end."""

from __future__ import annotations

import dataclasses

from partir.ir.propagate import Decision
from partir.strategies.base import AxisContext, Constraints, Strategy
from partir.strategies.batch import batch_decisions, check_tiles_data
from partir.strategies.zero import ZeroDims, zero_decisions


@dataclasses.dataclass(frozen=True)
class FSDP(Strategy):
    """Fully sharded data parallelism: batch + zero(stage=3) on one axis."""

    dims: ZeroDims = ()
    """The cost model's choice of ZeRO dims (see `partir.strategies.zero.ZeroDims`)."""

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        return Constraints(required=batch_decisions(ctx, priority), deferred=[(priority + 1, self)])

    def check(self, ctx: AxisContext, own: Constraints, axis: Constraints) -> None:
        check_tiles_data(self, ctx, own, axis)

    def deferred_decisions(self, ctx: AxisContext, priority: int) -> list[Decision]:
        return zero_decisions(ctx, priority, params=True, dims=dict(self.dims))


def fsdp(axis: str) -> FSDP:
    return FSDP(axis)
