"""The MCTS's view of one mesh axis: a node is the state of every searched program (see
programs), an action tiles a group (the same group, by name, in every program) or stops."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from partir.ir.groups import Action
from partir.ir.propagate import State
from partir.solver.programs import Deferred, SearchedProgram
from partir.strategies import Zero


@dataclasses.dataclass(frozen=True)
class Stop:
    """End the search of an axis. With `zero_stage`, the axis also takes ZeRO at that stage,
    deferred to the end as the `zero` strategy's decisions are. Offered on axes searched
    with `auto` and no zero/fsdp of their own: no order of single tilings reaches ZeRO (a
    parameter tiled during the search propagates into the activations), and under a tight
    memory limit ZeRO is what fits."""

    zero_stage: int | None = None

    def __str__(self) -> str:
        return "stop" if self.zero_stage is None else f"zero(stage={self.zero_stage})"


STOP = Stop()
# the ZeRO stages an `auto` axis may end with: stage 1 gave the zoo the same shardings as 3
# (the moments' tiling propagates into the parameters) for twice the evaluations
AUTO_ZERO_STAGES = (3,)


@dataclasses.dataclass(frozen=True)
class AxisNode:
    """A node of the axis's search tree: per searched program its state, whether the axis
    stopped there, the actions taken (indices, in order) and the ZeRO stage it stopped with."""

    states: tuple[State, ...]
    done: bool
    applied: tuple[int, ...] = dataclasses.field(default=(), compare=False)
    zero_stage: int | None = None


class AxisEnvironment:
    """Actions, steps and rewards of one axis's search, over every searched program."""

    def __init__(
        self,
        programs: list[SearchedProgram],
        axis: str,
        priority: int,
        reward: Callable[[tuple[State, ...], Deferred], float],
        zero_stages: tuple[int, ...] = (),
    ) -> None:
        self.programs = programs
        self.axis = axis
        self.priority = priority
        self._reward = reward
        self.stops = [STOP] + [Stop(stage) for stage in zero_stages]

    def zero_at_stop(self, zero_stage: int | None) -> Deferred:
        """The deferred ZeRO that a stop with `zero_stage` adds (below the actions' priority)."""
        return () if zero_stage is None else ((self.priority - 1, Zero(self.axis, zero_stage)),)

    def _tiled(self, prop, state: State, values: tuple[int, ...]) -> bool:
        return all(any(self.axis in axes for axes in prop.sharding(state, v)) for v in values)

    def _legal(self, prop, state: State, a: Action) -> bool:
        return all(prop.can_tile(state, v, a.dim, self.axis) for v in a.values)

    def actions(self, node: AxisNode) -> list[Any]:
        pairs = list(zip(self.programs, node.states))
        can_stop = all(self._tiled(p.prop, s, g) for p, s in pairs for g in p.must_tile)
        legal: list[Any] = list(self.stops) if can_stop else []
        for i in range(len(self.programs[0].actions)):
            if all(self._legal(p.prop, s, p.actions[i]) for p, s in pairs):
                legal.append(i)
        return legal

    def step(self, node: AxisNode, action: Any) -> AxisNode:
        if isinstance(action, Stop):
            return AxisNode(node.states, True, node.applied, action.zero_stage)
        states = tuple(
            p.prop.apply_all(s, p.actions[action].decisions(self.axis, self.priority))[0]
            for p, s in zip(self.programs, node.states)
        )
        return AxisNode(states, False, node.applied + (action,))

    def is_terminal(self, node: AxisNode) -> bool:
        return node.done or self.actions(node) in ([STOP], [])

    def reward(self, node: AxisNode) -> float:
        return self._reward(node.states, self.zero_at_stop(node.zero_stage))

    def key(self, node: AxisNode) -> Any:
        """The transposition table's key: the states themselves (equal states, reached by
        actions in another order, are one node), whether stopped, and the ZeRO stage."""
        return (node.states, node.done, node.zero_stage)
