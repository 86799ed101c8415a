"""One case: search it, cost its experts, and compile both with XLA."""

from __future__ import annotations

import json
import time
from typing import Any

from partir.bench.cases import DEVICES, Case, schedule_for, schedule_text
from partir.bench.experts import (
    Traces,
    best_expert,
    expert_candidates,
    same_only,
    same_schedule_expert,
)
from partir.bench.xla import ratio, xla_figures
from partir.solver.search import solve


def _curve_totals(search: dict) -> tuple[int, float]:
    """Episodes and seconds to the final plan: per axis, the last improvement of the
    best-reward curve, summed over axes."""
    episodes, seconds = 0, 0.0
    for axis in search.get("axes", []):
        curve = axis.get("curve") or []
        if curve:
            episodes += int(curve[-1][0])
            seconds += float(curve[-1][1])
    return episodes, seconds


def _cost_dict(cost) -> dict:
    return {
        "step_time_s": cost.step_time_s,
        "peak_memory_bytes": int(cost.peak_memory_bytes),
        "comm_bytes": int(cost.comm_bytes),
        "fits": bool(cost.fits),
    }


def _spec_str(spec) -> str:
    return "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"


def run_case(
    c: Case,
    programs: Traces,
    *,
    xla: bool = True,
    xla_cache: dict | None = None,
    expert_cache: dict | None = None,
    experts: str = "all",
) -> dict:
    """Search one case, cost its experts (`experts`: "all", "same" for the same-schedule
    one only, or "none"), and (<= 8 devices) compile the searched and the best expert plan."""
    schedule = schedule_for(c.model, c.mesh_dict, c.schedule)
    out: dict[str, Any] = {
        "model": c.model,
        "size": c.size,
        "overrides": dict(c.overrides),
        "mesh": c.mesh_dict,
        "devices": c.devices,
        "schedule": c.schedule,
        "objective": c.objective,
        "strategies": schedule_text(schedule),
    }
    t0 = time.perf_counter()
    try:
        goal = programs.goal(c, schedule, prune=c.prune)
        out["ops"] = len(goal.program.ops)
        plan = solve(goal, baselines=False)
    except Exception as err:  # one case failing must not stop the suite
        out["error"] = f"{type(err).__name__}: {err}"
        out["wall_seconds"] = time.perf_counter() - t0
        return out
    episodes_to_best, seconds_to_best = _curve_totals(plan.search)
    out["searched"] = {
        **_cost_dict(plan.cost),
        "seconds": plan.search["seconds"],
        "episodes": plan.search["episodes"],
        "episodes_to_best": episodes_to_best,
        "seconds_to_best": seconds_to_best,
        "actions_before": plan.search["actions_before"],
        "actions_after": plan.search["actions_after"],
        "pruned": plan.search["pruned"],
        "mcts_seconds": sum(a["seconds"] for a in plan.search["axes"]),
        "full_program_seconds": plan.search["full_program_seconds"],
        "proxy": plan.search["proxy"],
        "rules": [[p, _spec_str(s)] for p, s in plan.to_rules()],
    }
    if experts == "none":
        out["wall_seconds"] = time.perf_counter() - t0
        return out
    ekey = (c.model, c.size, c.overrides, c.mesh, c.memory_limit, experts)
    if expert_cache is not None and ekey in expert_cache:
        egoal, plans = expert_cache[ekey]
    else:
        egoal = programs.goal(c)
        plans = expert_candidates(egoal) if experts == "all" else same_only(c, egoal)
        if expert_cache is not None:
            expert_cache[ekey] = (egoal, plans)
    out["experts"] = {k: _cost_dict(p.cost) for k, p in plans.items() if k != "replicated"}
    if "replicated" in plans:
        out["replicated"] = _cost_dict(plans["replicated"].cost)
    out["searched"]["is_replicated"] = not any(any(s) for s in plan.input_tilings.values())
    best = best_expert(plans) if experts == "all" else None
    if best is not None:
        name, eplan = best
        out["expert"] = {"name": name, **_cost_dict(eplan.cost)}
        out["ratio"] = ratio(plan.cost.step_time_s, eplan.cost.step_time_s)
        out["memory_ratio"] = ratio(plan.cost.peak_memory_bytes, eplan.cost.peak_memory_bytes)
    same = same_schedule_expert(c.model, len(c.mesh), plans) if c.schedule == "natural" else None
    if same is not None:
        out["same_schedule_expert"] = {"name": same, **_cost_dict(plans[same].cost)}
        out["same_schedule_ratio"] = ratio(plan.cost.step_time_s, plans[same].cost.step_time_s)
    if xla and c.devices <= DEVICES:
        out["xla"] = {}
        compiled = [("searched", goal, plan), ("expert", egoal, best and best[1])]
        if same is not None and (best is None or same != best[0]):
            compiled.append(("same_schedule_expert", egoal, plans[same]))
        for who, g, p in compiled:
            if p is None:
                continue
            key = (
                c.model,
                c.size,
                c.overrides,
                c.mesh,
                json.dumps({k: list(v) for k, v in sorted(p.input_tilings.items())}),
            )
            try:
                if xla_cache is not None and key in xla_cache:
                    out["xla"][who] = dict(xla_cache[key], cached=True)
                else:
                    out["xla"][who] = xla_figures(g, p)
                    if xla_cache is not None:
                        xla_cache[key] = out["xla"][who]
            except Exception as err:
                out["xla"][who] = {"error": f"{type(err).__name__}: {err}"}
        s, e = out["xla"].get("searched", {}), out["xla"].get("expert", {})
        if "collective_bytes" in s and "collective_bytes" in e:
            out["xla"]["collective_ratio"] = ratio(s["collective_bytes"], e["collective_bytes"])
            out["xla"]["memory_ratio"] = ratio(s["peak_bytes"], e["peak_bytes"])
        same_x = out["xla"].get("same_schedule_expert", e if same is not None else {})
        if "collective_bytes" in s and "collective_bytes" in same_x:
            out["xla"]["same_schedule_collective_ratio"] = ratio(
                s["collective_bytes"], same_x["collective_bytes"]
            )
            out["xla"]["same_schedule_priced_comm_ratio"] = ratio(
                s["priced_comm_s"], same_x["priced_comm_s"]
            )
    out["wall_seconds"] = time.perf_counter() - t0
    return out
