"""`batch`: data parallelism. Every data input is tiled along its batch dim (dim 0, where the
axis divides it, also when an earlier axis already tiles it: the axis then goes minor);
parameters get no action and stay replicated on the axis. `inputs=` globs say which inputs
are data (default: the inputs that are not carried state, see `data_paths`). A batch axis
that can tile no data input is an error, not a no-op.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from partir.ir.propagate import Decision
from partir.ir.specs import PlanError
from partir.strategies.base import AxisContext, Constraints, Strategy, path_globs


@dataclasses.dataclass(frozen=True)
class Batch(Strategy):
    """Tile the data inputs' batch dim on the axis; parameters stay replicated on it.
    `inputs`: globs of the data inputs (default: found from the program)."""

    inputs: tuple[str, ...] | None = None

    arguments = ("inputs",)

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        return Constraints(required=batch_decisions(ctx, priority))

    def check(self, ctx: AxisContext, own: Constraints, axis: Constraints) -> None:
        check_tiles_data(self, ctx, own, axis)

    @classmethod
    def check_argument(cls, key: str, value: Any, show: Callable[[Any], str] = repr) -> Any:
        return path_globs(
            value, "batch inputs", 'inputs="batch/*" or inputs=["batch/x", "batch/y"]'
        )


def batch(axis: str, inputs: tuple[str, ...] | list[str] | None = None) -> Batch:
    return Batch(axis, tuple(inputs) if inputs is not None else None)


def batch_decisions(ctx: AxisContext, priority: int) -> list[Decision]:
    """Dim 0 of every data input the axis divides (also one an earlier axis tiles)."""
    prog, prop, n = ctx.goal.program, ctx.goal.propagator, ctx.size
    out = []
    for vid in sorted(ctx.data):
        shape, sharding = prog.values[vid].shape, prop.sharding(ctx.state, vid)
        used = {a for axes in sharding for a in axes}
        if shape and ctx.axis not in used and shape[0] % (prop.size(sharding[0]) * n) == 0:
            out.append(Decision(priority, vid, 0, ctx.axis))
    return out


def check_tiles_data(s: Strategy, ctx: AxisContext, own: Constraints, axis: Constraints) -> None:
    """Data parallelism that tiles nothing is a mistake: say why, and what to do."""
    prop = ctx.goal.propagator
    if any(ctx.axis in axes for v in ctx.data for axes in prop.sharding(ctx.state, v)):
        return  # an earlier decision (a constraint, a tile statement) tiles the data already
    if any(d.value not in axis.forbidden for d in own.required):
        return
    raise PlanError(_tiles_nothing(s, ctx, axis.forbidden))


def _tiles_nothing(s: Strategy, ctx: AxisContext, forbidden: set[int]) -> str:
    prog, prop, data, n = ctx.goal.program, ctx.goal.propagator, ctx.data, ctx.size
    if not data:
        return (
            f"{s.name} on axis {s.axis!r}: the program has no data inputs (every input is "
            f"carried state); name them with {s.name}(inputs=...)"
        )
    if data <= forbidden:
        paths = ", ".join(prog.input_paths[v] for v in sorted(data)[:3])
        return (
            f"{s.name} on axis {s.axis!r}: a replicate statement keeps every data input "
            f"whole on it ({paths}); drop the replicate statement or the {s.name}"
        )
    dims = []
    for vid in sorted(data)[:3]:
        if vid in forbidden:
            dims.append(f"{prog.input_paths[vid]} kept whole by a replicate statement")
            continue
        shape, sharding = prog.values[vid].shape, prop.sharding(ctx.state, vid)
        earlier = f", already split {prop.size(sharding[0])} ways" if shape and sharding[0] else ""
        dims.append(f"{prog.input_paths[vid]} {shape[0] if shape else 'a scalar'}{earlier}")
    return (
        f"{s.name} on axis {s.axis!r} (size {n}) can tile no data input: it divides the leading "
        f"dim of none it may tile ({', '.join(dims)}{', ...' if len(data) > 3 else ''}); choose "
        "a mesh size that divides the batch size, or name the data inputs with batch(inputs=...)"
        + (", or shard only the parameters with zero(stage=3)" if s.name == "fsdp" else "")
    )
