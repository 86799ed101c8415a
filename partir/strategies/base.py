"""What every sub-strategy is, and what one mesh axis's strategies share.

A strategy is a small immutable value naming the mesh axis it acts on. Its class says what
it means there: `constrain` gives the decisions it requires, the values it keeps whole, the
actions the search may take and the decisions it defers to the end of the search;
`conflicts_with` says which strategies it cannot share an axis with; `arguments` and
`check_argument` say what a goal file may give it. A schedule is a plain list of strategies,
composed per axis by `partir.strategies.compile` (their constraints add up); the order of
first appearance of each axis is the search order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from partir.ir.groups import Action, Group, dims_that_divide
from partir.ir.propagate import Decision, State
from partir.ir.specs import glob_match

if TYPE_CHECKING:
    from partir.goal import Goal


@dataclasses.dataclass
class Constraints:
    """What strategies ask of one axis: `required` decisions, `forbidden` values (kept
    whole), `actions` for the search, and `deferred` strategies (with their priority) whose
    decisions are made on every scored plan at the end (`Strategy.deferred_decisions`)."""

    required: list[Decision] = dataclasses.field(default_factory=list)
    actions: list[Action] = dataclasses.field(default_factory=list)
    forbidden: set[int] = dataclasses.field(default_factory=set)
    deferred: list[tuple[int, Strategy]] = dataclasses.field(default_factory=list)

    def __iadd__(self, other: Constraints) -> Constraints:
        self.required += other.required
        self.actions += other.actions
        self.forbidden |= other.forbidden
        self.deferred += other.deferred
        return self


@dataclasses.dataclass(frozen=True)
class AxisContext:
    """What a strategy sees of its axis: the goal, the state that earlier axes left, the
    program's input groups and (`data`) its data inputs."""

    goal: Goal
    axis: str
    state: State
    groups: Sequence[Group]

    @functools.cached_property
    def data(self) -> frozenset[int]:
        """The value ids of the data inputs (`data_paths`)."""
        strategies = [s for s in self.goal.schedule if s.axis == self.axis]
        return frozenset(self.goal.program.inputs[p] for p in data_paths(self.goal, strategies))

    @property
    def size(self) -> int:
        return self.goal.sizes[self.axis]

    def free_dims(self, vid: int, minor_to: Collection[str] = ()) -> list[int]:
        """Dims of `vid` that the axis divides and no earlier axis tiles; with `minor_to`,
        also the dims that only those axes tile, where the axis divides what they leave."""
        prog, prop = self.goal.program, self.goal.propagator
        sharding = prop.sharding(self.state, vid)
        shape = prog.values[vid].shape
        out = []
        for d, axes in enumerate(sharding):
            if axes and not set(axes) <= set(minor_to):
                continue
            left, uneven = divmod(shape[d], math.prod(self.goal.sizes[a] for a in axes))
            if not uneven and dims_that_divide((left,), self.size):
                out.append(d)
        return out

    def divisible_dims(self, vid: int, priority: int) -> list[int]:
        """Dims the axis can tile, also those an earlier axis tiles (it then goes minor)."""
        prop = self.goal.propagator
        dims = range(len(self.goal.program.values[vid].shape)) if self.size > 1 else ()
        return [
            d for d in dims if prop.can_apply(self.state, Decision(priority, vid, d, self.axis))
        ]


@dataclasses.dataclass(frozen=True)
class Strategy:
    axis: str

    arguments: ClassVar[tuple[str, ...]] = ()
    """The keyword arguments a goal file may give (checked by `check_argument`)."""

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    def constrain(self, ctx: AxisContext, priority: int) -> Constraints:
        """This strategy's constraints on its axis; `priority` ranks its decisions."""
        return Constraints()

    def check(self, ctx: AxisContext, own: Constraints, axis: Constraints) -> None:
        """Raise PlanError when the axis's combined constraints (`axis`) leave this
        strategy's own (`own`) doing nothing where that is a mistake."""

    def deferred_decisions(self, ctx: AxisContext, priority: int) -> list[Decision]:
        """The decisions deferred to the end (`Constraints.deferred`), for `ctx.state`."""
        return []

    def conflicts_with(self, other: Strategy) -> str | None:
        """Why this strategy and `other` cannot share an axis, or None (by default, the
        same strategy twice)."""
        if type(other) is type(self):
            return f"{self.name} is given twice for mesh axis {self.axis!r}; keep one"
        return None

    @classmethod
    def check_argument(cls, key: str, value: Any, show: Callable[[Any], str] = repr) -> Any:
        """The value of argument `key`, converted; a ValueError says what is wrong, with the
        value written by `show` (a goal file writes values its own way)."""
        return value


def path_globs(value: Any, what: str, example: str) -> tuple[str, ...]:
    """A strategy argument that names inputs: a path glob or a list of them (`what`, e.g.
    "batch inputs", is what the message calls it; `example` shows both forms)."""
    globs = [value] if isinstance(value, str) else value
    if (
        not isinstance(globs, list | tuple)
        or not globs
        or not all(isinstance(g, str) and g for g in globs)
    ):
        raise ValueError(f"{what} is a path glob or a list of them, like {example}")
    return tuple(globs)


def data_paths(goal: Goal, strategies: Sequence[Strategy]) -> list[str]:
    """The data inputs: the `inputs=` globs of a strategy that has them (`batch`), else the
    goal's, else the inputs that are not carried state."""
    prog = goal.program
    for s in strategies:
        globs = getattr(s, "inputs", None)
        if globs is not None:
            return [p for p in prog.inputs if any(glob_match(g, p) for g in globs)]
    if goal.data_inputs is not None:
        return [p for p in prog.inputs if any(glob_match(g, p) for g in goal.data_inputs)]
    carried = set(prog.carried.values())
    return [p for p in prog.inputs if p not in carried]


def conflict(strategies: Sequence[Strategy]) -> str | None:
    """Why strategies that share one mesh axis contradict each other, or None."""
    for i, a in enumerate(strategies):
        for b in strategies[i + 1 :]:
            why = a.conflicts_with(b) or b.conflicts_with(a)
            if why is not None:
                return why
    return None
