"""What the search maximises. Reward (higher is better, in (0, 1]): a plan within the memory
limit scores `0.5 + 0.5 * log(1 + s) / log(1 + N)`, where `s` is its speedup over the
replicated plan in the goal's objective (step time, peak memory) and N the number of
devices. For communicated bytes, which the replicated plan has none of, `s` is the
replicated plan's argument bytes over the plan's bytes, unbounded, and the reward
`0.5 + 0.5 * s / (1 + s)`. A plan over the limit scores `0.5 * limit / peak` < 0.5.

So every plan that fits beats every plan that does not, and among those that do not, less
memory is better: the search is pulled towards feasibility instead of seeing a cliff, and
the log spreads speedups up to N evenly over the reward range that UCT compares. While later
axes are still to be searched, "the limit" is the limit times the product of their sizes:
the most they can divide a plan's memory by (the bound CP-SAT prunes with, too). Judged
against the bare limit, every plan of an early axis is over it, and that axis only
minimised memory.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.propagate import State

if TYPE_CHECKING:  # programs compares plans with `better`
    from partir.solver.programs import Deferred, Programs


def metric(goal: Goal, cost: Cost) -> float:
    """The goal's objective: lower is better."""
    if goal.objective == "memory":
        return float(cost.peak_memory_bytes)
    if goal.objective == "comm":
        return float(cost.comm_bytes) + 1.0
    return cost.step_time_s


def better(goal: Goal, a: Cost, b: Cost) -> bool:
    """Whether cost `a` beats `b`: within the memory limit first, then the objective."""
    limit = goal.memory_limit

    def fits(c: Cost) -> bool:
        return limit is None or c.peak_memory_bytes <= limit

    if fits(a) != fits(b):
        return fits(a)
    if not fits(a):
        return a.peak_memory_bytes < b.peak_memory_bytes
    return metric(goal, a) < metric(goal, b)


class Reward:
    """The reward of the searched programs' states (see the module docstring), memoised by
    the states themselves (and the ZeRO a stop adds)."""

    def __init__(self, goal: Goal, programs: Programs) -> None:
        self.goal = goal
        self.programs = programs
        self.log_n = math.log(1 + max(goal.num_devices, 2))
        empty = tuple(p.prop.empty() for p in programs.searched)
        self.reference = programs.cost(empty, deferred=False)
        # the product of the sizes of the axes still to search: a plan's peak is held to the
        # limit times this, the most those axes can divide it by (see the module docstring)
        self.later_ways = 1
        self.cache: dict[tuple[tuple[State, ...], Deferred], float] = {}  # cleared per axis
        self.evaluations = 0
        self.explored: list[tuple[float, int]] = []  # (step time, peak memory) per plan

    def __call__(self, states: tuple[State, ...], extra: Deferred = ()) -> float:
        hit = self.cache.get((states, extra))
        if hit is None:
            self.evaluations += 1
            cost = self.programs.cost(states, extra=extra)
            self.explored.append((cost.step_time_s, cost.peak_memory_bytes))
            hit = self.of(cost)
            self.cache[(states, extra)] = hit
        return hit

    def of(self, cost: Cost) -> float:
        """The reward of a plan that costs `cost`."""
        limit = self.goal.memory_limit
        if limit is not None and cost.peak_memory_bytes > limit * self.later_ways:
            return 0.5 * limit * self.later_ways / cost.peak_memory_bytes
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
