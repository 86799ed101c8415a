"""ZeRO's dims, chosen by the cost model once the search has committed its plan.

The search scores every plan with ZeRO's deferred decisions applied on each group's largest
dividing dim. That dim is not always the cheapest: a scanned layer stack tiled on its layer
dim is gathered whole for each layer's slice (XLA hoists the gather and holds the whole
stack), and a norm scale of a few KiB costs a gather and a reduce-scatter to save almost
nothing. So after the search, a greedy pass over the ZeRO-tiled groups (of `zero` and
`fsdp`) tries each other dim that the axis divides, and leaving the group whole, on the
committed plan, and keeps a change that the goal's order of plans (within the memory limit
first, then the objective) prefers. A deep model searched on its shallow copies is judged
on them, as the search judged it (a full-program cost per try added 3.6 s to a 96-layer
gpt's solve); the choice is by group name and shape, the same in the copies and the program. It
rides on the strategy (`Zero.dims`, `FSDP.dims`), so the committed decisions, and the plan
file that replays them, carry it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from partir.ir.cost import Cost
from partir.ir.propagate import State
from partir.strategies import FSDP, Zero
from partir.strategies.base import AxisContext, Strategy
from partir.strategies.zero import zero_options

Deferred = list[tuple[int, Strategy]]  # (priority, strategy), as AxisProblem.deferred


def choose_zero_dims(
    views: Sequence[Any],
    cost: Callable[[tuple[State, ...]], Cost],
    better: Callable[[Cost, Cost], bool],
) -> Deferred:
    """The deferred strategies of `views` (the search's views of the program: the whole
    program, or its shallow copies, which share one list of deferred strategies), each
    ZeRO-tiling one given the dims (`dims`) the greedy pass chose, and set on every view.
    One pass over the groups, each tried on its other dims and whole; a change is kept when
    `better` prefers the `cost` of the views' states with it (as the search scores plans)."""
    states = tuple(v.state for v in views)
    deep = views[-1]

    def cost_with(deferred: Deferred) -> Cost:
        for v in views:
            v.deferred = deferred
        return cost(states)

    deferred = list(deep.deferred)
    best = cost_with(deferred)
    try:
        for i, (priority, s) in enumerate(deferred):
            if not isinstance(s, (Zero, FSDP)):
                continue
            params = isinstance(s, FSDP) or s.stage == 3
            ctx = AxisContext(deep.goal, s.axis, deep.state, deep.groups)
            for key, dims in zero_options(ctx, params=params).items():
                chosen = dict(s.dims)
                current = chosen.get(key, dims[0])
                for d in [*dims, None]:
                    if d == current:
                        continue
                    trial = dataclasses.replace(s, dims=tuple({**chosen, key: d}.items()))
                    trial_deferred = [*deferred[:i], (priority, trial), *deferred[i + 1 :]]
                    c = cost_with(trial_deferred)
                    if better(c, best):
                        best, s, deferred, current = c, trial, trial_deferred, d
    except KeyboardInterrupt:  # Ctrl-C: the dims chosen so far (the search is anytime too)
        pass
    for v in views:
        v.deferred = deferred
    return deferred
