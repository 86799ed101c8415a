"""`GoalSpec`: what a goal file says, as plain data (names, numbers and where each is
written), before anything named in it is imported or called."""

from __future__ import annotations

import dataclasses

from partir.dsl.errors import GoalError, Pos, Source
from partir.goal import Search
from partir.ir.devices import Device
from partir.strategies import Replicate, Strategy, Tile

Literal = int | float | str | bool | None | list


@dataclasses.dataclass
class EntryPoint:
    """`program` or `inputs`: a `module:function` or `file.py:function`, and its call."""

    target: str
    args: tuple[Literal, ...] = ()
    kwargs: dict[str, Literal] = dataclasses.field(default_factory=dict)
    pos: Pos = dataclasses.field(default=Pos(), compare=False, repr=False)

    @property
    def module(self) -> str:
        return self.target.rsplit(":", 1)[0]

    @property
    def function(self) -> str:
        return self.target.rsplit(":", 1)[1]

    def call_text(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.target}({', '.join(parts)})"


@dataclasses.dataclass
class StrategySpec:
    """One strategy of an axis block, with where its name and arguments are written."""

    strategy: Strategy
    pos: Pos = dataclasses.field(default=Pos(), compare=False, repr=False)
    arg_pos: dict[str, Pos] = dataclasses.field(default_factory=dict, compare=False, repr=False)


@dataclasses.dataclass
class AxisSpec:
    """`axis NAME { ... }`: the strategies on one mesh axis, in order."""

    name: str
    strategies: list[StrategySpec]
    pos: Pos = dataclasses.field(default=Pos(), compare=False, repr=False)


@dataclasses.dataclass
class ManualSpec:
    """A `tile` or `replicate` statement, with where its path, dim and axis are written."""

    strategy: Tile | Replicate
    path_pos: Pos = dataclasses.field(default=Pos(), compare=False, repr=False)
    dim_pos: Pos | None = dataclasses.field(default=None, compare=False, repr=False)
    axis_pos: Pos = dataclasses.field(default=Pos(), compare=False, repr=False)


@dataclasses.dataclass
class GoalSpec:
    """A goal file as plain data: names and numbers, nothing imported or called yet.

    `device` is None when the file names none (the Goal's default, "cpu"). `search`
    already holds the `prune` statement's choice. `schedule` is the strategies of the
    axis blocks in file order, then the manual tile/replicate statements in file order.
    """

    filename: str
    program: EntryPoint
    inputs: EntryPoint
    mesh: dict[str, int | None]  # an axis written `NAME=?` has size None: see `devices`
    device: Device | None = None
    memory_limit: int | None = None
    objective: str = "time"
    axes: list[AxisSpec] = dataclasses.field(default_factory=list)
    manual: list[ManualSpec] = dataclasses.field(default_factory=list)
    search: Search = dataclasses.field(default_factory=Search)
    honour_constraints: bool = True
    notes: list[str] = dataclasses.field(default_factory=list)
    source: Source = dataclasses.field(default=Source("<text>", ""), compare=False, repr=False)
    devices: int | None = None  # `mesh ... over N`: the device count the open axes share
    positions: dict[str, Pos] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def schedule(self) -> list[Strategy]:
        return [s.strategy for a in self.axes for s in a.strategies] + [
            m.strategy for m in self.manual
        ]

    def error(self, pos: Pos, message: str) -> GoalError:
        return self.source.error(pos, message)
