"""Compose sub-strategies into a plan: axis by axis in schedule order, an MCTS over the
actions each axis allows (the incremental search of the PartIR paper). Per axis: compile
its strategies, prune the actions CP-SAT proves useless, search, commit the best node. What
is maximised is in reward; the search tree of an axis in axis_env; the programs searched
(the goal's own, or shallow copies of a deep model) in programs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable

from partir.goal import Goal
from partir.ir.gc_pause import paused_gc
from partir.ir.groups import Action
from partir.solver import mcts
from partir.solver.axis_env import AUTO_ZERO_STAGES, AxisEnvironment, AxisNode, Stop
from partir.solver.plan import Plan
from partir.solver.programs import CopiesMismatch, Programs, afresh
from partir.solver.prune import prune_actions
from partir.solver.reward import Reward, better, metric
from partir.solver.shallow_copies import ShallowCopies, make_shallow_copies
from partir.solver.subaxes import solve_splits
from partir.solver.zero_dims import choose_zero_dims
from partir.strategies import Auto
from partir.strategies.compile import AxisProblem, schedule_axes


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


PROXY_TOLERANCE = 1.25  # full-program metric over the copies' extrapolation, before a redo


def solve(
    goal: Goal,
    *,
    progress: Callable[[str, int, float, float], None] | None = None,
    baselines: bool = True,
) -> Plan:
    """Search the goal's schedule for a plan; the best so far on budget end or Ctrl-C.
    Where a megatron axis is too wide for a weight's dim, its splits are searched too, each
    with the goal's budget (see `subaxes`)."""
    from partir.solver.baselines import expert_plans

    t0 = time.perf_counter()
    with paused_gc():
        plan = _search(goal, t0, progress)
        plan.search["seconds"] = time.perf_counter() - t0
        # a megatron axis too wide for some weight dim: also searched split in two parts
        plan = solve_splits(
            goal, plan, lambda split: solve(split, progress=progress, baselines=False)
        )
        plan.search["seconds"] = time.perf_counter() - t0
        if baselines:
            plan.baselines = {"replicated": goal.cost_model.cost(goal.propagator.empty())}
            plan.baselines.update({name: p.cost for name, p in expert_plans(goal).items()})
    return plan


def _search(goal: Goal, t0: float, progress) -> Plan:
    """On the shallow copies where they stand in for the program (see proxy), else whole;
    whole too when the copies mispredict their plan on the full program."""
    episodes = goal.search.episodes
    why: str | None
    proxy, why = make_shallow_copies(goal) if goal.search.proxy else (None, "switched off")
    if proxy is None:
        return _solve(goal, None, why, progress, _seconds_left(goal, t0), episodes)
    try:
        plan = _solve(goal, proxy, why, progress, _seconds_left(goal, t0), episodes)
    except CopiesMismatch as e:
        return _solve(goal, None, str(e), progress, _seconds_left(goal, t0), episodes)
    why = _mispredicted(plan)
    left = _seconds_left(goal, t0)
    interrupted = any(a["stop_reason"] == "interrupted" for a in plan.search["axes"])
    if why is None or interrupted or left == 0:
        return plan
    # within what is left of `seconds`, but with `episodes` of its own: the copies' search
    # may have spent them all on a plan now known to be off by 1.25x or more
    whole = _solve(goal, None, why, progress, left, episodes)
    spent = {
        "episodes_on_copies": plan.search["episodes"],
        "episodes_on_whole": whole.search["episodes"],
    }
    if better(goal, whole.cost, plan.cost):
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
    proxy: ShallowCopies | None,
    why: str,
    progress: Callable[[str, int, float, float], None] | None,
    seconds: float | None,
    episodes: int | None,
) -> Plan:
    """One search of the schedule within `seconds` and `episodes` (None: no cap), on the
    shallow copies when `proxy` is given, else on the whole program."""
    start = time.perf_counter()
    programs = Programs(goal, proxy)
    programs.apply_manual()
    reward = Reward(goal, programs)
    axes = schedule_axes(goal)
    records: list[AxisRecord] = []
    try:
        for k in range(len(axes)):
            budget = _axis_budget(len(axes) - k, records, start, seconds, episodes)
            records.append(_search_axis(goal, programs, reward, axes, k, budget, progress))
            if records[-1].stop_reason == "interrupted":
                break
    finally:  # the goal's own propagator: later plans of the goal propagate in full
        programs.hold_back(())
    # ZeRO's dims, chosen on the committed plan (the search scored the largest ones)
    programs.full.deferred = choose_zero_dims(
        programs.searched, programs.cost, functools.partial(better, goal)
    )
    state = programs.finish()
    with programs.on_full:
        plan = Plan(goal, state, goal.cost_model.cost(state))
    plan.decisions = [c for c in programs.calls if c]
    # the copies tell cheaply whether propagating the input shardings afresh can pay
    alt = None
    if programs.repropagation_may_pay():
        with programs.on_full:
            alt = _from_inputs(goal, plan)
    repropagated = alt is not None and better(goal, alt.cost, plan.cost)
    if alt is not None and repropagated:
        plan = alt
    plan.search = _search_record(goal, plan, programs, reward, records, proxy, why, repropagated)
    return plan


def _axis_budget(
    axes_left: int,
    records: list[AxisRecord],
    start: float,
    seconds: float | None,
    episodes: int | None,
) -> tuple[int | None, float | None]:
    """(episodes, seconds) for the next axis: what is left of the budgets, shared by the axes
    still to search (an axis that needs less, with nothing to choose or converged, leaves the
    rest to the later ones); None: no cap."""
    axis_episodes = axis_seconds = None
    if episodes is not None:
        axis_episodes = -(-max(episodes - sum(r.episodes for r in records), 0) // axes_left)
    if seconds is not None:
        axis_seconds = max(seconds - (time.perf_counter() - start), 0.0) / axes_left
    return axis_episodes, axis_seconds


def _search_axis(
    goal: Goal,
    programs: Programs,
    reward: Reward,
    axes: list[str],
    k: int,
    budget: tuple[int | None, float | None],
    progress: Callable[[str, int, float, float], None] | None,
) -> AxisRecord:
    """Compile, prune and search axis `axes[k]`, and commit its best state."""
    search, axis, priority = goal.search, axes[k], 10 * (k + 1)
    programs.hold_back(axes[k + 1 :])
    problem = programs.compile_axis(axis, priority)
    reward.later_ways = math.prod(goal.sizes[a] for a in axes[k + 1 :])
    reward.cache.clear()  # rewards depend on the axis (later, the deferred stages)
    zero_stages = AUTO_ZERO_STAGES if _zero_may_help(reward, problem) else ()
    env = AxisEnvironment(programs.searched, axis, priority + 9, reward, zero_stages)
    useful = programs.useful(problem, axis, priority + 9)
    actions, pruned, must = _prune(programs, problem, useful, env, zero_stages)
    programs.offer(actions, must, axis)
    root = AxisNode(programs.states(), False)
    result = mcts.search(
        env,
        root,
        episodes=budget[0],
        seconds=budget[1],
        patience=search.patience,
        uct_c=search.uct_c,
        seed=search.seed + k,
        rollout=search.rollout,
        progress=functools.partial(progress, axis) if progress else None,
    )
    best = result.best_state if result.best_state is not None else root
    chosen = _chosen(programs, best, axis)
    extra = env.zero_at_stop(best.zero_stage)
    programs.commit(best.applied, best.states, axis, priority + 9, extra)
    return AxisRecord(
        axis=axis,
        actions_before=len(problem.actions),
        actions_after=len(actions),
        pruned=pruned,
        episodes=result.episodes,
        seconds=result.seconds,
        stop_reason=result.stop_reason,
        chosen=chosen,
        curve=result.curve,
    )


def _search_record(
    goal: Goal,
    plan: Plan,
    programs: Programs,
    reward: Reward,
    records: list[AxisRecord],
    proxy: ShallowCopies | None,
    why: str,
    repropagated: bool,
) -> dict:
    """What `plan.search` says of the search."""
    predicted = programs.predicted()
    return {
        "seed": goal.search.seed,
        "episodes": sum(r.episodes for r in records),
        "seconds": None,  # set by solve
        # of `seconds`, the work on the full program outside the search: building its
        # propagator and cost model, replaying the decisions, costing the plan
        "full_program_seconds": programs.on_full.seconds,
        "actions_before": sum(r.actions_before for r in records),
        "actions_after": sum(r.actions_after for r in records),
        "pruned": sum(r.pruned for r in records),
        "evaluations": reward.evaluations,
        "explored": reward.explored,
        "proxy": {
            "layers": proxy.layers,
            "used": True,
            "full_over_predicted": metric(goal, plan.cost) / max(metric(goal, predicted), 1e-30),
            "predicted_fits": predicted.fits,
        }
        if proxy and predicted is not None
        else {"used": False, "reason": why},
        "repropagated": repropagated,  # the plan is its input shardings propagated afresh
        "axes": [dataclasses.asdict(r) for r in records],
    }


def _prune(
    programs: Programs,
    problem: AxisProblem,
    actions: list[Action],
    env: AxisEnvironment,
    zero_stages: tuple[int, ...],
) -> tuple[list[Action], int, set[str]]:
    """The axis's actions that CP-SAT leaves (under a memory limit), how many it removed and
    the groups it proves must be tiled. Bounded with the deferred ZeRO/FSDP stages applied,
    which tile the state later, and with the deepest ZeRO the axis may end with (a bound
    must not exceed it)."""
    goal = programs.goal
    if goal.search.prune != "cpsat" or not actions or goal.memory_limit is None:
        return actions, 0, set()
    deepest = env.zero_at_stop(max(zero_stages, default=None))
    with programs.on_full:
        finished = programs.full.with_deferred(programs.full.state, deepest)
    problem = dataclasses.replace(problem, actions=actions)
    result = prune_actions(goal, finished, problem, env.priority, cost=programs.prune_cost(deepest))
    must = {a.group for a in actions if a.values in result.must_tile}
    return result.actions, result.removed, must


def _chosen(programs: Programs, best: AxisNode, axis: str) -> list[str]:
    """What the axis's search chose, for the record: the actions whose tiling is new in
    `best`, and the ZeRO its stop added."""
    deep, state = programs.searched[-1], best.states[-1]
    chosen = [
        str(a)
        for a in deep.actions
        if all(axis in deep.prop.sharding(state, v)[a.dim] for v in a.values)
        and not all(axis in deep.prop.sharding(deep.state, v)[a.dim] for v in a.values)
    ]
    if best.zero_stage is not None:
        chosen.append(str(Stop(best.zero_stage)))
    return chosen


def _zero_may_help(reward: Reward, problem: AxisProblem) -> bool:
    """Whether an axis may end with ZeRO (see Stop): searched with `auto` and no zero of its
    own, and memory matters there (the objective, or the axis's start is over the limit).
    ZeRO trades collectives for memory; offered on time alone it gained nothing on gpt
    small 2x4 and made the search 1.6x longer."""
    if problem.deferred or not any(isinstance(s, Auto) for s in problem.strategies):
        return False
    goal = reward.goal
    if goal.objective == "memory":
        return True
    if goal.memory_limit is None:
        return False
    peak = reward.programs.cost(reward.programs.states()).peak_memory_bytes
    return peak > goal.memory_limit * reward.later_ways


def _from_inputs(goal: Goal, plan: Plan) -> Plan | None:
    """The plan that the input shardings alone give, propagated from scratch."""
    assert plan.state is not None  # a searched plan has its state
    fresh = afresh(goal, plan.state)
    if fresh is None:
        return None
    # no decisions recorded: its plan file is made again from the specs, the same way
    return Plan(goal, fresh[0], goal.cost_model.cost(fresh[0]))
