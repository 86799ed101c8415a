"""ZeRO's dims, chosen by the cost model once the search has committed its plan.

The search scores every plan with ZeRO's deferred decisions applied on each group's largest
dividing dim. That dim is not always the cheapest: a scanned layer stack tiled on its layer
dim is gathered whole for each layer's slice (XLA hoists the gather and holds the whole
stack), and a norm scale of a few KiB costs a gather and a reduce-scatter to save almost
nothing. So after the search, a greedy pass over the ZeRO-tiled groups (of `zero` and
`fsdp`) tries leaving the smallest vectors (norm scales, biases) whole, then each other dim
that the axis divides. A matrix stays tiled on some dim: the goal asked ZeRO to shard it,
and on time alone a small model would rather replicate everything (gpt tiny: 11x faster).
The pass runs on the committed plan and keeps a change that the goal's order of plans
(within the memory limit first, then the objective) prefers. A deep model searched on its shallow copies is judged
on them, as the search judged it (a full-program cost per try added 3.6 s to a 96-layer
gpt's solve); the choice is by group name and shape, the same in the copies and the program. It
rides on the strategy (`Zero.dims`, `FSDP.dims`), so the committed decisions, and the plan
file that replays them, carry it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from partir.ir.cost import Cost
from partir.ir.propagate import State
from partir.strategies import FSDP, Zero
from partir.strategies.base import AxisContext, Strategy
from partir.strategies.zero import GroupKey, zero_options

Deferred = list[tuple[int, Strategy]]  # (priority, strategy), as AxisProblem.deferred


def choose_zero_dims(
    views: Sequence[Any],
    cost: Callable[[tuple[State, ...]], Cost],
    better: Callable[[Cost, Cost], bool],
) -> Deferred:
    """The deferred strategies of `views` (the search's views of the program: the whole
    program, or its shallow copies, which share one list of deferred strategies), each
    ZeRO-tiling one given the dims (`dims`) chosen here, and set on every view. A change is
    kept when `better` prefers the `cost` of the views' states with it (as the search scores
    plans), or on a tie needs less memory. First the k smallest vectors left whole together,
    for each k (one alone may not pay: on gpt tiny one layer norm's bias left whole cost 4.6%
    more, all of them less), then one pass over the groups, each tried on its other dims (and
    whole, for a vector)."""
    states = tuple(v.state for v in views)
    deep = views[-1]

    def cost_with(deferred: Deferred) -> Cost:
        for v in views:
            v.deferred = deferred
        return cost(states)

    deferred = list(deep.deferred)
    options = []  # (index in deferred, group key, dims it may take)
    for i, (_, s) in enumerate(deferred):
        if isinstance(s, (Zero, FSDP)):
            params = isinstance(s, FSDP) or s.stage == 3
            ctx = AxisContext(deep.goal, s.axis, deep.state, deep.groups)
            options += [(i, key, dims) for key, dims in zero_options(ctx, params=params).items()]
    best = cost_with(deferred)
    try:
        vectors = [o for o in options if len(o[1][1]) <= 1]
        smallest = sorted(vectors, key=lambda o: math.prod(o[1][1]))
        start = deferred
        limit = deep.goal.memory_limit
        for k in range(1, len(smallest) + 1):
            trial = _with_dim(start, *smallest[k - 1][:2], None)
            start, c = trial, cost_with(trial)
            if limit is not None and c.peak_memory_bytes > limit:
                break  # more groups whole only need more memory
            if _improves(c, best, better):
                best, deferred = c, trial
        for i, key, dims in options:
            current = dict(deferred[i][1].dims).get(key, dims[0])
            for d in [*dims, None] if len(key[1]) <= 1 else dims:
                if d != current:
                    trial = _with_dim(deferred, i, key, d)
                    c = cost_with(trial)
                    if _improves(c, best, better):
                        best, deferred, current = c, trial, d
    except KeyboardInterrupt:  # Ctrl-C: the dims chosen so far (the search is anytime too)
        pass
    for v in views:
        v.deferred = deferred
    return deferred


def _improves(cost: Cost, best: Cost, better: Callable[[Cost, Cost], bool]) -> bool:
    """Whether `better` prefers `cost`, or, on a tie, it needs less memory: ZeRO stays
    where it costs nothing (a scanned stack gathered a layer at a time costs what the
    whole stack does)."""
    if better(cost, best) or better(best, cost):
        return better(cost, best)
    return cost.peak_memory_bytes < best.peak_memory_bytes


def _with_dim(deferred: Deferred, i: int, key: GroupKey, dim: int | None) -> Deferred:
    """`deferred` with its `i`-th strategy giving the group `key` the dim `dim`."""
    priority, s = deferred[i]
    assert isinstance(s, (Zero, FSDP))  # options index only the ZeRO-tiling strategies
    s = dataclasses.replace(s, dims=tuple({**dict(s.dims), key: dim}.items()))
    return [*deferred[:i], (priority, s), *deferred[i + 1 :]]
