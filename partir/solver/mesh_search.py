"""Choosing the mesh shape: the factorizations of the device count over the open axes.

A goal whose mesh has axes of no size (`mesh={"data": None, "fsdp": None, "tensor": None},
devices=64`, or `mesh data=?, fsdp=?, tensor=? over 64` in a goal file) is solved once per
way of writing the devices left by the fixed axes as a product over the open axes, in
order. A shape the schedule cannot use (a batch axis that divides no batch, a memory limit
no plan meets) is recorded with its reason; the best plan over the shapes that work is
returned with `plan.mesh` set and every shape tried in `plan.search["meshes"]`.

The program is traced once and shared; each shape gets its own propagator, cost model and
search, with the goal's `Search` options. Expert plans are costed for the chosen shape only. Every shape is searched briefly
first, and the best few again with the goal's whole `Search` (see `solve_mesh`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from partir.goal import Goal, shared_traces
from partir.ir.cost import fmt_bytes
from partir.ir.specs import PlanError


def factorizations(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every ordered k-tuple of positive integers whose product is n."""
    if k == 0:
        if n == 1:
            yield ()
        return
    if k == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in factorizations(n // d, k - 1):
                yield (d, *rest)


def candidate_meshes(goal: Goal) -> list[dict[str, int]]:
    """The concrete meshes a goal with open axes stands for, in factorization order."""
    fixed = 1
    for s in goal.mesh.values():
        fixed *= s or 1
    open_ = goal.open_axes
    out = []
    for sizes in factorizations(goal.num_devices // fixed, len(open_)):
        chosen = dict(zip(open_, sizes))
        out.append({a: chosen.get(a, s) for a, s in goal.mesh.items()})
    return out


def with_mesh(goal: Goal, mesh: dict[str, int], search: Any = None) -> Goal:
    """`goal` on a concrete mesh, sharing its traced program."""
    g = Goal(
        goal.fn,
        goal.args,
        mesh,
        device=goal.device,
        memory_limit=goal.memory_limit,
        objective=goal.objective,
        schedule=goal.schedule,
        search=search or goal.search,
        data_inputs=goal.data_inputs,
        donate=goal.donate,
        honour_constraints=goal.honour_constraints,
        filename=goal.filename,
        notes=goal.notes,
    )
    g.__dict__["program"] = goal.program  # the trace does not depend on the mesh
    return g


SCREEN_EPISODES = 4  # the first round's search per shape
FINALISTS = 3  # shapes searched in full: the best screened, within FINALIST_RATIO of it
FINALIST_RATIO = 1.1


def solve_mesh(
    goal: Goal,
    *,
    progress: Callable[[str, int, float, float], None] | None = None,
    baselines: bool = True,
    on_mesh: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """The best plan over every mesh shape of `goal` (see the module docstring).

    Two rounds: every shape is searched briefly (`SCREEN_EPISODES`), then the best few
    (at most `FINALISTS`, within `FINALIST_RATIO` of the best screened cost) with the
    goal's own `Search`; the plan returned is the best of those. With the goal's
    `Search(episodes=...)` at most the screening budget, every shape gets the full search.
    `on_mesh` is told each shape's row as it is solved."""
    t0 = time.perf_counter()
    with shared_traces():  # one trace of the program and of its shallow copies
        goal.program  # noqa: B018
        return _solve_meshes(goal, t0, progress, baselines, on_mesh)


def _solve_one(goal: Goal, mesh: dict[str, int], search: Any, progress) -> tuple[dict, Any]:
    """(the shape's row, its plan or None)."""
    from partir.solver.prune import InfeasibleMemory
    from partir.solver.search import solve

    t = time.perf_counter()
    row: dict[str, Any] = {"mesh": mesh}
    try:
        plan = solve(with_mesh(goal, mesh, search), progress=progress, baselines=False)
    except (PlanError, InfeasibleMemory) as e:
        row.update(error=str(e).splitlines()[0], seconds=time.perf_counter() - t)
        if isinstance(e, InfeasibleMemory):
            row["smallest_memory_bytes"] = e.smallest_bytes
        return row, None
    c = plan.cost
    row.update(step_time_s=c.step_time_s, peak_memory_bytes=c.peak_memory_bytes, fits=c.fits,
               episodes=plan.search["episodes"], seconds=time.perf_counter() - t)  # fmt: skip
    return row, plan


def _solve_meshes(goal, t0, progress, baselines, on_mesh) -> Any:
    from partir.solver.search import _better, metric
    from partir.strategies.experts import expert_plans

    full = goal.search
    screen = full.episodes is None or full.episodes > SCREEN_EPISODES
    first = dataclasses.replace(full, episodes=SCREEN_EPISODES) if screen else full
    rows: list[dict[str, Any]] = []
    found: dict[tuple, Any] = {}
    for mesh in candidate_meshes(goal):
        row, plan = _solve_one(goal, mesh, first, progress)
        row["round"] = "screened" if screen else "searched"
        rows.append(row)
        if plan is not None:
            found[tuple(mesh.values())] = plan
        if on_mesh is not None:
            on_mesh(row)
    if not found:
        reasons = "; ".join(f"{_mesh_str(r['mesh'])}: {r['error']}" for r in rows[:3])
        more = f" (and {len(rows) - 3} more)" if len(rows) > 3 else ""
        raise PlanError(f"no mesh shape of {goal.num_devices} devices works: {reasons}{more}")
    if screen:
        ranked = sorted(found.values(), key=functools.cmp_to_key(
            lambda a, b: -1 if _better(a.goal, a.cost, b.cost) else
            (1 if _better(a.goal, b.cost, a.cost) else 0)))  # fmt: skip
        top = metric(goal, ranked[0].cost)
        finalists = [p for p in ranked[:FINALISTS]
                     if p.cost.fits == ranked[0].cost.fits
                     and metric(goal, p.cost) <= FINALIST_RATIO * top]  # fmt: skip
        found = {}
        for p in finalists:
            row, plan = _solve_one(goal, dict(p.mesh), full, progress)
            row["round"] = "searched"
            rows.append(row)
            if plan is not None:
                found[tuple(p.mesh.values())] = plan
            if on_mesh is not None:
                on_mesh(row)
    best = None
    for plan in found.values():
        if best is None or _better(plan.goal, plan.cost, best.cost):
            best = plan
    for r in rows:
        r["chosen"] = r["mesh"] == best.mesh and r["round"] == "searched"
    if baselines:
        g = best.goal
        best.baselines = {"replicated": g.cost_model.cost(g.propagator.empty())}
        best.baselines.update({name: p.cost for name, p in expert_plans(g).items()})
    best.search["meshes"] = rows
    best.search["seconds"] = time.perf_counter() - t0
    return best


def _mesh_str(mesh: dict[str, int]) -> str:
    return " x ".join(f"{a}={s}" for a, s in mesh.items())


def mesh_rows(plan: Any) -> list[tuple[str, str, str, str]]:
    """(mesh, step, peak, note) per shape tried and round, for a table."""
    from partir.ir.cost import fmt_seconds

    out = []
    for r in plan.search.get("meshes", []):
        if "error" in r:
            out.append((_mesh_str(r["mesh"]), "-", "-", r["error"]))
            continue
        notes = [f"{r['round']} ({r['episodes']} episodes)"]
        if not r["fits"]:
            notes.append("over the memory limit")
        if r.get("chosen"):
            notes.append("chosen")
        out.append((_mesh_str(r["mesh"]), fmt_seconds(r["step_time_s"]),
                    fmt_bytes(r["peak_memory_bytes"]), ", ".join(notes)))  # fmt: skip
    return out


def solve_goal(
    goal: Goal,
    *,
    progress: Callable[[str, int, float, float], None] | None = None,
    baselines: bool = True,
) -> Any:
    """`partir.solve`: the goal's search, over every mesh shape when some axis has no size."""
    from partir.solver.search import solve

    if goal.open_axes:
        return solve_mesh(goal, progress=progress, baselines=baselines)
    return solve(goal, progress=progress, baselines=baselines)
