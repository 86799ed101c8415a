"""Compile the sub-strategies of one mesh axis into constraints for the search.

Each strategy yields decisions it requires, values it forbids tiling on the axis, the
actions the search may take there, and nothing else: the search's goal is the goal's
objective. Several strategies may share an axis; their constraints add up.

Semantics, and where they differ from a literal reading of the design:
- `batch`: every data input is tiled along its batch dim (dim 0, where the axis divides
  it; `inputs=` globs override which inputs are data). Parameters get no action.
- `zero(stage)`: each parameter group's optimizer moments (stage 1, 2) and parameters too
  (stage 3) are tiled along their largest dim that the axis divides and that every other
  strategy left whole, as the expert plans do. ZeRO goes last whatever the block order
  ("batch first, then Megatron, then ZeRO", as Shardy's priorities): were it applied with
  its axis block, it would take the dims Megatron needs on a later axis (checked on gpt:
  ZeRO-3 took w_in's hidden dim and left Megatron only the worse one). So its decisions
  are deferred, and the search scores every plan with them applied (`finish`). Stage 2
  needs no decision of its own: tiled moments propagate back into the gradients, which
  become reduce-scatters.
- `megatron`: actions on weights that feed a matmul (rank >= 2), any dim that divides;
  data inputs are forbidden. It does not pin the residual stream: the cost model charges
  whatever a choice implies, and the search keeps the cheap ones.
- `expert`: the experts dim (dim 0) of mixture-of-experts weights is required.
- `auto`: actions on every group, any dim that the axis divides, also one an earlier axis
  tiles, where their sizes multiply to a divisor (so the batch dim can be split over two
  axes: on gpt small 2x4, auto on both axes went from 1.14x to 0.95x the FSDP expert).
- `tile` / `replicate`: decisions of the highest priority / values forbidden on the axis.
"""

from __future__ import annotations

import dataclasses

from partir.goal import Goal
from partir.ir.groups import (
    Action,
    Group,
    dims_that_divide,
    largest_dividing_dim,
    matmul_operands,
)
from partir.ir.propagate import Decision, State
from partir.ir.specs import PlanError, did_you_mean, glob_match
from partir.strategies.base import (
    FSDP,
    Auto,
    Batch,
    Expert,
    Megatron,
    Replicate,
    Strategy,
    Tile,
    Zero,
    conflict,
)

MANUAL_PRIORITY = -1


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
    for s in goal.schedule:
        if s.axis not in goal.mesh:
            raise PlanError(
                f"strategy {s.name} names mesh axis {s.axis!r}, which the mesh "
                f"{goal.mesh} lacks{did_you_mean(s.axis, goal.mesh)}"
            )
        if s.axis not in order and not isinstance(s, Tile | Replicate):
            order.append(s.axis)
    return order


def manual_decisions(goal: Goal) -> list[Decision]:
    prog = goal.program
    out = []
    for s in goal.schedule:
        if isinstance(s, Tile):
            paths = [p for p in prog.inputs if glob_match(s.path, p)]
            if not paths:
                raise PlanError(f"tile: no input matches {s.path!r}"
                                f"{did_you_mean(s.path, prog.inputs)}")  # fmt: skip
            out += [Decision(MANUAL_PRIORITY, prog.inputs[p], s.dim, s.axis) for p in paths]
    return out


def data_paths(goal: Goal, strategies: list[Strategy]) -> list[str]:
    prog = goal.program
    for s in strategies:
        if isinstance(s, Batch) and s.inputs is not None:
            return [p for p in prog.inputs if any(glob_match(g, p) for g in s.inputs)]
    if goal.data_inputs is not None:
        return [p for p in prog.inputs if any(glob_match(g, p) for g in goal.data_inputs)]
    carried = set(prog.carried.values())
    return [p for p in prog.inputs if p not in carried]


def compile_axis(
    goal: Goal, axis: str, state: State, groups: list[Group], priority: int
) -> AxisProblem:
    """The constraints of every strategy on `axis`, relative to `state` (earlier axes)."""
    prog, prop = goal.program, goal.propagator
    n = goal.mesh[axis]
    strategies = [s for s in goal.schedule if s.axis == axis]
    why = conflict(strategies)
    if why is not None:
        raise PlanError(why)
    required: list[Decision] = []
    actions: list[Action] = []
    forbidden: set[int] = set()
    deferred: list[tuple[int, Strategy]] = []
    data = {prog.inputs[p] for p in data_paths(goal, strategies)}
    matmul_weights = matmul_operands(prog)

    def free_dims(vid: int) -> list[int]:
        s = prop.sharding(state, vid)
        return [d for d in dims_that_divide(prog.values[vid].shape, n) if not s[d]]

    def divisible_dims(vid: int) -> list[int]:
        """Dims the axis can tile, also those an earlier axis tiles (it then goes minor)."""
        dims = range(len(prog.values[vid].shape)) if n > 1 else ()
        return [d for d in dims if prop.can_apply(state, Decision(priority, vid, d, axis))]

    batching: list[tuple[Strategy, int]] = []
    for k, s in enumerate(strategies):
        prio = priority + k
        if isinstance(s, Batch | FSDP):
            batching.append((s, prio))
            for vid in sorted(data):  # dim 0, also when an earlier axis already tiles it
                shape, sharding = prog.values[vid].shape, prop.sharding(state, vid)
                used = {a for axes in sharding for a in axes}
                if shape and axis not in used and shape[0] % (prop.size(sharding[0]) * n) == 0:
                    required.append(Decision(prio, vid, 0, axis))
        if isinstance(s, Zero | FSDP):
            deferred.append((prio + 1, s))
        if isinstance(s, Megatron):
            forbidden |= data
            for g in groups:
                if g.params and len(g.shape) >= 2 and any(v in matmul_weights for v in g.params):
                    actions += [Action(g.name, d, g.members) for d in free_dims(g.members[0])]
        if isinstance(s, Auto):
            for g in groups:
                actions += [Action(g.name, d, g.members) for d in divisible_dims(g.members[0])]
        if isinstance(s, Expert):
            for g in groups:
                moe = "moe" in g.name.split("/") or "experts" in g.name
                if moe and g.params and len(g.shape) >= 3 and 0 in free_dims(g.members[0]):
                    required += [Decision(prio, v, 0, axis) for v in g.members]
        if isinstance(s, Replicate):  # matched once, by Goal.replicated
            forbidden |= {v for v in prop.blocked if prop.blocks(v, axis)}
    actions = [a for a in actions if not forbidden & set(a.values)]
    required = [d for d in required if d.value not in forbidden]
    already = any(axis in axes for v in data for axes in prop.sharding(state, v))
    for s, prio in batching:  # data parallelism that tiles nothing is a mistake, not a no-op
        if not already and not any(d.priority == prio for d in required):
            raise PlanError(_batch_tiles_nothing(goal, s, state, data, forbidden))
    return AxisProblem(axis, required, _dedupe(actions), forbidden, strategies, deferred)


def _batch_tiles_nothing(
    goal: Goal, s: Strategy, state: State, data: set[int], forbidden: set[int]
) -> str:
    """Why a batch/fsdp strategy can tile no data input, and what to do about it."""
    prog, prop = goal.program, goal.propagator
    n = goal.mesh[s.axis]
    if not data:
        return (f"{s.name} on axis {s.axis!r}: the program has no data inputs (every input is "
                f"carried state); name them with {s.name}(inputs=...)")  # fmt: skip
    if data <= forbidden:
        paths = ", ".join(prog.input_paths[v] for v in sorted(data)[:3])
        return (f"{s.name} on axis {s.axis!r}: a replicate statement keeps every data input "
                f"whole on it ({paths}); drop the replicate statement or the {s.name}")  # fmt: skip
    dims = []
    for vid in sorted(data)[:3]:
        if vid in forbidden:
            dims.append(f"{prog.input_paths[vid]} kept whole by a replicate statement")
            continue
        shape, sharding = prog.values[vid].shape, prop.sharding(state, vid)
        earlier = f", already split {prop.size(sharding[0])} ways" if shape and sharding[0] else ""
        dims.append(f"{prog.input_paths[vid]} {shape[0] if shape else 'a scalar'}{earlier}")
    return (
        f"{s.name} on axis {s.axis!r} (size {n}) can tile no data input: it divides the leading "
        f"dim of none it may tile ({', '.join(dims)}{', ...' if len(data) > 3 else ''}); choose "
        "a mesh size that divides the batch size, or name the data inputs with batch(inputs=...)"
        + (", or shard only the parameters with zero(stage=3)" if isinstance(s, FSDP) else "")
    )


def zero_decisions(
    goal: Goal, state: State, groups: list[Group], deferred: list[tuple[int, Strategy]]
) -> list[Decision]:
    """ZeRO's decisions for `state`: per group, the largest whole dim the axis divides."""
    prop, prog = goal.propagator, goal.program
    out = []
    for prio, s in deferred:
        stage = 3 if isinstance(s, FSDP) else s.stage
        n = goal.mesh[s.axis]
        for g in groups:
            values = g.moments + (g.params if stage == 3 else ())
            if not values:
                continue
            sharding = prop.sharding(state, values[0])
            if any(s.axis in axes for axes in sharding):
                continue
            shape = prog.values[values[0]].shape
            d = largest_dividing_dim(shape, n, exclude={d for d, a in enumerate(sharding) if a})
            if d is not None:
                out += [Decision(prio, v, d, s.axis) for v in values]
    return out


def _dedupe(actions: list[Action]) -> list[Action]:
    seen, out = set(), []
    for a in actions:
        if (a.values, a.dim) not in seen:
            seen.add((a.values, a.dim))
            out.append(a)
    return out
