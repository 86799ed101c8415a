"""Goals of the cases, sharing one trace per model and size, and the expert plans they are
measured against (those of `partir.solver.baselines`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import partir
from partir.bench.cases import DEVICE, Case
from partir.ir.specs import PlanError
from partir.models import get
from partir.solver.baselines import expert_plans, expert_schedules, replicated_plan
from partir.solver.plan import make_plan


class Traces:
    """One trace per (model, size): goals of different meshes and schedules share it."""

    def __init__(self) -> None:
        self.args: dict[tuple, Any] = {}
        self.traced: dict[tuple, partir.Goal] = {}  # the first goal of each: it holds the trace
        self.trace_seconds: dict[tuple, float] = {}

    def goal(self, c: Case, schedule: Sequence = (), prune: str | None = "cpsat") -> partir.Goal:
        key = (c.model, c.size, c.overrides)
        module = get(c.model)
        if key not in self.args:
            preset = c.size if c.size in module.PRESETS else None
            self.args[key] = module.example_args(abstract=True, preset=preset, **dict(c.overrides))
        fields: dict[str, Any] = dict(
            device=DEVICE,
            memory_limit=c.memory_limit,
            schedule=list(schedule),
            objective=c.objective,
            search=partir.Search(prune=prune),
        )
        if key in self.traced:
            return self.traced[key].replace(mesh=c.mesh_dict, **fields)
        goal = partir.Goal(module.train_step, self.args[key], c.mesh_dict, **fields)
        t0 = time.perf_counter()
        _ = goal.program
        self.trace_seconds[key] = time.perf_counter() - t0
        self.traced[key] = goal
        return goal


def expert_candidates(goal: partir.Goal) -> dict[str, Any]:
    """{name: Plan}: the library's expert plans for the goal (on a 3-D mesh, also those
    that use all three axes), and the replicated plan as a baseline."""
    return {**expert_plans(goal), "replicated": replicated_plan(goal)}


# The expert plan whose strategies are the natural schedule's, where the library has one:
# (model, mesh rank) -> names to try in order.
SAME_SCHEDULE: dict[tuple[str, int], tuple[str, ...]] = {
    ("gpt", 1): ("Z3",),
    ("gpt", 2): ("BP+MP+Z3",),
    ("gpt", 3): ("BP+FSDP+MP",),
    ("mlp", 1): ("Z3",),
    ("mlp", 2): ("BP+MP+Z3",),
    ("mlp", 3): ("BP+FSDP+MP",),
    ("unet", 1): ("Z3",),
    ("unet", 2): ("BP+MP+Z3",),
    ("unet", 3): ("BP+FSDP+MP",),
    ("gns", 1): ("EDGE+Z3",),
    ("gns", 2): ("EDGE+MP+Z3",),
    ("gns", 3): ("EDGE+FSDP+MP",),
    ("moe", 1): ("BP+EP+Z3",),
    ("moe", 2): ("BP+EP+MP+Z3",),
    ("moe", 3): ("BP+FSDP+EP+MP",),
}


def same_schedule_expert(model: str, rank: int, plans: dict[str, Any]) -> str | None:
    return next((n for n in SAME_SCHEDULE.get((model, rank), ()) if n in plans), None)


def same_only(c: Case, goal: partir.Goal) -> dict[str, Any]:
    """{name: Plan} with only the same-schedule expert of a natural-schedule case."""
    builders = expert_schedules(goal)
    name = same_schedule_expert(c.model, len(c.mesh), builders)
    try:
        return {name: make_plan(goal, builders[name]())} if name else {}
    except PlanError:
        return {}


def best_expert(plans: dict[str, Any]) -> tuple[str, Any] | None:
    """The fastest sharded expert plan that fits the memory limit; if none fits, the
    smallest. The replicated plan is a baseline, not an expert: it is left out."""
    plans = {k: p for k, p in plans.items() if k != "replicated"}
    if not plans:
        return None
    fitting = {k: p for k, p in plans.items() if p.cost.fits}
    if fitting:
        return min(fitting.items(), key=lambda kv: (kv[1].cost.step_time_s, kv[0]))
    return min(plans.items(), key=lambda kv: (kv[1].cost.peak_memory_bytes, kv[0]))
