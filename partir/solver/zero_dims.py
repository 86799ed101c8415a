"""ZeRO's dims, chosen by the cost model once the search has committed its plan.

The search scores every plan with ZeRO's deferred decisions applied on each group's largest
dividing dim. That dim is not always the cheapest: an embedding table tiled on its vocab dim
is gathered whole before every lookup, where tiled on d_model the lookup runs on the shard;
a norm scale of a few KiB costs a gather and a reduce-scatter (two latencies) to save
almost nothing. So after the search, a greedy pass over the ZeRO-tiled groups (of `zero`
and `fsdp`) tries each other dim that the axis divides, and leaving the group whole, on the
full plan, and keeps a change the goal's order of plans (within the memory limit first, then
the objective) prefers. The choice rides on the strategy (`Zero.dims`, `FSDP.dims`), so the
committed decisions, and the plan file that replays them, carry it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.groups import Group
from partir.ir.propagate import State
from partir.strategies import FSDP, Zero
from partir.strategies.base import AxisContext, Strategy
from partir.strategies.compile import zero_decisions
from partir.strategies.zero import zero_options

Deferred = list[tuple[int, Strategy]]  # (priority, strategy), as AxisProblem.deferred


def choose_zero_dims(
    goal: Goal,
    state: State,
    groups: list[Group],
    deferred: Deferred,
    better: Callable[[Cost, Cost], bool],
) -> Deferred:
    """`deferred` with each ZeRO-tiling strategy given the dims (`dims`) that the greedy
    pass chose for `state`: one pass over the groups, each tried on its other dims and
    whole, a change kept when `better` prefers the full plan's cost."""
    deferred = list(deferred)
    best = _cost(goal, state, groups, deferred)
    for i, (priority, s) in enumerate(deferred):
        if not isinstance(s, (Zero, FSDP)):
            continue
        params = isinstance(s, FSDP) or s.stage == 3
        options = zero_options(AxisContext(goal, s.axis, state, groups), params=params)
        for name, dims in options.items():
            chosen = dict(s.dims)
            current = chosen.get(name, dims[0])
            for d in [*dims, None]:
                if d == current:
                    continue
                trial = dataclasses.replace(s, dims=tuple({**chosen, name: d}.items()))
                trial_deferred = [*deferred[:i], (priority, trial), *deferred[i + 1 :]]
                cost = _cost(goal, state, groups, trial_deferred)
                if better(cost, best):
                    best, s, deferred, current = cost, trial, trial_deferred, d
    return deferred


def _cost(goal: Goal, state: State, groups: list[Group], deferred: Deferred) -> Cost:
    """The cost of `state` with the deferred decisions applied."""
    decisions = zero_decisions(goal, state, groups, deferred)
    return goal.cost_model.cost(goal.propagator.apply_all(state, decisions)[0], detail=False)
