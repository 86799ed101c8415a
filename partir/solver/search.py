"""Compose sub-strategies into a plan: axis by axis in schedule order, an MCTS over the
actions each axis allows (the incremental search of the PartIR paper).

Reward (higher is better, in (0, 1]): a plan within the memory limit scores
`0.5 + 0.5 * log(1 + s) / log(1 + N)`, where `s` is its speedup over the replicated plan
in the goal's objective (step time, peak memory, or communicated bytes) and N the number
of devices; a plan over the limit scores `0.5 * limit / peak` < 0.5. So every plan that
fits beats every plan that does not, and among those that do not, less memory is better —
the search is pulled towards feasibility instead of seeing a cliff, and the log spreads
speedups up to N evenly over the reward range that UCT compares.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.propagate import State
from partir.ir.specs import PlanError
from partir.solver import mcts
from partir.solver.actions import Action, find_groups, useful_actions
from partir.solver.plan import Plan
from partir.solver.prune import prune_actions
from partir.strategies.compile import (
    AxisProblem,
    compile_axis,
    manual_decisions,
    schedule_axes,
    zero_decisions,
)

STOP = "stop"


@dataclasses.dataclass(frozen=True)
class Node:
    state: State
    done: bool
    applied: tuple = dataclasses.field(default=(), compare=False)  # action indices, in order


class AxisEnvironment:
    """The MCTS's view of one axis: states are propagated states, actions tile a group."""

    def __init__(
        self, goal: Goal, problem: AxisProblem, priority: int, score, must_tile=()
    ) -> None:
        self.prop = goal.propagator
        self.problem = problem
        self.priority = priority
        self.score = score
        self.must_tile = list(must_tile)  # stopping before these are tiled cannot fit

    def _tiled(self, state: State, values: tuple[int, ...]) -> bool:
        axis = self.problem.axis
        return all(any(axis in axes for axes in self.prop.sharding(state, v)) for v in values)

    def actions(self, node: Node) -> list[Any]:
        can_stop = all(self._tiled(node.state, g) for g in self.must_tile)
        legal: list[Any] = [STOP] if can_stop else []
        axis = self.problem.axis
        for i, a in enumerate(self.problem.actions):
            if all(
                not any(axis in axes for axes in self.prop.sharding(node.state, v))
                and self.prop.shapes[v][a.dim]
                % (self.prop.size(self.prop.sharding(node.state, v)[a.dim] + (axis,)))
                == 0
                for v in a.values
            ):
                legal.append(i)
        return legal

    def step(self, node: Node, action: Any) -> Node:
        if action == STOP:
            return Node(node.state, True, node.applied)
        a: Action = self.problem.actions[action]
        state, _ = self.prop.apply_all(node.state, a.decisions(self.problem.axis, self.priority))
        return Node(state, False, node.applied + (action,))

    def is_terminal(self, node: Node) -> bool:
        return node.done or self.actions(node) in ([STOP], [])

    def reward(self, node: Node) -> float:
        return self.score(node.state)

    def key(self, node: Node) -> Any:
        return (hash(node.state), node.done)


class Scorer:
    """Reward of a state (see the module docstring), memoised by state."""

    def __init__(self, goal: Goal, reference: Cost, finish=lambda s: s) -> None:
        self.goal = goal
        self.finish = finish  # the deferred decisions (ZeRO) a plan is scored with
        self.model = goal.cost_model
        self.reference = reference
        self.log_n = math.log(1 + max(goal.num_devices, 2))
        self.cache: dict[State, float] = {}
        self.evaluations = 0
        self.explored: list[tuple[float, int]] = []  # (step time, peak memory) per plan

    def metric(self, cost: Cost) -> float:
        if self.goal.objective == "memory":
            return float(cost.peak_memory_bytes)
        if self.goal.objective == "comm":
            return float(cost.comm_bytes) + 1.0
        return cost.step_time_s

    def __call__(self, state: State) -> float:
        hit = self.cache.get(state)
        if hit is None:
            self.evaluations += 1
            cost = self.model.cost(self.finish(state), detail=False)
            self.explored.append((cost.step_time_s, cost.peak_memory_bytes))
            hit = self.reward(cost)
            self.cache[state] = hit
        return hit

    def reward(self, cost: Cost) -> float:
        limit = self.goal.memory_limit
        if limit is not None and cost.peak_memory_bytes > limit:
            return 0.5 * limit / cost.peak_memory_bytes
        ref = max(self.metric(self.reference), 1e-30)
        speedup = ref / max(self.metric(cost), 1e-30)
        return min(1.0, 0.5 + 0.5 * math.log1p(speedup) / self.log_n)


@dataclasses.dataclass
class AxisRecord:
    axis: str
    actions_before: int
    actions_after: int
    pruned: int
    episodes: int
    seconds: float
    stop_reason: str
    chosen: list[str]
    curve: list[tuple[int, float, float]]


def solve(
    goal: Goal,
    *,
    progress: Callable[[str, int, float, float], None] | None = None,
    baselines: bool = True,
) -> Plan:
    """Search the goal's schedule for a plan; the best so far on budget end or Ctrl-C."""
    from partir.strategies.experts import expert_plans

    t0 = time.perf_counter()
    prog, prop = goal.program, goal.propagator
    replicated = goal.cost_model.cost(prop.empty())
    groups = find_groups(goal)
    deferred: list = []

    def finish(state: State) -> State:
        return prop.apply_all(state, zero_decisions(goal, state, groups, deferred))[0]

    scorer = Scorer(goal, replicated, finish)
    calls: list[list] = []  # every apply_all call on the way, so a plan file can replay it
    calls.append(manual_decisions(goal))
    state, rejected = prop.apply_all(prop.empty(), calls[-1])
    if rejected:
        d = rejected[0]
        raise PlanError(
            f"tile {prog.input_paths[d.value]} dim {d.dim} on {d.axis!r} conflicts with "
            "another tile statement"
        )
    axes = schedule_axes(goal)
    search = goal.search
    records: list[AxisRecord] = []
    per_axis_seconds = search.seconds / max(len(axes), 1) if search.seconds else None
    per_axis_episodes = max(1, search.episodes // max(len(axes), 1)) if search.episodes else None
    for k, axis in enumerate(axes):
        priority = 10 * (k + 1)
        problem = compile_axis(goal, axis, state, groups, priority)
        deferred += problem.deferred
        calls.append(problem.required)
        state, _ = prop.apply_all(state, problem.required)
        before = len(problem.actions)
        problem.actions = useful_actions(prop, state, problem.actions, axis, priority + 9)
        pruned, must_tile = 0, []
        if search.prune == "cpsat" and problem.actions:
            result = prune_actions(goal, state, problem, priority + 9)
            pruned, must_tile = result.removed, result.must_tile
            problem.actions = result.actions
        env = AxisEnvironment(goal, problem, priority + 9, scorer, must_tile)
        root = Node(state, False)

        def report(episode: int, seconds: float, best: float, _axis=axis) -> None:
            if progress:
                progress(_axis, episode, seconds, best)

        result = mcts.search(
            env,
            root,
            episodes=per_axis_episodes,
            seconds=per_axis_seconds,
            patience=search.patience,
            uct_c=search.uct_c,
            seed=search.seed + k,
            rollout=search.rollout,
            progress=report,
        )
        best = result.best_state if result.best_state is not None else root
        calls += [problem.actions[i].decisions(axis, priority + 9) for i in best.applied]
        chosen = [
            str(a)
            for a in problem.actions
            if all(axis in prop.sharding(best.state, v)[a.dim] for v in a.values)
            and not all(axis in prop.sharding(state, v)[a.dim] for v in a.values)
        ]
        records.append(
            AxisRecord(
                axis,
                before,
                len(problem.actions),
                pruned,
                result.episodes,
                result.seconds,
                result.stop_reason,
                chosen,
                result.curve,
            )  # fmt: skip
        )
        state = best.state
        if result.stop_reason == "interrupted":
            break
    calls.append(zero_decisions(goal, state, groups, deferred))
    state = prop.apply_all(state, calls[-1])[0]
    seconds = time.perf_counter() - t0
    plan = Plan(goal, state, goal.cost_model.cost(state))
    plan.decisions = [c for c in calls if c]
    if baselines:
        plan.baselines = {"replicated": replicated}
        plan.baselines.update({name: p.cost for name, p in expert_plans(goal).items()})
    plan.search = {
        "seed": search.seed,
        "episodes": sum(r.episodes for r in records),
        "seconds": seconds,
        "actions_before": sum(r.actions_before for r in records),
        "actions_after": sum(r.actions_after for r in records),
        "pruned": sum(r.pruned for r in records),
        "evaluations": scorer.evaluations,
        "explored": scorer.explored,
        "axes": [dataclasses.asdict(r) for r in records],
    }
    return plan
