"""The programs a search acts on. Usually the goal's own; for a deep unrolled model, two
shallow copies of it (one and two layers, see proxy) that stand in for it: the search acts
on the copies, their costs are extrapolated to the full depth, and every choice is replayed
on the full program, which the plan is made of. `Programs` hides which of the two it is, so
the search driver has one path."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.groups import Action, Group, find_groups, useful_actions
from partir.ir.propagate import Decision, State
from partir.ir.specs import to_spec
from partir.solver.plan import input_decisions, propagate_inputs
from partir.solver.reward import better
from partir.solver.shallow_copies import ShallowCopies, extrapolate
from partir.strategies import Strategy
from partir.strategies.compile import (
    AxisProblem,
    compile_axis,
    manual_decisions,
    tile_of,
    zero_decisions,
)

Deferred = tuple[tuple[int, Strategy], ...]  # (priority, strategy), as AxisProblem.deferred


class CopiesMismatch(Exception):
    """The shallow copies offer other actions than the full program: search it whole."""


class Stopwatch:
    """Accumulates the seconds spent inside its `with` blocks."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds += time.perf_counter() - self._t0


@dataclasses.dataclass
class SearchedProgram:
    """One program and where the search stands on it: its state so far, the deferred
    strategies (ZeRO, FSDP) applied at scoring, and the actions of the axis searched."""

    goal: Goal
    groups: list[Group]
    state: State
    deferred: list[tuple[int, Strategy]] = dataclasses.field(default_factory=list)
    actions: list[Action] = dataclasses.field(default_factory=list)  # of the axis searched
    must_tile: list[tuple[int, ...]] = dataclasses.field(default_factory=list)

    @property
    def prop(self):
        return self.goal.propagator

    def with_deferred(self, state: State, extra: Deferred = ()) -> State:
        """`state` with the deferred decisions (ZeRO's, FSDP's) and `extra` ones applied."""
        decisions = zero_decisions(self.goal, state, self.groups, self.deferred + list(extra))
        return self.prop.apply_all(state, decisions)[0]


def action_key(prop, a: Action) -> tuple:
    """An action's identity across programs: its group, dim and the group's shape."""
    return (a.group, a.dim, prop.shapes[a.values[0]])


class Programs:
    """The full program, and the programs searched: the full one itself, or its shallow
    copies. Every call on the way to the plan is recorded (`calls`), so that a plan file can
    replay it; `on_full` times the work on the full program outside the search."""

    def __init__(self, goal: Goal, proxy: ShallowCopies | None) -> None:
        self.goal = goal
        self.on_full = Stopwatch()
        with self.on_full:
            self.full = SearchedProgram(goal, find_groups(goal.program), goal.propagator.empty())
            _ = goal.cost_model  # built here, timed with the rest of the full-program work
        self.copies = proxy is not None
        self.layers = proxy.layers if proxy else 1
        self.searched = (
            [
                SearchedProgram(g, find_groups(g.program), g.propagator.empty())
                for g in proxy.shallow
            ]
            if proxy
            else [self.full]
        )
        self.calls: list[list[Decision]] = []

    def _all(self) -> Iterator[SearchedProgram]:
        yield self.full
        if self.copies:
            yield from self.searched

    def states(self) -> tuple[State, ...]:
        return tuple(p.state for p in self.searched)

    def cost(self, states: tuple[State, ...], deferred: bool = True, extra: Deferred = ()) -> Cost:
        """The cost of the searched programs at `states` (with their deferred decisions
        and `extra` ones applied), extrapolated to the full program's depth."""
        costs = [
            p.goal.cost_model.cost(
                as_planned(p.goal, p.with_deferred(s, extra) if deferred else s), detail=False
            )
            for p, s in zip(self.searched, states)
        ]
        return extrapolate(costs, self.layers)

    # -- the steps of a search ------------------------------------------------------------
    def apply_manual(self) -> None:
        """The goal's tile statements, first; a conflict is an error at the statement."""
        goal, prop = self.goal, self.goal.propagator
        self.calls.append(manual_decisions(goal))
        with self.on_full:
            self.full.state, rejected = prop.apply_all(self.full.state, self.calls[-1])
        if rejected:
            raise _manual_conflict(goal, self.calls[-1], rejected[0])
        if self.copies:
            for p in self.searched:
                p.state = p.prop.apply_all(p.state, manual_decisions(p.goal))[0]

    def hold_back(self, axes: Sequence[str]) -> None:
        """While an axis is searched, the axes after it stay out of the parameters'
        propagation on every program (Propagator.hold_back)."""
        for p in self._all():
            p.prop.hold_back(axes)

    def compile_axis(self, axis: str, priority: int) -> AxisProblem:
        """Compile the axis's strategies on every program and apply what they require; the
        full program's problem."""
        with self.on_full:
            problem = compile_axis(self.goal, axis, self.full.state, self.full.groups, priority)
            self.full.deferred += problem.deferred
            self.calls.append(problem.required)
            self.full.state = self.goal.propagator.apply_all(self.full.state, problem.required)[0]
        self.full.actions = problem.actions
        if self.copies:
            for p in self.searched:
                own = compile_axis(p.goal, axis, p.state, p.groups, priority)
                p.deferred += own.deferred
                p.state = p.prop.apply_all(p.state, own.required)[0]
                p.actions = own.actions
        return problem

    def useful(self, problem: AxisProblem, axis: str, priority: int) -> list[Action]:
        """The problem's actions that change something, as the deepest program tells."""
        deep = self.searched[-1]
        useful = useful_actions(deep.prop, deep.state, deep.actions, axis, priority)
        keys = {action_key(deep.prop, a) for a in useful}
        prop = self.goal.propagator
        return [a for a in problem.actions if action_key(prop, a) in keys]

    def offer(self, actions: list[Action], must: set[str], axis: str) -> None:
        """The actions the search may take (in the full program's terms), the same on every
        searched program; those of a group in `must` must be taken before stopping."""
        self.full.actions = actions
        prop = self.goal.propagator
        wanted = [action_key(prop, a) for a in actions]
        for p in self.searched if self.copies else ():
            by_key = {action_key(p.prop, a): a for a in p.actions}
            missing = [k for k in wanted if k not in by_key]
            if missing or len(by_key) != len(p.actions):
                raise CopiesMismatch(
                    f"the shallow copies do not offer the same actions on {axis!r}"
                    + (f" ({missing[0][0]} dim {missing[0][1]} is missing)" if missing else "")
                )
            p.actions = [by_key[k] for k in wanted]
        for p in self.searched:
            p.must_tile = list(dict.fromkeys(a.values for a in p.actions if a.group in must))

    def prune_cost(self, extra: Deferred) -> Cost | None:
        """What CP-SAT bounds the axis with on the copies (None: the full program's own)."""
        return self.cost(self.states(), extra=extra) if self.copies else None

    def commit(
        self,
        applied: tuple[int, ...],
        states: tuple[State, ...],
        axis: str,
        priority: int,
        extra: Deferred,
    ) -> None:
        """Take the search's best node: its actions (one call each, as the search applied
        them) and the deferred ZeRO its stop added."""
        prop = self.goal.propagator
        for i in applied:
            self.calls.append(self.full.actions[i].decisions(axis, priority))
            if self.copies:
                with self.on_full:
                    self.full.state = prop.apply_all(self.full.state, self.calls[-1])[0]
        for p, s in zip(self.searched, states):
            p.state = s
        for p in self._all():
            p.deferred += extra

    def finish(self) -> State:
        """The full program's state with the deferred decisions applied, recorded."""
        with self.on_full:
            self.calls.append(
                zero_decisions(self.goal, self.full.state, self.full.groups, self.full.deferred)
            )
            return self.goal.propagator.apply_all(self.full.state, self.calls[-1])[0]

    def predicted(self) -> Cost | None:
        """What the copies predict for the plan's cost (None: no copies)."""
        return self.cost(self.states()) if self.copies else None

    def repropagation_may_pay(self) -> bool:
        """Whether propagating the input shardings afresh may beat the searched states:
        always worth trying on the full program; the copies tell it cheaply, except where
        the program has constraints: the search then scored the plans propagated afresh
        (`as_planned`), so the copies' comparison would be of one state with itself."""
        if not self.copies or self.goal.propagator.seed:
            return True
        finals = [p.with_deferred(p.state) for p in self.searched]
        alts = [afresh(p.goal, final) for p, final in zip(self.searched, finals)]
        if any(alt is None for alt in alts):
            return False
        fresh = self.cost(tuple(alt[0] for alt in alts if alt), deferred=False)
        return better(self.goal, fresh, self.cost(tuple(finals), deferred=False))


def as_planned(goal: Goal, state: State) -> State:
    """The state that the plan of `state`'s input shardings has: where the program has its
    own sharding constraints, they propagate with the input shardings (`Propagator.seeded`,
    as `make_plan` and XLA do), not before them as the search's own states have them.
    Scored on the search's states, MaxText's plan lost to ones that XLA ran 1.8x slower."""
    if not goal.propagator.seed:
        return state
    fresh = afresh(goal, state)
    return state if fresh is None else fresh[0]


def afresh(goal: Goal, state: State) -> tuple[State, list[Decision]] | None:
    """`state`'s input shardings propagated from scratch, and the decisions that do it: the
    order the search made its decisions in can leave values inside the program sharded
    worse. None when the propagator rejects one of them."""
    prop = goal.propagator
    specs = {p: to_spec(prop.sharding(state, v)) for p, v in goal.program.inputs.items()}
    decisions = input_decisions(goal, specs)
    fresh, rejected = propagate_inputs(goal, decisions)
    return None if rejected else (fresh, decisions)


def _manual_conflict(goal: Goal, calls: list[Decision], d: Decision) -> Exception:
    """The error for a tile statement the propagator rejected, at the statement."""
    prop, prog = goal.propagator, goal.program
    tiles = [m for m in calls if m.value == d.value and m != d]
    if prop.blocks(d.value, d.axis):
        other = "a replicate statement"
    elif tiles:
        other = "another tile statement"
    else:  # nothing of the goal file's: the program's with_sharding_constraint
        other = (
            "the program's own sharding constraint (its with_sharding_constraint or reshard, "
            "honoured first); drop the tile statement, or write `constraints ignore` to let it "
            "win"
        )
    return goal.strategy_error(
        tile_of(goal, d),
        f"tile {prog.input_paths[d.value]} dim {d.dim} on {d.axis!r} conflicts with {other}",
    )
