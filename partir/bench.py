"""The benchmark suite: where partir stands against expert plans and against XLA.

`partir bench [--quick] [--json] [--report FILE]` runs it. Four parts:

- **cases**: every model of the zoo, tiny and at a realistic size, on 1-D, 2-D and 3-D
  meshes, each with its natural schedule and with `auto` on every axis. Per case: the best
  expert plan that fits the memory limit, the searched plan, their estimated step times
  and memory, and, on meshes of at most 8 devices, what XLA compiles for both (on fake CPU
  devices, from abstract args).
- **scaling**: search time of gpt at 12, 24, 48 and 96 layers of one width.
- **fidelity**: the cost model's collective bytes and memory over XLA's, for every plan
  compiled.
- **pruning**: the 2-D natural-schedule searches again with CP-SAT pruning off.

Step times and memory are the cost model's estimates (for the goal's device, tpu-v4); they
are compared as ratios within one run. Search seconds are wall-clock on whatever machine
runs the bench: indicative only, and best read as ratios too.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

DEVICES = 8  # fake CPU devices for the XLA checks; meshes of more devices are not compiled
DEVICE = "tpu-v4"
MEMORY_LIMIT = "32GiB"  # tpu-v4 HBM
DEFAULT_REPORT = os.path.join("docs", "benchmarks.md")

# Realistic sizes: a preset and overrides. gpt 1b at batch 32, as examples/gpt.partir
# (at the preset's batch 256, f32 without rematerialisation, no plan fits 32 GiB on 64 chips).
REALISTIC: dict[str, tuple[str, dict[str, Any]]] = {
    "mlp": ("1b", {}),
    "gpt": ("1b", {"batch": 32}),
    "gns": ("base", {}),
    "unet": ("base", {}),
    "moe": ("base", {}),
}
MODELS = ("mlp", "gpt", "gns", "unet", "moe")
GNS_EDGE_INPUTS = ("batch/edges", "batch/senders", "batch/receivers")

# Meshes by rank: the first axis is data, the second model (or fsdp on 3-D), the third tensor.
MESH_1D = {"data": 8}
MESH_2D_SMALL = {"data": 2, "model": 4}
MESH_2D = {"data": 8, "model": 8}
MESH_2D_LARGE = {"data": 16, "model": 16}
MESH_3D_SMALL = {"data": 2, "fsdp": 2, "tensor": 2}
MESH_3D = {"data": 4, "fsdp": 4, "tensor": 4}

# Scaling: gpt of this width at these depths, on the small 2-D mesh, natural schedule.
SCALING_LAYERS = (12, 24, 48, 96)
# tiny models also searched for the fewest collective bytes (objective "comm") on 2x4: the
# natural schedule's time-optimal plan trades bytes for fewer collectives there
COMM_MODELS = ("mlp", "gpt")
SCALING_SIZE = {"d_model": 128, "heads": 4, "seq": 64, "batch": 16, "vocab": 512}


# ----------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark case: a model at a size, a mesh and a schedule kind."""

    model: str
    size: str  # preset name
    mesh: tuple[tuple[str, int], ...]
    schedule: str = "natural"  # or "auto"
    overrides: tuple[tuple[str, Any], ...] = ()
    prune: str | None = "cpsat"
    memory_limit: int | str = MEMORY_LIMIT
    objective: str = "time"  # the goal's objective: "time", "memory" or "comm"

    @property
    def mesh_dict(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def devices(self) -> int:
        return math.prod(n for _, n in self.mesh)

    @property
    def mesh_str(self) -> str:
        return "x".join(str(n) for _, n in self.mesh)

    @property
    def label(self) -> str:
        schedule = _schedule_str(self.schedule, self.objective)
        return f"{self.model} {self.size} {self.mesh_str} {schedule}"


def _schedule_str(schedule: str, objective: str) -> str:
    return schedule if objective == "time" else f"{schedule}, {objective}"


def case(
    model: str,
    size: str,
    mesh: dict[str, int],
    schedule: str = "natural",
    prune: str | None = "cpsat",
    objective: str = "time",
    **overrides: Any,
) -> Case:
    if size != "tiny" and not overrides and model in REALISTIC and REALISTIC[model][0] == size:
        overrides = dict(REALISTIC[model][1])
    return Case(
        model, size, tuple(mesh.items()), schedule, tuple(sorted(overrides.items())), prune,
        objective=objective,
    )  # fmt: skip


def realistic(model: str, mesh: dict[str, int], schedule: str = "natural") -> Case:
    preset, overrides = REALISTIC[model]
    return case(model, preset, mesh, schedule, **overrides)


def full_cases() -> list[Case]:
    """Tiny models on the meshes XLA can compile here (<= 8 devices), natural and auto (and
    mlp, gpt on 2x4 with the comm objective); realistic sizes on 8x8 (natural and auto), 16x16 and 4x4x4 (natural only: auto on
    them would double the suite's time)."""
    out = []
    for model in MODELS:
        for mesh in (MESH_1D, MESH_2D_SMALL, MESH_3D_SMALL):
            out += [case(model, "tiny", mesh, s) for s in ("natural", "auto")]
    # gpt between the two: its `small` preset (12 layers, d_model 256), compiled on 2x4
    out += [case(model, "tiny", MESH_2D_SMALL, objective="comm") for model in COMM_MODELS]
    out += [
        case("gpt", "small", m, s) for m in (MESH_2D_SMALL, MESH_2D) for s in ("natural", "auto")
    ]
    for model in MODELS:
        out += [realistic(model, MESH_2D, s) for s in ("natural", "auto")]
        out += [realistic(model, MESH_2D_LARGE), realistic(model, MESH_3D)]
    return out


def quick_cases() -> list[Case]:
    out = []
    for model in MODELS:
        out += [case(model, "tiny", MESH_2D_SMALL, s) for s in ("natural", "auto")]
    out += [case(model, "tiny", MESH_2D_SMALL, objective="comm") for model in COMM_MODELS]
    out.append(realistic("gpt", MESH_2D))
    return out


def schedule_for(model: str, mesh: dict[str, int], kind: str) -> list:
    """The strategies of a case. `auto`: auto on every axis. `natural`, by mesh rank:

    - data axis: batch + zero(stage=3) (gns: batch on the edge inputs; moe on a 1-D mesh:
      expert too);
    - 2-D model axis: megatron (moe: expert + megatron);
    - 3-D: data: batch; fsdp: fsdp (gns: batch on edges + zero 3); tensor: as the model
      axis of 2-D.
    """
    from partir import strategies as S

    axes = list(mesh)
    if kind == "auto":
        return [S.auto(a) for a in axes]
    if kind != "natural":
        raise ValueError(f"schedule kind must be 'natural' or 'auto', not {kind!r}")

    def batch(axis):
        return S.batch(axis, inputs=GNS_EDGE_INPUTS) if model == "gns" else S.batch(axis)

    def model_axis(axis):
        if model == "moe":
            return [S.expert(axis), S.megatron(axis)]
        return [S.megatron(axis)]

    data = axes[0]
    if len(axes) == 1:
        out = [batch(data), S.zero(data, 3)]
        return out + ([S.expert(data)] if model == "moe" else [])
    if len(axes) == 2:
        return [batch(data), S.zero(data, 3), *model_axis(axes[1])]
    fsdp, tensor = axes[1], axes[2]
    sharded = [batch(fsdp), S.zero(fsdp, 3)] if model == "gns" else [S.fsdp(fsdp)]
    return [batch(data), *sharded, *model_axis(tensor)]


def schedule_text(schedule: Sequence) -> str:
    """`data: batch+zero3 | model: megatron`."""
    by_axis: dict[str, list[str]] = {}
    for s in schedule:
        name = s.name + (str(s.stage) if s.name == "zero" else "")
        by_axis.setdefault(s.axis, []).append(name)
    return " | ".join(f"{a}: {'+'.join(names)}" for a, names in by_axis.items())


# ----------------------------------------------------------------------------- goals, experts


class _Programs:
    """One trace per (model, size): goals of different meshes and schedules share it."""

    def __init__(self) -> None:
        self.args: dict[tuple, Any] = {}
        self.programs: dict[tuple, Any] = {}
        self.trace_seconds: dict[tuple, float] = {}

    def goal(self, c: Case, schedule: Sequence = (), prune: str | None = "cpsat"):
        import partir
        from partir.models import get

        key = (c.model, c.size, c.overrides)
        module = get(c.model)
        if key not in self.args:
            preset = c.size if c.size in module.PRESETS else None
            self.args[key] = module.example_args(abstract=True, preset=preset, **dict(c.overrides))
        goal = partir.Goal(
            module.train_step,
            self.args[key],
            c.mesh_dict,
            device=DEVICE,
            memory_limit=c.memory_limit,
            schedule=list(schedule),
            objective=c.objective,
            search=partir.Search(prune=prune),
        )
        if key not in self.programs:
            t0 = time.perf_counter()
            self.programs[key] = goal.program
            self.trace_seconds[key] = time.perf_counter() - t0
        else:  # a fresh propagator and cost model, the traced program shared
            goal.__dict__["program"] = self.programs[key]
        return goal


def _three_d_experts(goal) -> dict[str, Callable[[], list]]:
    """Expert plans that use all three axes of a data x fsdp x tensor mesh (the library's
    expert plans use the first two axes only)."""
    from partir.strategies.experts import (
        _data_paths,
        _family,
        batch_rules,
        expert_parallel_rules,
        megatron_rules,
        zero_rules,
    )

    data, fsdp, tensor = list(goal.mesh)[:3]
    family = _family(goal)
    plans: dict[str, Callable[[], list]] = {}
    if family == "graph":
        edge = [p for p in _data_paths(goal) if any(k in p for k in ("edges", "senders",
                                                                    "receivers"))]  # fmt: skip
        plans["EDGE+FSDP"] = lambda: [batch_rules(goal, data, edge), batch_rules(goal, fsdp, edge),
                                      zero_rules(goal, fsdp, params=True)]  # fmt: skip
        return plans

    def bp2():
        return [batch_rules(goal, data), batch_rules(goal, fsdp)]

    plans["BP+FSDP"] = lambda: [*bp2(), zero_rules(goal, fsdp, params=True)]
    if family in ("transformer", "moe", "mlp"):
        mp = megatron_rules(goal, tensor)
        plans["BP+FSDP+MP"] = lambda: [*bp2(), mp, zero_rules(goal, fsdp, params=True,
                                                               taken=[mp])]  # fmt: skip
    if family == "moe":
        ep = expert_parallel_rules(goal, tensor)
        plans["BP+FSDP+EP"] = lambda: [*bp2(), ep, zero_rules(goal, fsdp, params=True,
                                                               taken=[ep])]  # fmt: skip
    return plans


def expert_candidates(goal) -> dict[str, Any]:
    """{name: Plan}: the library's expert plans for the goal, the replicated plan (as a
    baseline), and on a 3-D mesh plans that use all three axes."""
    from partir.ir.specs import PlanError
    from partir.solver.plan import make_plan
    from partir.strategies.experts import expert_plans

    plans = dict(expert_plans(goal))
    plans["replicated"] = make_plan(goal, {})
    if len(goal.mesh) >= 3:
        for name, build in _three_d_experts(goal).items():
            try:
                plans[name] = make_plan(goal, build())
            except PlanError:
                continue
    return plans


# The expert plan whose strategies are the natural schedule's, where the library has one:
# (model, mesh rank) -> names to try in order.
SAME_SCHEDULE: dict[tuple[str, int], tuple[str, ...]] = {
    ("gpt", 1): ("Z3",), ("gpt", 2): ("BP+MP+Z3",), ("gpt", 3): ("BP+FSDP+MP",),
    ("mlp", 1): ("Z3",), ("mlp", 2): ("BP+MP+Z3",), ("mlp", 3): ("BP+FSDP+MP",),
    ("unet", 1): ("Z3",), ("gns", 1): ("EDGE+Z3",),
}  # fmt: skip


def same_schedule_expert(model: str, rank: int, plans: dict[str, Any]) -> str | None:
    return next((n for n in SAME_SCHEDULE.get((model, rank), ()) if n in plans), None)


def _same_only(c: Case, goal) -> dict[str, Any]:
    """{name: Plan} with only the same-schedule expert of a natural-schedule case."""
    from partir.ir.specs import PlanError
    from partir.solver.plan import make_plan
    from partir.strategies.experts import expert_schedules

    builders = dict(expert_schedules(goal))
    if len(goal.mesh) >= 3:
        builders.update(_three_d_experts(goal))
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


# ----------------------------------------------------------------------------- XLA


def _xla(goal, plan) -> dict:
    """What XLA compiles for `plan`, beside the cost model's prediction (per device)."""
    from partir.ir.xla import as_cpu_kinds
    from partir.solver.verify import priced_comm_s, verify

    t0 = time.perf_counter()
    report = verify(goal, plan)
    predicted = as_cpu_kinds(plan.cost.bytes_by_kind())
    compiled = report.compiled
    return {
        "collective_bytes": int(sum(compiled.values())),
        "collective_bytes_by_kind": {k: int(v) for k, v in compiled.items() if v},
        "collective_count": sum(c.multiplicity for c in report.stats.collectives),
        # estimate: the compiled collectives priced by the cost model's alpha-beta terms
        "priced_comm_s": priced_comm_s(report.stats, goal.cost_model),
        # arguments + outputs + temporaries - aliases: XLA:CPU's own peak_memory_in_bytes
        # counts only arguments and outputs (see CompiledStats.allocated_bytes).
        "peak_bytes": int(report.stats.allocated_bytes),
        "reported_peak_bytes": int(report.stats.peak_bytes),
        "argument_bytes": int(report.stats.argument_bytes),
        "predicted_collective_bytes": int(sum(predicted.values())),
        "predicted_collective_bytes_by_kind": {k: int(v) for k, v in predicted.items() if v},
        "predicted_peak_bytes": int(plan.cost.peak_memory_bytes),
        "predicted_argument_bytes": int(plan.cost.argument_bytes),
        "ok": bool(report.ok),
        "compile_seconds": time.perf_counter() - t0,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, with 0 / 0 = 1 and x / 0 = None (undefined)."""
    if a is None or b is None:
        return None
    if b == 0:
        return 1.0 if a == 0 else None
    return a / b


# ----------------------------------------------------------------------------- one case


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
    programs: _Programs,
    *,
    xla: bool = True,
    xla_cache: dict | None = None,
    expert_cache: dict | None = None,
    experts: str = "all",
) -> dict:
    """Search one case, cost its experts (`experts`: "all", "same" for the same-schedule
    one only, or "none"), and (<= 8 devices) compile the searched and the best expert plan."""
    from partir.solver.search import solve

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
        plans = expert_candidates(egoal) if experts == "all" else _same_only(c, egoal)
        if expert_cache is not None:
            expert_cache[ekey] = (egoal, plans)
    out["experts"] = {k: _cost_dict(p.cost) for k, p in plans.items() if k != "replicated"}
    if "replicated" in plans:
        out["replicated"] = _cost_dict(plans["replicated"].cost)
    out["searched"]["is_replicated"] = not any(any(s) for s in plan.in_shardings.values())
    best = best_expert(plans) if experts == "all" else None
    if best is not None:
        name, eplan = best
        out["expert"] = {"name": name, **_cost_dict(eplan.cost)}
        out["ratio"] = _ratio(plan.cost.step_time_s, eplan.cost.step_time_s)
        out["memory_ratio"] = _ratio(plan.cost.peak_memory_bytes, eplan.cost.peak_memory_bytes)
    same = same_schedule_expert(c.model, len(c.mesh), plans) if c.schedule == "natural" else None
    if same is not None:
        out["same_schedule_expert"] = {"name": same, **_cost_dict(plans[same].cost)}
        out["same_schedule_ratio"] = _ratio(plan.cost.step_time_s, plans[same].cost.step_time_s)
    if xla and c.devices <= DEVICES:
        out["xla"] = {}
        compiled = [("searched", goal, plan), ("expert", egoal, best and best[1])]
        if same is not None and (best is None or same != best[0]):
            compiled.append(("same_schedule_expert", egoal, plans[same]))
        for who, g, p in compiled:
            if p is None:
                continue
            key = (c.model, c.size, c.overrides, c.mesh, json.dumps(
                {k: list(v) for k, v in sorted(p.in_shardings.items())}))  # fmt: skip
            try:
                if xla_cache is not None and key in xla_cache:
                    out["xla"][who] = dict(xla_cache[key], cached=True)
                else:
                    out["xla"][who] = _xla(g, p)
                    if xla_cache is not None:
                        xla_cache[key] = out["xla"][who]
            except Exception as err:
                out["xla"][who] = {"error": f"{type(err).__name__}: {err}"}
        s, e = out["xla"].get("searched", {}), out["xla"].get("expert", {})
        if "collective_bytes" in s and "collective_bytes" in e:
            out["xla"]["collective_ratio"] = _ratio(s["collective_bytes"], e["collective_bytes"])
            out["xla"]["memory_ratio"] = _ratio(s["peak_bytes"], e["peak_bytes"])
        same_x = out["xla"].get("same_schedule_expert", e if same is not None else {})
        if "collective_bytes" in s and "collective_bytes" in same_x:
            out["xla"]["same_schedule_collective_ratio"] = _ratio(
                s["collective_bytes"], same_x["collective_bytes"]
            )
            out["xla"]["same_schedule_priced_comm_ratio"] = _ratio(
                s["priced_comm_s"], same_x["priced_comm_s"]
            )
    out["wall_seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- scaling, pruning


def run_scaling(
    layers: Iterable[int] = SCALING_LAYERS,
    size: dict[str, Any] | None = None,
    mesh: dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    scans: Iterable[bool] = (False, True),
) -> dict:
    """Search time of gpt at each depth (same width), natural schedule, with its layers
    unrolled (a list) and under `lax.scan`; ratios to the first depth of each."""
    size = dict(SCALING_SIZE if size is None else size)
    mesh = dict(MESH_2D_SMALL if mesh is None else mesh)
    rows = []
    for scan in scans:
        rows += _scaling_run(layers, size, mesh, scan, progress)
    return {
        "model": "gpt",
        "size": size,
        "mesh": mesh,
        "strategies": schedule_text(schedule_for("gpt", mesh, "natural")),
        "rows": rows,
    }


def _scaling_run(layers, size, mesh, scan: bool, progress) -> list[dict]:
    import jax

    rows = []
    for n in layers:
        if progress:
            progress(f"scaling: gpt {n} layers{' (scan)' if scan else ''}")
        jax.clear_caches()
        programs = _Programs()
        c = case("gpt", f"{n} layers", mesh, "natural", **{**size, "layers": n, "scan": scan})
        r = run_case(c, programs, xla=False, experts="same")
        row = {"layers": n, "scan": scan, "ops": r.get("ops")}
        row["trace_seconds"] = next(iter(programs.trace_seconds.values()), None)
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update(
                seconds=r["searched"]["seconds"],
                mcts_seconds=r["searched"]["mcts_seconds"],
                full_program_seconds=r["searched"]["full_program_seconds"],
                searching_seconds=r["searched"]["seconds"] - r["searched"]["full_program_seconds"],
                proxy=r["searched"]["proxy"].get("used"),
                episodes=r["searched"]["episodes"],
                step_time_s=r["searched"]["step_time_s"],
                ratio_to_expert=r.get("same_schedule_ratio"),
                expert=(r.get("same_schedule_expert") or {}).get("name"),
            )
        rows.append(row)
    base = next((r for r in rows if r.get("seconds")), None)
    for r in rows:
        r["time_ratio"] = _ratio(r.get("seconds"), base["seconds"]) if base else None
        r["mcts_ratio"] = _ratio(r.get("mcts_seconds"), base["mcts_seconds"]) if base else None
        r["searching_ratio"] = (
            _ratio(r.get("searching_seconds"), base["searching_seconds"]) if base else None
        )
        r["ops_ratio"] = _ratio(r.get("ops"), base["ops"]) if base and base.get("ops") else None
    return rows


TIGHT_MODELS = ("mlp", "gpt", "moe")  # cheap searches: also run at a tight memory limit
TIGHT_SLACK = 1.05  # tight limit = this times the searched plan's peak at the default limit


def _prune_side(r: dict) -> dict:
    if "searched" not in r:
        return {"error": r.get("error")}
    s = r["searched"]
    return {k: s[k] for k in ("step_time_s", "peak_memory_bytes", "seconds", "episodes",
                              "episodes_to_best", "seconds_to_best", "actions_after", "pruned",
                              "fits")}  # fmt: skip


def _prune_row(c: Case, on: dict, off: dict) -> dict:
    from partir.goal import parse_bytes

    row: dict[str, Any] = {"model": c.model, "size": c.size, "mesh": c.mesh_dict,
                           "schedule": c.schedule,
                           "memory_limit_bytes": parse_bytes(c.memory_limit),
                           "cpsat": _prune_side(on), "none": _prune_side(off)}  # fmt: skip
    a, b = row["cpsat"], row["none"]
    if "error" not in a and "error" not in b:
        row["step_time_ratio"] = _ratio(b["step_time_s"], a["step_time_s"])
        row["seconds_ratio"] = _ratio(b["seconds"], a["seconds"])
        row["episodes_to_best_ratio"] = _ratio(b["episodes_to_best"], a["episodes_to_best"])
    # CP-SAT said no plan fits, yet the unpruned search found one that does
    row["false_infeasible"] = bool("error" in a and "Infeasible" in str(a["error"])
                                   and "error" not in b and b["fits"])  # fmt: skip
    return row


def run_pruning(
    cases: Iterable[Case],
    results: dict[Case, dict],
    programs: _Programs,
    progress: Callable[[str], None] | None = None,
    tight: Iterable[str] = TIGHT_MODELS,
) -> list[dict]:
    """The same searches with CP-SAT pruning off, beside the pruned ones in `results`; for
    the models in `tight`, both again at a limit just above the plan found (where pruning
    has something to remove)."""
    rows = []
    tight = set(tight)
    for c in cases:
        on = results.get(c)
        if on is None or "searched" not in on:
            continue
        if progress:
            progress(f"pruning off: {c.label}")
        off = run_case(dataclasses.replace(c, prune=None), programs, xla=False, experts="none")
        rows.append(_prune_row(c, on, off))
        if c.model in tight:
            limit = int(on["searched"]["peak_memory_bytes"] * TIGHT_SLACK)
            ct = dataclasses.replace(c, memory_limit=limit)
            if progress:
                progress(f"pruning on / off at a tight limit ({_bytes(limit)}): {c.label}")
            on_t = run_case(ct, programs, xla=False, experts="none")
            off_t = run_case(dataclasses.replace(ct, prune=None), programs, xla=False,
                             experts="none")  # fmt: skip
            rows.append(_prune_row(ct, on_t, off_t))
    return rows


# ----------------------------------------------------------------------------- fidelity


def _log_distance(r: float | None) -> float:
    return math.inf if r is None or r <= 0 else abs(math.log(r))


def _summary(entries: list[tuple[str, float | None]]) -> dict:
    defined = [r for _, r in entries if r is not None and r > 0]
    out: dict[str, Any] = {"plans": len(entries), "undefined": len(entries) - len(defined)}
    if defined:
        out["mean"] = sum(defined) / len(defined)
        out["geomean"] = math.exp(sum(math.log(r) for r in defined) / len(defined))
        out["within_5pct"] = sum(1 for r in defined if abs(r - 1) <= 0.05)
    if entries:
        name, r = max(entries, key=lambda e: _log_distance(e[1]))
        out["worst"] = {"plan": name, "ratio": r}
    return out


def fidelity(case_results: Iterable[dict]) -> dict:
    """Predicted over XLA, per device, for every plan compiled (each plan once)."""
    rows, seen = [], set()
    for r in case_results:
        for who in ("searched", "expert", "same_schedule_expert"):
            x = r.get("xla", {}).get(who)
            if not x or "error" in x or x.get("cached"):
                continue
            name = who if who == "searched" else r[who]["name"]
            label = f"{r['model']} {r['size']} {_mesh_str(r['mesh'])} {r['schedule']}: {name}"
            if who != "searched":
                label = f"{r['model']} {r['size']} {_mesh_str(r['mesh'])}: {name}"
            if label in seen:
                continue
            seen.add(label)
            rows.append(
                {
                    "plan": label,
                    "collective_ratio": _ratio(
                        x["predicted_collective_bytes"], x["collective_bytes"]
                    ),  # fmt: skip
                    "peak_memory_ratio": _ratio(x["predicted_peak_bytes"], x["peak_bytes"]),
                    "argument_ratio": _ratio(x["predicted_argument_bytes"], x["argument_bytes"]),
                    "predicted_collective_bytes": x["predicted_collective_bytes"],
                    "collective_bytes": x["collective_bytes"],
                    "predicted_peak_bytes": x["predicted_peak_bytes"],
                    "peak_bytes": x["peak_bytes"],
                    "ok": x["ok"],
                }
            )
    return {
        "collectives": _summary([(r["plan"], r["collective_ratio"]) for r in rows]),
        "peak_memory": _summary([(r["plan"], r["peak_memory_ratio"]) for r in rows]),
        "argument_memory": _summary([(r["plan"], r["argument_ratio"]) for r in rows]),
        "verify_ok": sum(1 for r in rows if r["ok"]),
        "rows": rows,
    }


# ----------------------------------------------------------------------------- the suite


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("jax", "jaxlib", "ortools", "partir"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def fake_devices(n: int = DEVICES) -> None:
    """Give JAX `n` CPU devices before its backend starts (a no-op once it has)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    try:
        if jax.config.jax_num_cpu_devices < n:
            jax.config.update("jax_num_cpu_devices", n)
    except Exception:  # the backend already started; bigger meshes are not compiled
        pass


def run(
    cases: Sequence[Case] | None = None,
    *,
    quick: bool = False,
    scaling: Sequence[int] | None = None,
    scaling_size: dict[str, Any] | None = None,
    pruning: Sequence[Case] | None = None,
    xla: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the suite; returns the one JSON-able object that `--json` prints.

    Defaults: the full or quick case list; scaling at 12..96 layers (quick: 12, 24); pruning
    off for the realistic-size natural-schedule cases on 8x8."""
    import jax

    fake_devices(DEVICES)
    t0 = time.perf_counter()
    if cases is None:
        cases = quick_cases() if quick else full_cases()
    if scaling is None:
        scaling = SCALING_LAYERS[:2] if quick else SCALING_LAYERS
    if pruning is None:
        pruning = [c for c in cases if c.schedule == "natural" and c.mesh_dict == MESH_2D]
    devices = len(jax.devices())
    programs, xla_cache, expert_cache = _Programs(), {}, {}
    results: dict[Case, dict] = {}
    for i, c in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {c.label}")
        results[c] = run_case(
            c,
            programs,
            xla=xla and c.devices <= devices,
            xla_cache=xla_cache,
            expert_cache=expert_cache,
        )
    case_list = [results[c] for c in cases]
    prune_rows = run_pruning(pruning, results, programs, progress)
    expert_cache.clear()
    scaling_result = run_scaling(scaling, scaling_size, progress=progress) if scaling else None
    return {
        "format": "partir-bench/1",
        "quick": quick,
        "device": DEVICE,
        "memory_limit": MEMORY_LIMIT,
        "note": "step times and memory are cost-model estimates for the device; compare them as "
        "ratios. Seconds are wall-clock on the machine that ran the bench: indicative only.",
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), **_versions()},
        "xla_devices": devices,
        "wall_seconds": time.perf_counter() - t0,
        "cases": case_list,
        "scaling": scaling_result,
        "fidelity": fidelity(case_list),
        "pruning": prune_rows,
    }


# ----------------------------------------------------------------------------- rendering


def _mesh_str(mesh: dict[str, int]) -> str:
    return "x".join(str(n) for n in mesh.values())


def _bytes(n: float | None) -> str:
    from partir.ir.cost import fmt_bytes

    return "-" if n is None else fmt_bytes(n)


def _secs(s: float | None) -> str:
    from partir.ir.cost import fmt_seconds

    return "-" if s is None else fmt_seconds(s)


def _x(r: float | None, digits: int = 2) -> str:
    return "-" if r is None else f"{r:.{digits}f}"


def _case_row(r: dict) -> list[str]:
    e, s, x = r.get("expert"), r.get("searched"), r.get("xla") or {}
    if "error" in r:
        return [r["model"], r["size"], _mesh_str(r["mesh"]), _case_schedule(r),
                "error: " + r["error"][:60], *["-"] * 12]  # fmt: skip
    mark = lambda c: "" if c is None or c["fits"] else " *"  # noqa: E731
    return [
        r["model"],
        r["size"],
        _mesh_str(r["mesh"]),
        _case_schedule(r),
        e["name"] if e else "-",
        _secs(e["step_time_s"]) if e else "-",
        _secs(s["step_time_s"]),
        _x(r.get("ratio")) + (" r" if s.get("is_replicated") else ""),
        (
            f"{_x(r['same_schedule_ratio'])} {r['same_schedule_expert']['name']}"
            if r.get("same_schedule_expert")
            else "-"
        ),
        (_bytes(e["peak_memory_bytes"]) + mark(e)) if e else "-",
        _bytes(s["peak_memory_bytes"]) + mark(s),
        f"{s['seconds']:.1f}",
        str(s["episodes"]),
        _pair(x, "collective_bytes"),
        _pair(x, "peak_bytes"),
        _x(x.get("same_schedule_collective_ratio")),
        _x(x.get("same_schedule_priced_comm_ratio")),
    ]


def _case_schedule(r: dict) -> str:
    return _schedule_str(r["schedule"], r.get("objective", "time"))


def _pair(x: dict, key: str) -> str:
    """`searched / expert` XLA figures."""
    s, e = x.get("searched") or {}, x.get("expert") or {}
    if key not in s and key not in e:
        return "-"
    return f"{_bytes(s.get(key))} / {_bytes(e.get(key))}"


CASE_COLUMNS = ["model", "size", "mesh", "schedule", "expert", "expert step", "searched step",
                "ratio", "same-schedule ratio", "expert mem", "searched mem", "search s", "episodes", "XLA coll (s / e)",
                "XLA peak (s / e)", "XLA coll s / same", "XLA comm time s / same (est.)"]  # fmt: skip
CASE_CAPTION = (
    "expert = the fastest sharded expert plan within the limit; ratio = searched / expert "
    "estimated step time (< 1: partir is faster; r: the searched plan is the replicated "
    "one); same-schedule ratio = searched / the expert plan made of the schedule's own "
    "strategies, where one exists; mem = estimated peak per device, * over the limit; XLA "
    "coll / XLA peak = per-device collective bytes and peak memory of the searched / expert "
    "plan as XLA:CPU compiles them (meshes <= 8 devices; peak = arguments + outputs + "
    "temporaries - donated aliases from the compiled memory analysis, since XLA:CPU's "
    "peak_memory_in_bytes counts arguments and outputs only); XLA coll s / same = searched "
    "over same-schedule expert compiled collective bytes; XLA comm time s / same (est.) = "
    "the same two plans' compiled collectives priced by the cost model's alpha-beta terms "
    "(an estimate). Schedule `natural, comm`: the goal's objective is `comm` (fewest "
    "collective bytes) instead of step time."
)


def _scaling_rows(s: dict) -> list[list[str]]:
    return [
        [str(r["layers"]), "scan" if r.get("scan") else "list", str(r.get("ops", "-")),
         _x(r.get("trace_seconds")),
         "yes" if r.get("proxy") else "no", _x(r.get("seconds")),
         _x(r.get("full_program_seconds")), _x(r.get("searching_seconds")),
         _x(r.get("mcts_seconds")), str(r.get("episodes", "-")), _x(r.get("time_ratio")),
         _x(r.get("searching_ratio")), _x(r.get("mcts_ratio")),
         _x(r.get("ops_ratio")), _x(r.get("ratio_to_expert"))]
        for r in s["rows"]
    ]  # fmt: skip


SCALING_COLUMNS = ["layers", "as", "ops", "trace s", "proxy", "search s", "of it full program s",
                   "of it searching s", "MCTS s", "episodes", "search time ratio",
                   "searching ratio", "MCTS time ratio", "ops ratio",
                   "step ratio to same-schedule expert"]  # fmt: skip


def _fidelity_summary_rows(f: dict) -> list[list[str]]:
    rows = []
    for what, key in (("collective bytes", "collectives"), ("peak memory", "peak_memory"),
                      ("argument memory", "argument_memory")):  # fmt: skip
        s = f[key]
        worst = s.get("worst") or {}
        rows.append([what, str(s["plans"]), _x(s.get("geomean"), 3), _x(s.get("mean"), 3),
                     str(s.get("within_5pct", "-")), _x(worst.get("ratio"), 3),
                     worst.get("plan", "-")])  # fmt: skip
    return rows


FIDELITY_COLUMNS = ["predicted / XLA", "plans", "geomean", "mean", "within 5%", "worst",
                    "worst plan"]  # fmt: skip


def _pruning_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        on, off = r["cpsat"], r["none"]
        head = [r["model"], r["size"], _mesh_str(r["mesh"]), _bytes(r["memory_limit_bytes"])]
        if "error" in on or "error" in off:
            err = on.get("error") or off.get("error")
            who = "cpsat" if "error" in on else "none"
            note = "FALSE INFEASIBLE: " if r.get("false_infeasible") else ""
            rest = ("-",) * 7
            if "error" not in off:
                rest = ("-", str(off["actions_after"]), f"- / {off['episodes_to_best']}",
                        f"- / {off['seconds_to_best']:.2f}", f"- / {off['seconds']:.2f}", "-",
                        "-")  # fmt: skip
            err = str(err).split(": ", 1)[-1]
            out.append([*head, f"{note}{who}: {err[:48]}", *rest[1:],
                        "-" if "error" in off else ("yes" if off["fits"] else "no")])  # fmt: skip
            continue
        out.append([
            *head,
            f"{on['actions_after']} ({on['pruned']} pruned)", str(off["actions_after"]),
            f"{on['episodes_to_best']} / {off['episodes_to_best']}",
            f"{on['seconds_to_best']:.2f} / {off['seconds_to_best']:.2f}",
            f"{on['seconds']:.2f} / {off['seconds']:.2f}",
            _x(r.get("seconds_ratio")), _x(r.get("step_time_ratio"), 3),
            ("yes" if on["fits"] else "no") + " / " + ("yes" if off["fits"] else "no"),
        ])  # fmt: skip
    return out


PRUNING_COLUMNS = ["model", "size", "mesh", "limit", "actions (cpsat)", "actions (none)",
                   "episodes to best (cpsat / none)", "s to best", "search s",
                   "time off / on", "step off / on", "fits"]  # fmt: skip


def losses(result: dict) -> list[dict]:
    """Cases where the searched plan is slower than the best expert (ratio > 1)."""
    return [r for r in result["cases"] if r.get("ratio") is not None and r["ratio"] > 1 + 1e-9]


def anomalies(result: dict) -> list[str]:
    """Things worth a look: plans over the limit, failures, XLA far from the prediction."""
    out = []
    for r in result["cases"]:
        name = f"{r['model']} {r['size']} {_mesh_str(r['mesh'])} {r['schedule']}"
        if "error" in r:
            out.append(f"{name}: {r['error']}")
            continue
        if not r["searched"]["fits"]:
            out.append(f"{name}: the searched plan is over the memory limit")
        if r.get("expert") and not r["expert"]["fits"]:
            out.append(f"{name}: no expert plan fits the memory limit")
        for who, x in (r.get("xla") or {}).items():
            if isinstance(x, dict) and "error" in x:
                out.append(f"{name}: XLA compile of the {who} plan failed: {x['error'][:120]}")
        if r["schedule"] == "natural":
            batched = _batched_axes(r)
            inputs = GNS_EDGE_INPUTS if r["model"] == "gns" else None
            dim0 = [_first_entry(spec) for pat, spec in r["searched"]["rules"]
                    if pat.startswith("batch/") and (inputs is None or pat in inputs)]  # fmt: skip
            for axis in batched:
                if not any(repr(axis) in entry for entry in dim0):
                    out.append(f"{name}: the schedule batches on {axis!r} but the plan tiles no "
                               f"data input on it")  # fmt: skip
    for row in result.get("pruning") or []:
        if row.get("false_infeasible"):
            out.append(
                f"{row['model']} {row['size']} {_mesh_str(row['mesh'])} at "
                f"{_bytes(row['memory_limit_bytes'])}: CP-SAT declared it infeasible "
                f"({row['cpsat']['error'].split(' (')[0]}), yet the unpruned search found a plan of "
                f"{_bytes(row['none']['peak_memory_bytes'])} within the limit"
            )
    rows = result["fidelity"]["rows"]
    far = [r for r in rows if _log_distance(r["peak_memory_ratio"]) > math.log(2)]
    if far:
        w = max(far, key=lambda r: _log_distance(r["peak_memory_ratio"]))
        out.append(
            f"peak memory: the prediction is more than 2x off XLA's for {len(far)} of "
            f"{len(rows)} plans compiled (worst {w['plan']}: predicted "
            f"{_bytes(w['predicted_peak_bytes'])}, XLA {_bytes(w['peak_bytes'])})"
        )
    for row in rows:
        if _log_distance(row["collective_ratio"]) > math.log(1.5):
            out.append(
                f"{row['plan']}: predicted {_bytes(row['predicted_collective_bytes'])} of "
                f"collectives, XLA {_bytes(row['collective_bytes'])}"
            )
    return out


def _first_entry(spec: str) -> str:
    """The dim-0 entry of a printed spec: "P(('data', 'fsdp'), None)" -> "('data', 'fsdp')"."""
    inner = spec[2:-1]
    if inner.startswith("("):
        return inner[: inner.index(")") + 1]
    return inner.split(",", 1)[0]


def _batched_axes(r: dict) -> list[str]:
    """Axes on which a case's schedule has batch or fsdp."""
    out = []
    for part in r["strategies"].split(" | "):
        axis, names = part.split(": ", 1)
        if any(n in ("batch", "fsdp") for n in names.split("+")):
            out.append(axis)
    return out


def print_tables(result: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stderr, highlight=False, width=200)

    def table(title, columns, rows, caption=None):
        t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
        for i, col in enumerate(columns):
            t.add_column(col, justify="left" if i < 5 else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)

    title = f"partir bench{' --quick' if result['quick'] else ''}: searched plans against " \
            f"expert plans ({result['device']}, limit {result['memory_limit']})"  # fmt: skip
    table(title, CASE_COLUMNS, [_case_row(r) for r in result["cases"]], CASE_CAPTION)
    if result.get("scaling"):
        s = result["scaling"]
        table(f"scaling: gpt d_model={s['size']['d_model']} on {_mesh_str(s['mesh'])} "
              f"({s['strategies']})", SCALING_COLUMNS, _scaling_rows(s))  # fmt: skip
    table("fidelity: cost model / XLA, per device", FIDELITY_COLUMNS,
          _fidelity_summary_rows(result["fidelity"]))  # fmt: skip
    if result.get("pruning"):
        table("CP-SAT pruning on / off", PRUNING_COLUMNS, _pruning_rows(result["pruning"]))
    lost = losses(result)
    console.print(f"{len(lost)} of {sum(1 for r in result['cases'] if 'ratio' in r)} cases "
                  f"slower than the best expert; {result['wall_seconds']:.0f} s in all")  # fmt: skip


def _md_table(columns: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The report: what was run, the tables, the losses and anomalies."""
    m = result["machine"]
    cmd = "partir bench" + (" --quick" if result["quick"] else "")
    parts = [
        "# partir benchmarks",
        "",
        f"Generated by `{cmd}` on {result['generated']} ({m['cpus']} CPUs, jax {m['jax']}, "
        f"ortools {m['ortools']}, Python {m['python']}); {result['wall_seconds']:.0f} s in all. "
        "Regenerate with `partir bench --report docs/benchmarks.md` (see "
        "`benchmarks/README.md`).",
        "",
        f"Step times and memory are the cost model's estimates per device for "
        f"`{result['device']}` with a memory limit of {result['memory_limit']}; read them as "
        "ratios within this run. Search seconds are wall-clock on the machine above and only "
        "indicative. XLA figures come from compiling the plans on "
        f"{result['xla_devices']} fake CPU devices from abstract arguments (meshes of at "
        "most that many devices); XLA:CPU lowers reduce-scatter as all-reduce, so "
        "collectives are compared in its kinds.",
        "",
        "## Searched plans against expert plans",
        "",
        "Natural schedules: data axis batch + zero(stage=3) (gns: batch on the edge inputs); "
        "2-D model axis megatron (moe: expert + megatron); 3-D data x fsdp x tensor: batch, "
        "fsdp, megatron (moe: expert + megatron). `auto`: auto on every axis. The expert is "
        "the fastest plan within the limit among the library's expert plans "
        "(`partir.experts`: BP, Z1-3 or FSDP, MP, BP+MP, BP+MP+Z3, BP+EMB, EP, EDGE, NODE, "
        "EDGE+Z3, with the first mesh axis as data and the second as model) and on 3-D "
        "meshes BP+FSDP, BP+FSDP+MP, BP+FSDP+EP, EDGE+FSDP (data, fsdp, tensor). The "
        "same-schedule expert is the expert plan made of the natural schedule's own "
        "strategies (Z3, BP+MP+Z3, BP+FSDP+MP, EDGE+Z3), where the library has one.",
        "",
        _md_table(CASE_COLUMNS, [_case_row(r) for r in result["cases"]]),
        "",
        CASE_CAPTION,
        "",
    ]
    lost = losses(result)
    parts += ["### Where partir loses", ""]
    if lost:
        for r in lost:
            parts.append(
                f"- {r['model']} {r['size']} {_mesh_str(r['mesh'])} {r['schedule']} "
                f"({r['strategies']}): {r['ratio']:.3f}x {r['expert']['name']}"
            )
    else:
        parts.append("- nowhere: every searched plan is at least as fast as the best expert.")
    rep = [r for r in result["cases"] if r.get("replicated") and "searched" in r
           and r["replicated"]["fits"]
           and r["replicated"]["step_time_s"] < r["searched"]["step_time_s"] * (1 - 1e-9)]  # fmt: skip
    if rep:
        parts += [
            "",
            f"The replicated plan is faster still than the searched one in {len(rep)} cases "
            "(the natural schedules require batch and ZeRO, which cost latency that models "
            "this small cannot amortise): "
            + ", ".join(
                f"{r['model']} {r['size']} {_mesh_str(r['mesh'])} {r['schedule']} "
                f"({r['searched']['step_time_s'] / r['replicated']['step_time_s']:.1f}x)"
                for r in rep
            )
            + ".",
        ]
    parts.append("")
    if result.get("scaling"):
        s = result["scaling"]
        size = ", ".join(f"{k}={v}" for k, v in s["size"].items())
        parts += [
            "## Scaling",
            "",
            f"gpt ({size}) on {_mesh_str(s['mesh'])}, {s['strategies']}; ratios are to the "
            f"{s['rows'][0]['layers']}-layer model. search s = all of `solve` after the "
            "program is traced. Of it, `full program s` is building the full program's "
            "propagator and cost model, replaying the decisions on it and costing the plan "
            "(what still grows with depth); `searching` is the rest: tracing the 1- and "
            "2-layer copies and searching them (MCTS s), which does not grow. With the "
            "layers under `lax.scan` (`as` scan) the program is one layer body whatever the "
            "depth: it is searched whole, with no copies, and nothing grows.",
            "",
            _md_table(SCALING_COLUMNS, _scaling_rows(s)),
            "",
        ]
    f = result["fidelity"]
    parts += [
        "## Fidelity: the cost model against XLA",
        "",
        f"Predicted over compiled, per device, for the {len(f['rows'])} plans compiled "
        f"({f['verify_ok']} pass `partir verify`: collectives within 5 % per kind, argument "
        "bytes exact). Peak memory is an estimate and is not held to a tolerance.",
        "",
        _md_table(FIDELITY_COLUMNS, _fidelity_summary_rows(f)),
        "",
        _md_table(
            ["plan", "collectives predicted", "XLA", "ratio", "peak predicted", "XLA", "ratio"],
            [
                [
                    r["plan"],
                    _bytes(r["predicted_collective_bytes"]),
                    _bytes(r["collective_bytes"]),
                    _x(r["collective_ratio"], 3),
                    _bytes(r["predicted_peak_bytes"]),
                    _bytes(r["peak_bytes"]),
                    _x(r["peak_memory_ratio"], 3),
                ]
                for r in f["rows"]
            ],
        ),  # fmt: skip
        "",
    ]
    if result.get("pruning"):
        parts += [
            "## CP-SAT pruning",
            "",
            "The realistic-size natural-schedule searches on 8x8 again with "
            "`Search(prune=None)`, at the suite's limit and (mlp, gpt, moe) at a tight limit, "
            f"{TIGHT_SLACK:.2f} times the peak of the plan found at the suite's limit, where "
            "pruning has something to remove. Episodes and seconds to best: the last "
            "improvement of each axis's best-reward curve, summed over axes. FALSE INFEASIBLE: "
            "CP-SAT declared the limit infeasible but the unpruned search found a plan within "
            "it.",
            "",
            _md_table(PRUNING_COLUMNS, _pruning_rows(result["pruning"])),
            "",
        ]
    notes = anomalies(result)
    if notes:
        parts += ["## Anomalies", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(parts)


def main(quick: bool = False, as_json: bool = False, report: str | None = None) -> int:
    """`partir bench`: tables on stderr, `--json` one object on stdout, a markdown report."""
    from rich.console import Console

    fake_devices(DEVICES)
    console = Console(stderr=True, highlight=False)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        console.print(f"[dim]{time.perf_counter() - t0:6.1f} s[/dim]  {msg}")

    result = run(quick=quick, progress=progress)
    print_tables(result)
    path = report or DEFAULT_REPORT
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        f.write(markdown(result))
    console.print(f"report written to {path}")
    if as_json:
        print(json.dumps(result, default=_json_default))
    return 0


def _json_default(x: Any) -> Any:
    if isinstance(x, tuple | set):
        return list(x)
    if hasattr(x, "item"):
        return x.item()
    return str(x)
