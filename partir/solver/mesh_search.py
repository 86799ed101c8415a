"""Choosing the mesh shape: the factorizations of the device count over the open axes.

A goal whose mesh has axes of no size (`mesh={"data": None, "fsdp": None, "tensor": None},
devices=64`, or `mesh data=?, fsdp=?, tensor=? over 64` in a goal file) is solved once per
way of writing the devices left by the fixed axes as a product over the open axes, in
order. A shape the schedule cannot use (a batch axis that divides no batch, a memory limit
no plan meets) is recorded with its reason; the best plan over the shapes that work is
returned with `plan.mesh` set and every shape tried in `plan.search["meshes"]`.

The program is traced once and shared; each shape gets its own propagator, cost model and
search, with the goal's `Search` options. Expert plans are costed for the chosen shape only. Every shape is searched briefly
first (a deep model on its 2-layer copy, the costs of the 1- and 2-layer copies
extrapolated to its depth), and the best few again with the goal's whole `Search` on the
whole program (see `solve_mesh`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from partir.goal import Goal, shared_traces
from partir.ir.messages import fmt_bytes
from partir.ir.specs import PlanError
from partir.solver import subaxes
from partir.solver.plan import make_plan


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
        out.append({a: chosen[a] if s is None else s for a, s in goal.mesh.items()})
    return out


def with_mesh(goal: Goal, mesh: dict[str, int], search: Any = None) -> Goal:
    """`goal` on a concrete mesh, sharing its traced program (the trace does not depend
    on the mesh)."""
    _ = goal.program
    return goal.replace(mesh=mesh, devices=None, search=search or goal.search)


SCREEN_EPISODES = 16  # the first round's search per shape (at 4, 64-chip gpt's 4x4x4 screened
# at 2x its searched cost and was left out of the finalists)
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

    Two rounds: every shape is searched briefly (`SCREEN_EPISODES`; see `_screen_one`),
    then the best few
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
    row.update(
        step_time_s=c.step_time_s,
        peak_memory_bytes=c.peak_memory_bytes,
        fits=c.fits,
        episodes=plan.search["episodes"],
        seconds=time.perf_counter() - t,
    )
    return row, plan


def _screen_one(goal: Goal, mesh: dict[str, int], search: Any, progress) -> tuple[dict, Any]:
    """(the shape's row, its estimated cost or None): on a deep model, the plan searched
    on its 2-layer copy, applied to the 1-layer copy, the two costs extrapolated to the
    full depth (as the search's own proxy does); else a brief search of the whole."""
    from partir.ir.specs import to_spec
    from partir.solver.prune import InfeasibleMemory
    from partir.solver.search import solve
    from partir.solver.shallow_copies import extrapolate, make_shallow_copies
    from partir.solver.spec_tree import escape_path

    proxy, _ = make_shallow_copies(with_mesh(goal, mesh, search)) if search.proxy else (None, "")
    if proxy is None:
        row, plan = _solve_one(goal, mesh, search, progress)
        return row, plan.cost if plan is not None else None
    t = time.perf_counter()
    row = {"mesh": mesh}
    one, two = proxy.shallow
    try:
        p2 = solve(two, progress=progress, baselines=False)
        if subaxes.is_split(p2.mesh):  # the 2-layer copy's plan splits an axis: so must one
            one = subaxes.split_goal(one, p2.mesh)
        specs = {escape_path(p): to_spec(s) for p, s in p2.input_tilings.items()}
        p1 = make_plan(one, specs, strict=False)
    except (PlanError, InfeasibleMemory) as e:
        row.update(error=str(e).splitlines()[0], seconds=time.perf_counter() - t)
        return row, None
    c = extrapolate([p1.cost, p2.cost], proxy.layers)
    row.update(
        step_time_s=c.step_time_s,
        peak_memory_bytes=c.peak_memory_bytes,
        fits=c.fits,
        episodes=p2.search["episodes"],
        seconds=time.perf_counter() - t,
        estimate=f"extrapolated to {proxy.layers} layers from 1- and 2-layer copies",
    )
    return row, c


def _solve_meshes(goal, t0, progress, baselines, on_mesh) -> Any:
    from partir.solver.baselines import expert_plans
    from partir.solver.reward import better, metric

    full = goal.search
    screen = full.episodes is None or full.episodes > SCREEN_EPISODES
    first = dataclasses.replace(full, episodes=SCREEN_EPISODES) if screen else full
    rows: list[dict[str, Any]] = []
    found: dict[tuple, Any] = {}
    costs: dict[tuple, tuple[dict[str, int], Any]] = {}  # (mesh, estimated cost)
    for mesh in candidate_meshes(goal):
        if screen:
            row, cost = _screen_one(goal, mesh, first, progress)
            row["round"] = "screened"
            if cost is not None:
                costs[tuple(mesh.values())] = (mesh, cost)
        else:
            row, plan = _solve_one(goal, mesh, first, progress)
            row["round"] = "searched"
            if plan is not None:
                found[tuple(mesh.values())] = plan
        rows.append(row)
        if on_mesh is not None:
            on_mesh(row)
    if not found and not costs:
        reasons = "; ".join(f"{mesh_str(r['mesh'])}: {r['error']}" for r in rows[:3])
        more = f" (and {len(rows) - 3} more)" if len(rows) > 3 else ""
        raise PlanError(f"no mesh shape of {goal.num_devices} devices works: {reasons}{more}")
    if screen:

        def by_cost(a: tuple[dict[str, int], Any], b: tuple[dict[str, int], Any]) -> int:
            return -1 if better(goal, a[1], b[1]) else (1 if better(goal, b[1], a[1]) else 0)

        ranked = sorted(costs.values(), key=functools.cmp_to_key(by_cost))
        top = ranked[0][1]
        finalists = [
            m
            for m, c in ranked[:FINALISTS]
            if c.fits == top.fits and metric(goal, c) <= FINALIST_RATIO * metric(goal, top)
        ]
        for mesh in finalists:
            row, plan = _solve_one(goal, dict(mesh), full, progress)
            row["round"] = "searched"
            rows.append(row)
            if plan is not None:
                found[tuple(mesh.values())] = plan
            if on_mesh is not None:
                on_mesh(row)
    best = None
    for plan in found.values():
        if best is None or better(plan.goal, plan.cost, best.cost):
            best = plan
    if best is None:  # the screening kept shapes whose full search then failed
        reasons = "; ".join(
            f"{mesh_str(r['mesh'])}: {r['error']}" for r in rows if r["round"] == "searched"
        )
        raise PlanError(f"no mesh shape of {goal.num_devices} devices works: {reasons}")
    shape = subaxes.parent_sizes(best.mesh)  # the shape chosen (its axes maybe split)
    for r in rows:
        r["chosen"] = r["mesh"] == shape and r["round"] == "searched"
    if baselines:
        g = with_mesh(goal, shape)
        best.baselines = {"replicated": g.cost_model.cost(g.propagator.empty())}
        best.baselines.update({name: p.cost for name, p in expert_plans(g).items()})
    best.search["meshes"] = rows
    best.search["seconds"] = time.perf_counter() - t0
    return best


def mesh_str(mesh: dict[str, int]) -> str:
    return " x ".join(f"{a}={s}" for a, s in mesh.items())


def shape_row(r: dict[str, Any], notes: list[str]) -> tuple[str, str, str, str]:
    """(mesh, step, peak, note) of one mesh tried (its `error`, if it failed), for a table;
    `notes` are the row's own, before "over the memory limit" and "chosen"."""
    from partir.ir.messages import fmt_seconds

    if "error" in r:
        return mesh_str(r["mesh"]), "-", "-", r["error"]
    notes = [*notes, *([] if r["fits"] else ["over the memory limit"])]
    notes += ["chosen"] if r.get("chosen") else []
    step, peak = fmt_seconds(r["step_time_s"]), fmt_bytes(r["peak_memory_bytes"])
    return mesh_str(r["mesh"]), step, peak, ", ".join(notes)


def mesh_rows(plan: Any) -> list[tuple[str, str, str, str]]:
    """(mesh, step, peak, note) per shape tried and round, for a table."""
    out = []
    for r in plan.search.get("meshes", []):
        notes = [] if "error" in r else [f"{r['round']} ({r['episodes']} episodes)"]
        if "estimate" in r:
            notes.append("on 1- and 2-layer copies, extrapolated")
        out.append(shape_row(r, notes))
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
