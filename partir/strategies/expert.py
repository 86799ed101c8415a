"""`expert`: expert parallelism for mixture-of-experts layers. The experts dim of every MoE
weight is tiled on the axis, where the axis divides it and no earlier axis tiles it. A MoE
weight is found by structure: a parameter whose dim is a batch dim of a matmul
(`einsum("ecd,edf->ecf", x, w)`, `ir.groups.expert_dims`; in a scanned layer stack, one dim
further in), or whose dim a router's choice indexes (`w[top_k(logits)[1]]`); or by name:
rank >= 3 inside a block named `moe*` or `*_moe*` (MaxText's `MoeBlock_0`) or `experts`,
its router (`gate`, `router`) aside (dim 0). `params=` globs override both: the parameters
they match are the MoE weights (their experts dim found by structure, else dim 0), and no
others. An expert axis that finds no such weight is an error, not a no-op.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from partir.ir.groups import expert_dims
from partir.ir.propagate import Decision
from partir.ir.specs import PlanError, glob_match
from partir.strategies.base import AxisContext, Constraints, Strategy, path_globs


@dataclasses.dataclass(frozen=True)
class Expert(Strategy):
    """Expert parallelism: tile the experts dim of mixture-of-experts weights. `params`:
    globs of the MoE weights (default: found from the program)."""

    params: tuple[str, ...] | None = None

    arguments = ("params",)

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        prog = ctx.goal.program
        by_structure = expert_dims(prog)
        required = []
        for g in ctx.groups:
            if not g.params:
                continue
            dim = by_structure.get(g.params[0])
            if self.params is not None:
                paths = [prog.input_paths[v] for v in g.params]
                if not any(glob_match(p, q) for p in self.params for q in paths):
                    continue
                dim = 0 if dim is None else dim
            elif dim is None and len(g.shape) >= 3 and _named_moe(g.name):
                dim = 0
            if dim is not None and dim in ctx.free_dims(g.members[0]):
                required += [Decision(priority, v, dim, ctx.axis) for v in g.members]
        return Constraints(required=required)

    @classmethod
    def check_argument(cls, key: str, value: Any, show: Callable[[Any], str] = repr) -> Any:
        return path_globs(
            value, "expert params", 'params="**/moe/*" or params=["**/w_in", "**/w_out"]'
        )

    def check(self, ctx: AxisContext, own: Constraints, axis: Constraints) -> None:
        if any(d.value not in axis.forbidden for d in own.required):
            return
        prop = ctx.goal.propagator
        if any(
            ctx.axis in a
            for g in ctx.groups
            for v in g.params[:1]
            for a in prop.sharding(ctx.state, v)
        ):
            return  # an earlier decision (a tile statement, a constraint) did it already
        if self.params is not None:
            raise PlanError(
                f"expert(params={list(self.params)}) on axis {ctx.axis!r} (size {ctx.size}) "
                "tiles nothing: the globs match no parameter whose experts dim the axis "
                'divides; write globs of the MoE weights\' paths, like params="**/moe/*"'
            )
        raise PlanError(
            f"expert on axis {ctx.axis!r} (size {ctx.size}) finds no mixture-of-experts weight "
            "to tile: none has a dim that is a batch dim of a matmul (einsum 'ecd,edf->ecf') or "
            "a path with 'moe' or 'experts' in it, whose experts dim the axis divides; choose "
            "a mesh size that divides the number of experts, or drop expert from this axis"
        )


_MOE_BLOCK = re.compile(r"(^|_)moe")  # moe, MoeBlock_0, sparse_moe; not remove, amoeba
_ROUTER = frozenset(("gate", "gating", "router"))  # a MoE block's router: not an expert weight


def _named_moe(name: str) -> bool:
    """A path inside a mixture-of-experts block (`moe/w_in`, MaxText's `MoeBlock_0/wi_0`,
    `experts/...`) that is not its router (`MoeBlock_0/gate/kernel`)."""
    parts = [p.lower() for p in name.split("/")]
    if _ROUTER & set(parts):
        return False
    return any(_MOE_BLOCK.search(p) for p in parts) or "experts" in name


def expert(axis: str, params: tuple[str, ...] | list[str] | str | None = None) -> Expert:
    return Expert(axis, None if params is None else Expert.check_argument("params", params))
