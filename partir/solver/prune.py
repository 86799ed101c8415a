"""CP-SAT pruning of one axis's action space (ortools).

Per group of inputs (the values an action tiles), one Boolean per action and one for
"left whole" on this axis, exactly one true. Divisibility is already in the actions;
an axis once per value holds because a group takes one action. Memory: the per-device
argument bytes, a linear lower bound (each value divided by the axis if tiled, and by every
axis still to come at best), plus an activation estimate (the current activation memory
divided by every axis still to come) must fit the limit. The state given is the searched
one with the ZeRO/FSDP stages that are deferred to the end already applied: they tile the
parameters, gradients and optimizer state after the search, and a bound that left them out
declared limits infeasible that the plan meets.

The pass removes every action that is part of no feasible assignment, finds the groups
that every feasible assignment tiles (the search may not stop before it has tiled them),
and when nothing is feasible says why with numbers. A limit that every assignment meets
prunes nothing, and CP-SAT is not asked (a limit of 1e22 bytes overflowed its integers).
The model is solved by `partir.solver.cpsat`: in a subprocess once TensorFlow has been
imported, with which OR-tools' native code crashes in one process.
"""

from __future__ import annotations

import dataclasses
import math

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.messages import fmt_bytes
from partir.ir.propagate import State
from partir.solver import cpsat
from partir.strategies.compile import AxisProblem, schedule_axes


class InfeasibleMemory(ValueError):
    """No assignment of the schedule fits the memory limit; `smallest_bytes` is the least
    per-device memory any assignment needs (estimate), `limit_bytes` the limit."""

    smallest_bytes: int | None = None
    limit_bytes: int | None = None
    axis: str | None = None


@dataclasses.dataclass
class Pruned:
    actions: list  # the actions kept
    must_tile: list[tuple[int, ...]]  # groups (their value ids) every feasible plan tiles
    removed: int


SCALE = 1024  # CP-SAT works on integers: bytes in KiB, rounded so bounds stay sound


def prune_actions(
    goal: Goal,
    state: State,
    problem: AxisProblem,
    priority: int,
    cost: Cost | None = None,
) -> Pruned:
    """`state`: with the deferred ZeRO/FSDP stages applied (see the module docstring).
    `cost`: the cost of `state` when the caller has it (or an extrapolation of it, as the
    proxy search has); else it is computed."""
    limit = goal.memory_limit
    if limit is None or not problem.actions:
        return Pruned(list(problem.actions), [], 0)

    model_ = goal.cost_model
    axes = schedule_axes(goal)
    later = axes[axes.index(problem.axis) + 1 :]
    n = goal.sizes[problem.axis]
    rest = math.prod(goal.sizes[a] for a in later)
    if cost is None:
        cost = model_.cost(state, detail=False)
    activations = max(cost.peak_memory_bytes - cost.argument_bytes, 0) / (n * rest)
    local = model_.local_bytes(state)
    inputs = list(goal.program.inputs.values())

    groups: dict[tuple[int, ...], list[int]] = {}
    for i, a in enumerate(problem.actions):
        groups.setdefault(a.values, []).append(i)
    in_group = {v for values in groups for v in values}
    # inputs no action tiles may still be tiled on this axis by propagation or ZeRO
    fixed = sum(local[v] for v in inputs if v not in in_group) / (rest * n)

    model: list[tuple[int, list[int]]] = []
    for g, idx in groups.items():
        size = sum(local[v] for v in g) / rest
        model.append((math.floor(size / SCALE), [math.floor(size / n / SCALE)] * len(idx)))
    largest = fixed + activations + sum(sum(local[v] for v in g) / rest for g in groups)
    if limit >= largest:  # every assignment fits: nothing to prune (nor a huge budget to pass)
        return Pruned(list(problem.actions), [], 0)
    budget = math.ceil((limit - fixed - activations) / SCALE)
    smallest = fixed + activations + sum(sum(local[v] for v in g) / rest / n for g in groups)
    order = [i for idx in groups.values() for i in idx]  # action index of each model action
    queries = [
        None,
        *(("action", j) for j in range(len(order))),
        *(("whole", k) for k in range(len(groups))),
    ]
    answers = cpsat.feasible(model, budget, queries)
    if not answers[0]:
        err = InfeasibleMemory(
            f"every plan of this schedule needs at least {fmt_bytes(smallest)} per device; the "
            f"limit is {fmt_bytes(limit)} (a lower bound: arguments tiled on every axis of the "
            "schedule, the activations of the cost model divided by every axis); raise the "
            "limit, add mesh axes, or add zero/fsdp to the schedule"
        )
        err.smallest_bytes, err.limit_bytes, err.axis = int(smallest), int(limit), problem.axis
        raise err
    ok_action = {order[j]: answers[1 + j] for j in range(len(order))}
    kept = [a for i, a in enumerate(problem.actions) if ok_action[i]]
    must = [g for k, g in enumerate(groups) if not answers[1 + len(order) + k]]
    return Pruned(kept, must, len(problem.actions) - len(kept))
