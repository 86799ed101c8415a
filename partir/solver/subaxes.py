"""Sub-axis shardings: a mesh axis split in two parts, so that a dim the whole axis does not
divide can still be cut by a part of it.

Megatron over a 16-way `tensor` axis meets a GQA Llama-70B's 8 key-value heads: 16 does not
divide 8, and the query heads, reshaped to (8 groups x 8), cannot take 16 ways on either
factor, so attention runs whole on every device of the axis (7x the roofline compute). As
`tensor:0` (its major 8 ways) x `tensor:1` (its minor 2), megatron may cut the key-value
groups on `tensor:0` and the query heads on both parts, 16 ways, as Shardy's sub-axes
(`tensor:(1)8`, `tensor:(8)2`) do, or give `tensor:1` another dim: on the 70B step the
search cuts the attention projections' model dim on `tensor:1` (attention then runs whole
on its 2 ways), a step the cost model (no overlap of collectives and compute) puts 2% below
the 16-way heads' (4.86 s against 4.96 s; compute 1.69x the roofline against 1.33x).

`split_meshes` proposes a split where a weight of a megatron axis has a dim that the axis
does not divide but a part of it does (the largest such part, major). `solve` searches the
goal as given and on each split, and keeps the best plan; the split plan's mesh names the
parts, and its specs and `shardings()` are on that mesh. A dim cut by both parts in order
is cut by the whole axis: `plan.specs` reads `('tensor:0', 'tensor:1')` there. The parts'
mesh is the user's mesh with its devices reshaped (`refine_mesh`), so each part's devices
are those of the user's axis, in its order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from partir.goal import Goal
from partir.ir.groups import matmul_operands, relayouts
from partir.strategies import Megatron, Replicate, Tile

SEPARATOR = ":"  # `tensor:0`, `tensor:1`: no goal-file axis name has one
SPLITTABLE = (Megatron, Replicate, Tile)  # strategies whose meaning holds on each part


def part_names(axis: str) -> tuple[str, str]:
    return f"{axis}{SEPARATOR}0", f"{axis}{SEPARATOR}1"


def parent_axis(name: str) -> str:
    return name.split(SEPARATOR, 1)[0]


def parent_sizes(sizes: Mapping[str, int]) -> dict[str, int]:
    """The user's mesh that `sizes` (with split axes) refines: the parts multiplied back."""
    out: dict[str, int] = {}
    for name, n in sizes.items():
        axis = parent_axis(name)
        out[axis] = out.get(axis, 1) * n
    return out


def is_split(sizes: Mapping[str, int]) -> bool:
    return any(SEPARATOR in a for a in sizes)


def split_meshes(goal: Goal) -> list[dict[str, int]]:
    """The splits worth a search: per megatron axis whose strategies all hold on parts, the
    largest part `k` (1 < k < n) that divides a dim of a weight that the whole axis (n)
    does not divide (a scanned stack's layer dims aside); each split is the goal's mesh
    with that one axis as (k, n / k)."""
    if is_split(goal.sizes):
        return []
    prog = goal.program
    weights = [
        [n for d, n in enumerate(prog.values[v].shape) if d not in _scanned(prog, v)]
        for v in matmul_operands(prog)
    ]
    out = []
    for axis, n in goal.sizes.items():
        on_axis = [s for s in goal.schedule if s.axis == axis]
        if not any(isinstance(s, Megatron) for s in on_axis):
            continue
        if not all(isinstance(s, SPLITTABLE) for s in on_axis):
            continue
        parts = {math.gcd(n, d) for shape in weights for d in shape if d % n}
        parts = {k for k in parts if 1 < k < n}
        if parts:
            major = max(parts)
            mesh: dict[str, int] = {}
            for a, size in goal.sizes.items():
                if a == axis:
                    first, second = part_names(axis)
                    mesh[first], mesh[second] = major, n // major
                else:
                    mesh[a] = size
            out.append(mesh)
    return out


def _scanned(prog: Any, vid: int) -> set[int]:
    """The dims of input `vid` that a loop scans over: those its layout copies drop
    (`relayouts`; MaxText transposes its stacks and scans their dim 1)."""
    return {d for _, dims in relayouts(prog, vid) for d, e in enumerate(dims) if e is None}


def split_goal(goal: Goal, mesh: Mapping[str, int]) -> Goal:
    """`goal` on `mesh` (a split of its mesh): each strategy of a split axis on both parts,
    major first; a jax Mesh of the goal's is refined the same way."""
    schedule: list[Any] = []
    for s in goal.schedule:
        names = [a for a in mesh if SEPARATOR in a and parent_axis(a) == s.axis]
        schedule += [dataclasses.replace(s, axis=a) for a in names] or [s]
    new_mesh: Any = dict(mesh)
    if goal.jax_mesh is not None:
        new_mesh = refine_mesh(goal.jax_mesh, mesh)
    _ = goal.program  # traced once, shared
    return goal.replace(mesh=new_mesh, schedule=schedule)


def refine_mesh(mesh: Any, sizes: Mapping[str, int]) -> Any:
    """The jax Mesh `sizes` names: `mesh` (the user's axes) with its devices reshaped."""
    from jax.sharding import AxisType, Mesh

    devices = mesh.devices.reshape(tuple(sizes.values()))
    return Mesh(devices, tuple(sizes), axis_types=(AxisType.Auto,) * len(sizes))


def solve_splits(goal: Goal, plan: Any, solve_one) -> Any:
    """The best of `plan` (the goal as given) and `solve_one` on each split of its mesh;
    every one tried is a row of `plan.search["splits"]`."""
    from partir.ir.specs import PlanError
    from partir.solver.prune import InfeasibleMemory
    from partir.solver.reward import better

    meshes = split_meshes(goal)
    if not meshes:
        return plan
    rows: list[dict[str, Any]] = [_row(goal.sizes, plan)]
    best = plan
    for mesh in meshes:
        try:
            candidate = solve_one(split_goal(goal, mesh))
        except (PlanError, InfeasibleMemory) as e:
            rows.append({"mesh": dict(mesh), "error": str(e).splitlines()[0]})
            continue
        rows.append(_row(mesh, candidate))
        if better(goal, candidate.cost, best.cost):
            best = candidate
    for row in rows:
        row["chosen"] = row["mesh"] == dict(best.mesh)
    best.search["splits"] = rows
    return best


def _row(mesh: Mapping[str, int], plan: Any) -> dict[str, Any]:
    c = plan.cost
    return {
        "mesh": dict(mesh),
        "step_time_s": c.step_time_s,
        "peak_memory_bytes": c.peak_memory_bytes,
        "fits": c.fits,
        "seconds": plan.search.get("seconds"),
    }


def split_rows(plan: Any) -> list[tuple[str, str, str, str]]:
    """(mesh, step, peak, note) per mesh searched, whole and split, for a table."""
    from partir.solver.mesh_search import shape_row

    return [shape_row(r, []) for r in plan.search.get("splits", [])]
