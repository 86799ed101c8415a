"""Compose sub-strategies into a plan: axis by axis in schedule order, an MCTS over the
actions each axis allows (the incremental search of the PartIR paper).

Reward (higher is better, in (0, 1]): a plan within the memory limit scores
`0.5 + 0.5 * log(1 + s) / log(1 + N)`, where `s` is its speedup over the replicated plan
in the goal's objective (step time, peak memory) and N the number of devices. For
communicated bytes, which the replicated plan has none of, `s` is the replicated plan's
argument bytes over the plan's bytes, unbounded, and the reward `0.5 + 0.5 * s / (1 + s)`.
A plan over the limit scores `0.5 * limit / peak` < 0.5. So every plan that fits beats every plan that does not, and among those that do not, less memory is better —
the search is pulled towards feasibility instead of seeing a cliff, and the log spreads
speedups up to N evenly over the reward range that UCT compares. While later axes are still
to be searched, "the limit" is the limit times the product of their sizes: the most they
can divide a plan's memory by (the bound CP-SAT prunes with, too). Judged against the bare
limit, every plan of an early axis is over it, and that axis only minimised memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.gc_pause import paused_gc
from partir.ir.groups import Action, find_groups, useful_actions
from partir.ir.propagate import State
from partir.ir.specs import to_spec
from partir.solver import mcts
from partir.solver.plan import Plan, input_decisions
from partir.solver.proxy import Proxy, extrapolate, make_proxy
from partir.solver.prune import prune_actions
from partir.solver.zero_dims import choose_zero_dims
from partir.strategies import Auto, Zero
from partir.strategies.compile import (
    AxisProblem,
    compile_axis,
    manual_decisions,
    schedule_axes,
    tile_of,
    zero_decisions,
)


@dataclasses.dataclass(frozen=True)
class Stop:
    """End the search of an axis. With `zero`, the axis also takes ZeRO at that stage,
    deferred to the end as the `zero` strategy's decisions are. Offered on axes searched
    with `auto` and no zero/fsdp of their own: no order of single tilings reaches ZeRO (a
    parameter tiled during the search propagates into the activations), and under a tight
    memory limit ZeRO is what fits."""

    zero: int | None = None

    def __str__(self) -> str:
        return "stop" if self.zero is None else f"zero(stage={self.zero})"


STOP = Stop()
# the ZeRO stages an `auto` axis may end with: stage 1 gave the zoo the same shardings as 3
# (the moments' tiling propagates into the parameters) for twice the evaluations
AUTO_ZERO_STAGES = (3,)

Deferred = tuple[tuple[int, Zero], ...]  # (priority, strategy), as AxisProblem.deferred


@dataclasses.dataclass(frozen=True)
class Node:
    state: State
    done: bool
    applied: tuple = dataclasses.field(default=(), compare=False)  # action indices, in order
    zero: int | None = None  # the ZeRO stage the axis ended with (see Stop)


@dataclasses.dataclass
class View:
    """One program the search acts on: the goal's own, or a shallow copy (see proxy)."""

    goal: Goal
    groups: list
    state: State
    deferred: list = dataclasses.field(default_factory=list)
    actions: list[Action] = dataclasses.field(default_factory=list)  # of the axis searched
    must_tile: list[tuple[int, ...]] = dataclasses.field(default_factory=list)

    @property
    def prop(self):
        return self.goal.propagator

    def finish(self, state: State, extra: Deferred = ()) -> State:
        """`state` with the deferred decisions (ZeRO), and `extra` ones, applied."""
        decisions = zero_decisions(self.goal, state, self.groups, self.deferred + list(extra))
        return self.prop.apply_all(state, decisions)[0]


class AxisEnvironment:
    """The MCTS's view of one axis: a state is the propagated state of each view, an
    action tiles a group (the same group, by name, in every view) or stops (see Stop)."""

    def __init__(
        self, views: list[View], axis: str, priority: int, score, zero_stages: tuple = ()
    ) -> None:
        self.views = views
        self.axis = axis
        self.priority = priority
        self.score = score
        self.stops = [STOP] + [Stop(stage) for stage in zero_stages]

    def extra(self, zero: int | None) -> Deferred:
        """The deferred ZeRO that a stop with `zero` adds (below the actions' priority)."""
        return () if zero is None else ((self.priority - 1, Zero(self.axis, zero)),)

    def _tiled(self, prop, state: State, values: tuple[int, ...]) -> bool:
        return all(any(self.axis in axes for axes in prop.sharding(state, v)) for v in values)

    def _legal(self, prop, state: State, a: Action) -> bool:
        return all(prop.can_tile(state, v, a.dim, self.axis) for v in a.values)

    def actions(self, node: Node) -> list[Any]:
        pairs = list(zip(self.views, node.state))
        can_stop = all(self._tiled(v.prop, s, g) for v, s in pairs for g in v.must_tile)
        legal: list[Any] = list(self.stops) if can_stop else []
        for i in range(len(self.views[0].actions)):
            if all(self._legal(v.prop, s, v.actions[i]) for v, s in pairs):
                legal.append(i)
        return legal

    def step(self, node: Node, action: Any) -> Node:
        if isinstance(action, Stop):
            return Node(node.state, True, node.applied, action.zero)
        states = tuple(
            v.prop.apply_all(s, v.actions[action].decisions(self.axis, self.priority))[0]
            for v, s in zip(self.views, node.state)
        )
        return Node(states, False, node.applied + (action,))

    def is_terminal(self, node: Node) -> bool:
        return node.done or self.actions(node) in ([STOP], [])

    def reward(self, node: Node) -> float:
        return self.score(node.state, self.extra(node.zero))

    def key(self, node: Node) -> Any:
        return (hash(node.state), node.done, node.zero)


class Scorer:
    """Reward of a state of the views (see the module docstring), memoised by state."""

    def __init__(self, goal: Goal, views: list[View], layers: int) -> None:
        self.goal = goal
        self.views = views
        self.layers = layers  # costs of two shallow views are extrapolated to this depth
        self.log_n = math.log(1 + max(goal.num_devices, 2))
        self.reference = self.cost(tuple(v.prop.empty() for v in views), finish=False)
        # the product of the sizes of the axes still to search: a plan's peak is held to the
        # limit times this, the most those axes can divide it by (see the module docstring)
        self.later = 1
        self.cache: dict[tuple, float] = {}  # (states, extra deferred) -> reward, per axis
        self.evaluations = 0
        self.explored: list[tuple[float, int]] = []  # (step time, peak memory) per plan

    def cost(self, states: tuple[State, ...], finish: bool = True, extra: Deferred = ()) -> Cost:
        costs = [
            v.goal.cost_model.cost(v.finish(s, extra) if finish else s, detail=False)
            for v, s in zip(self.views, states)
        ]
        return extrapolate(costs, self.layers)

    def __call__(self, states: tuple[State, ...], extra: Deferred = ()) -> float:
        hit = self.cache.get((states, extra))
        if hit is None:
            self.evaluations += 1
            cost = self.cost(states, extra=extra)
            self.explored.append((cost.step_time_s, cost.peak_memory_bytes))
            hit = self.reward(cost)
            self.cache[(states, extra)] = hit
        return hit

    def reward(self, cost: Cost) -> float:
        limit = self.goal.memory_limit
        if limit is not None and cost.peak_memory_bytes > limit * self.later:
            return 0.5 * limit * self.later / cost.peak_memory_bytes
        speedup = self.scale / max(metric(self.goal, cost), 1e-30)
        if self.goal.objective == "comm":  # no bound like N on it: a map that never saturates
            return 0.5 + 0.5 * speedup / (1 + speedup)
        return min(1.0, 0.5 + 0.5 * math.log1p(speedup) / self.log_n)

    @functools.cached_property
    def scale(self) -> float:
        """What a plan's metric is divided by: the replicated plan's. For `comm` that is
        nothing (the replicated plan moves no bytes), and every plan would score alike
        within a millionth: there, the replicated plan's argument bytes, which a plan that
        moves each argument about once matches."""
        ref = self.reference
        if self.goal.objective == "comm":
            return max(float(ref.argument_bytes), 1.0)
        return max(metric(self.goal, ref), 1e-30)


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


class Stopwatch:
    """Accumulates the seconds spent inside its `with` blocks."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds += time.perf_counter() - self._t0


PROXY_TOLERANCE = 1.25  # full-program metric over the copies' extrapolation, before a redo


class _ProxyMismatch(Exception):
    """The shallow copies offer other actions than the full program: search it whole."""


def _key(prop, a: Action) -> tuple:
    """An action's identity across views: its group, dim and the group's shape."""
    return (a.group, a.dim, prop.shapes[a.values[0]])


def solve(
    goal: Goal,
    *,
    progress: Callable[[str, int, float, float], None] | None = None,
    baselines: bool = True,
) -> Plan:
    """Search the goal's schedule for a plan; the best so far on budget end or Ctrl-C."""
    from partir.solver.baselines import expert_plans

    t0 = time.perf_counter()
    with paused_gc():
        plan = _search(goal, t0, progress)
        plan.search["seconds"] = time.perf_counter() - t0
        if baselines:
            plan.baselines = {"replicated": goal.cost_model.cost(goal.propagator.empty())}
            plan.baselines.update({name: p.cost for name, p in expert_plans(goal).items()})
    return plan


def _search(goal: Goal, t0: float, progress) -> Plan:
    """On the shallow copies where they stand in for the program (see proxy), else whole;
    whole too when the copies mispredict their plan on the full program."""
    episodes = goal.search.episodes
    proxy, why = make_proxy(goal) if goal.search.proxy else (None, "switched off")
    if proxy is None:
        return _solve(goal, None, why, progress, _seconds_left(goal, t0), episodes)
    try:
        plan = _solve(goal, proxy, why, progress, _seconds_left(goal, t0), episodes)
    except _ProxyMismatch as e:
        return _solve(goal, None, str(e), progress, _seconds_left(goal, t0), episodes)
    why = _mispredicted(plan)
    left = _seconds_left(goal, t0)
    interrupted = any(a["stop_reason"] == "interrupted" for a in plan.search["axes"])
    if why is None or interrupted or left == 0:
        return plan
    # within what is left of `seconds`, but with `episodes` of its own: the copies' search
    # may have spent them all on a plan now known to be off by 1.25x or more
    whole = _solve(goal, None, why, progress, left, episodes)
    spent = {"episodes_on_copies": plan.search["episodes"],
             "episodes_on_whole": whole.search["episodes"]}  # fmt: skip
    if _better(goal, whole.cost, plan.cost):
        whole.search["proxy"].update(spent, rejected_plan_step_time_s=plan.cost.step_time_s)
        plan = whole
    else:
        whole_search = {"reason": why, "step_time_s": whole.cost.step_time_s}
        plan.search["proxy"].update(spent, whole_search=whole_search)
    plan.search["episodes"] = sum(spent.values())  # both searches (axes: the kept one's)
    return plan


def _seconds_left(goal: Goal, t0: float) -> float | None:
    """What is left of the goal's time budget (None: no budget)."""
    if goal.search.seconds is None:
        return None
    return max(goal.search.seconds - (time.perf_counter() - t0), 0.0)


def _mispredicted(plan: Plan) -> str | None:
    """Why the shallow copies' plan must be checked by a whole search, or None."""
    proxy = plan.search["proxy"]
    off = proxy["full_over_predicted"]
    if off > PROXY_TOLERANCE:
        return f"the shallow copies' plan cost {off:.2f}x their prediction on the full program"
    if proxy["predicted_fits"] and not plan.cost.fits:
        return "the shallow copies' plan fit the memory limit by their prediction, not in full"
    return None


def _solve(
    goal: Goal,
    proxy: Proxy | None,
    why: str,
    progress: Callable[[str, int, float, float], None] | None,
    seconds: float | None,
    episodes: int | None,
) -> Plan:
    """One search of the schedule within `seconds` and `episodes` (None: no cap), on the
    shallow copies when `proxy` is given, else on the whole program."""
    start = time.perf_counter()
    on_full = Stopwatch()  # work on the full program while the views are searched
    with on_full:
        prog, prop, search = goal.program, goal.propagator, goal.search
        full = View(goal, find_groups(goal.program), prop.empty())
        _ = goal.cost_model  # built here, timed with the rest of the full-program work
    views = [full]
    if proxy is not None:
        views = [View(g, find_groups(g.program), g.propagator.empty()) for g in proxy.shallow]
    calls: list[list] = []  # every apply_all call on the way, so a plan file can replay it
    calls.append(manual_decisions(goal))
    with on_full:
        full.state, rejected = prop.apply_all(full.state, calls[-1])
    if rejected:
        d = rejected[0]
        tiles = [m for m in calls[-1] if m.value == d.value and m != d]
        if prop.blocks(d.value, d.axis):
            other = "a replicate statement"
        elif tiles:
            other = "another tile statement"
        else:  # nothing of the goal file's: the program's with_sharding_constraint
            other = ("the program's own sharding constraint (its with_sharding_constraint or "
                     "reshard, honoured first); drop the tile statement, or write "
                     "`constraints ignore` to let it win")  # fmt: skip
        raise goal.strategy_error(
            tile_of(goal, d),
            f"tile {prog.input_paths[d.value]} dim {d.dim} on {d.axis!r} conflicts with {other}",
        )
    if proxy is not None:
        for v in views:
            v.state = v.prop.apply_all(v.state, manual_decisions(v.goal))[0]
    scorer = Scorer(goal, views, proxy.layers if proxy else 1)
    axes = schedule_axes(goal)
    records: list[AxisRecord] = []
    for k, axis in enumerate(axes):
        priority = 10 * (k + 1)
        with on_full:
            problem = compile_axis(goal, axis, full.state, full.groups, priority)
            full.deferred += problem.deferred
            calls.append(problem.required)
            full.state = prop.apply_all(full.state, problem.required)[0]
        before = len(problem.actions)
        if proxy is not None:
            for v in views:
                p = compile_axis(v.goal, axis, v.state, v.groups, priority)
                v.deferred += p.deferred
                v.state = v.prop.apply_all(v.state, p.required)[0]
                v.actions = p.actions
        else:
            full.actions = problem.actions
        deep = views[-1]
        useful = useful_actions(deep.prop, deep.state, deep.actions, axis, priority + 9)
        if proxy is None:
            actions = useful
        else:
            keys = {_key(deep.prop, a) for a in useful}
            actions = [a for a in problem.actions if _key(prop, a) in keys]
        scorer.later = math.prod(goal.mesh[a] for a in axes[k + 1 :])
        scorer.cache.clear()  # rewards depend on the axis (later, the views' deferred stages)
        zero_stages = AUTO_ZERO_STAGES if _zero_may_help(scorer, problem) else ()
        env = AxisEnvironment(views, axis, priority + 9, scorer, zero_stages)
        deepest = env.extra(max(zero_stages, default=None))
        pruned, must = 0, set()
        if search.prune == "cpsat" and actions and goal.memory_limit is not None:
            # bounded with the deferred ZeRO/FSDP stages applied: they tile the state later
            # (and with the deepest ZeRO the axis may end with: a bound must not exceed it)
            with on_full:
                finished = full.finish(full.state, deepest)
            result = prune_actions(
                goal,
                finished,
                dataclasses.replace(problem, actions=actions),
                priority + 9,
                cost=scorer.cost(tuple(v.state for v in views), extra=deepest) if proxy else None,
            )
            pruned = result.removed
            must = {a.group for a in actions if a.values in result.must_tile}
            actions = result.actions
        if proxy is None:
            full.actions = actions
        for v in views if proxy is not None else ():
            by_key = {_key(v.prop, a): a for a in v.actions}
            wanted = [_key(prop, a) for a in actions]
            missing = [k for k in wanted if k not in by_key]
            if missing or len(by_key) != len(v.actions):
                raise _ProxyMismatch(
                    f"the shallow copies do not offer the same actions on {axis!r}"
                    + (f" ({missing[0][0]} dim {missing[0][1]} is missing)" if missing else "")
                )
            v.actions = [by_key[k] for k in wanted]
        for v in views:
            v.must_tile = list(dict.fromkeys(a.values for a in v.actions if a.group in must))
        root = Node(tuple(v.state for v in views), False)

        def report(episode: int, seconds: float, best: float, _axis=axis) -> None:
            if progress:
                progress(_axis, episode, seconds, best)

        # what is left of the budgets, shared by the axes still to search: an axis that
        # needs less (nothing to choose, or converged) leaves the rest to the later ones
        axes_left = len(axes) - k
        axis_episodes = axis_seconds = None
        if episodes is not None:
            axis_episodes = -(-max(episodes - sum(r.episodes for r in records), 0) // axes_left)
        if seconds is not None:
            axis_seconds = max(seconds - (time.perf_counter() - start), 0.0) / axes_left
        result = mcts.search(
            env,
            root,
            episodes=axis_episodes,
            seconds=axis_seconds,
            patience=search.patience,
            uct_c=search.uct_c,
            seed=search.seed + k,
            rollout=search.rollout,
            progress=report,
        )
        best = result.best_state if result.best_state is not None else root
        chosen = [
            str(a)
            for a in deep.actions
            if all(axis in deep.prop.sharding(best.state[-1], v)[a.dim] for v in a.values)
            and not all(axis in deep.prop.sharding(deep.state, v)[a.dim] for v in a.values)
        ]
        if best.zero is not None:
            chosen.append(str(Stop(best.zero)))
            for v in views if proxy is None else [full, *views]:
                v.deferred += env.extra(best.zero)
        if proxy is None:
            calls += [actions[i].decisions(axis, priority + 9) for i in best.applied]
            full.state = best.state[0]
        else:
            for i in best.applied:  # one call each, as the search applied them
                calls.append(actions[i].decisions(axis, priority + 9))
                with on_full:
                    full.state = prop.apply_all(full.state, calls[-1])[0]
            for v, s in zip(views, best.state):
                v.state = s
        records.append(
            AxisRecord(
                axis,
                before,
                len(actions),
                pruned,
                result.episodes,
                result.seconds,
                result.stop_reason,
                chosen,
                result.curve,
            )  # fmt: skip
        )
        if result.stop_reason == "interrupted":
            break
    with on_full:
        full.deferred = choose_zero_dims(views, scorer.cost, functools.partial(_better, goal))
        calls.append(zero_decisions(goal, full.state, full.groups, full.deferred))
        state = prop.apply_all(full.state, calls[-1])[0]
        plan = Plan(goal, state, goal.cost_model.cost(state))
    plan.decisions = [c for c in calls if c]
    # the views tell cheaply whether propagating the input shardings afresh can pay
    if proxy is None or _views_repropagate(views, scorer):
        with on_full:
            alt = _from_inputs(goal, plan)
    else:
        alt = None
    repropagated = alt is not None and _better(goal, alt.cost, plan.cost)
    if repropagated:
        plan = alt
    predicted = scorer.cost(tuple(v.state for v in views)) if proxy else None
    plan.search = {
        "seed": search.seed,
        "episodes": sum(r.episodes for r in records),
        "seconds": None,  # set by solve
        # of `seconds`, the work on the full program outside the search: building its
        # propagator and cost model, replaying the decisions, costing the plan
        "full_program_seconds": on_full.seconds,
        "actions_before": sum(r.actions_before for r in records),
        "actions_after": sum(r.actions_after for r in records),
        "pruned": sum(r.pruned for r in records),
        "evaluations": scorer.evaluations,
        "explored": scorer.explored,
        "proxy": {
            "layers": proxy.layers,
            "used": True,
            "full_over_predicted": metric(goal, plan.cost) / max(metric(goal, predicted), 1e-30),
            "predicted_fits": predicted.fits,
        }
        if proxy
        else {"used": False, "reason": why},
        "repropagated": repropagated,  # the plan is its input shardings propagated afresh
        "axes": [dataclasses.asdict(r) for r in records],
    }
    return plan


def _zero_may_help(scorer: Scorer, problem: AxisProblem) -> bool:
    """Whether an axis may end with ZeRO (see Stop): searched with `auto` and no zero of its
    own, and memory matters there (the objective, or the axis's start is over the limit).
    ZeRO trades collectives for memory; offered on time alone it gained nothing on gpt
    small 2x4 and made the search 1.6x longer."""
    if problem.deferred or not any(isinstance(s, Auto) for s in problem.strategies):
        return False
    goal = scorer.goal
    if goal.objective == "memory":
        return True
    if goal.memory_limit is None:
        return False
    peak = scorer.cost(tuple(v.state for v in scorer.views)).peak_memory_bytes
    return peak > goal.memory_limit * scorer.later


def _from_inputs(goal: Goal, plan: Plan) -> Plan | None:
    """The plan that the input shardings alone give, propagated from scratch."""
    fresh = _afresh(goal, plan.state)
    if fresh is None:
        return None
    state, decisions = fresh
    alt = Plan(goal, state, goal.cost_model.cost(state))
    alt.decisions = [decisions]
    return alt


def _afresh(goal: Goal, state: State) -> tuple[State, list] | None:
    """`state`'s input shardings propagated from scratch, and the decisions that do it: the
    order the search made its decisions in can leave values inside the program sharded
    worse. None when the propagator rejects one of them."""
    prop = goal.propagator
    specs = {p: to_spec(prop.sharding(state, v)) for p, v in goal.program.inputs.items()}
    decisions = input_decisions(goal, specs)
    fresh, rejected = prop.apply_all(prop.empty(), decisions)
    return None if rejected else (fresh, decisions)


def _views_repropagate(views: list[View], scorer: Scorer) -> bool:
    """Whether the views' input shardings, propagated afresh, beat their searched states."""
    finals = [v.finish(v.state) for v in views]
    alts = [_afresh(v.goal, final) for v, final in zip(views, finals)]
    if any(alt is None for alt in alts):
        return False
    a = scorer.cost(tuple(state for state, _ in alts), finish=False)
    return _better(scorer.goal, a, scorer.cost(tuple(finals), finish=False))


def metric(goal: Goal, cost: Cost) -> float:
    """The goal's objective: lower is better."""
    if goal.objective == "memory":
        return float(cost.peak_memory_bytes)
    if goal.objective == "comm":
        return float(cost.comm_bytes) + 1.0
    return cost.step_time_s


def _better(goal: Goal, a: Cost, b: Cost) -> bool:
    """Whether cost `a` beats `b`: within the memory limit first, then the objective."""
    limit = goal.memory_limit
    fits = lambda c: limit is None or c.peak_memory_bytes <= limit  # noqa: E731
    if fits(a) != fits(b):
        return fits(a)
    if not fits(a):
        return a.peak_memory_bytes < b.peak_memory_bytes
    return metric(goal, a) < metric(goal, b)
