"""Search deep models on shallow copies of themselves.

A program of L repeated layers (a Python list of L structurally identical subtrees in its
arguments, e.g. `params["layers"]` and the optimizer moments that mirror it) is traced
again with the stacks cut to 1 and 2 layers. When the three programs are affine in the
layer count (ops, inputs and carried state of the full program = P1 + (L-1)·(P2 - P1)),
the search runs on the two small ones and scores a plan by extrapolating their costs to
L layers; the plan it picks is then replayed and costed on the full program. The search
does the same work at 12 layers or 96; only tracing, propagating and costing the final
plan grow with depth.

A program that is not affine (it hard-codes its depth, or a strategy names one layer) is
searched whole, and the reason is recorded in `plan.search["proxy"]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.specs import glob_match
from partir.strategies import Replicate, Tile

MIN_LAYERS = 4  # fewer layers than this are searched whole


@dataclasses.dataclass
class ShallowCopies:
    """The full goal's layer count and its 1- and 2-layer copies."""

    layers: int
    shallow: tuple[Goal, Goal]


def _signature(x: Any) -> Any:
    leaves, tree = jax.tree_util.tree_flatten(x)
    return tree, tuple((getattr(v, "shape", None), getattr(v, "dtype", type(v))) for v in leaves)


def _is_stack(x: Any) -> bool:
    if not isinstance(x, list) or len(x) < MIN_LAYERS:
        return False
    first = _signature(x[0])
    return bool(jax.tree_util.tree_leaves(x[0])) and all(_signature(v) == first for v in x[1:])


def stack_lengths(args: Any) -> set[int]:
    """The lengths of every layer stack (list of identical subtrees) in `args`."""
    found: set[int] = set()
    for leaf in jax.tree_util.tree_leaves(args, is_leaf=_is_stack):
        if _is_stack(leaf):
            found.add(len(leaf))
    return found


def truncate(args: Any, k: int) -> Any:
    """`args` with every layer stack cut to its first `k` layers."""
    return jax.tree_util.tree_map(lambda x: x[:k] if _is_stack(x) else x, args, is_leaf=_is_stack)


def _copy(goal: Goal, args: Any) -> Goal:
    return goal.replace(args=args)


def _counts(goal: Goal) -> list[int]:
    prog = goal.program
    counts = [len(prog.ops), len(prog.inputs), len(prog.carried)]
    for s in goal.schedule:
        if isinstance(s, Tile | Replicate):
            counts.append(sum(glob_match(s.path, p) for p in prog.inputs))
    return counts


def make_shallow_copies(goal: Goal) -> tuple[ShallowCopies | None, str]:
    """The shallow copies of `goal`, or None and why they cannot stand in for it."""
    lengths = stack_lengths(goal.args)
    if not lengths:
        return None, "no layer stack (a list of 4 or more identical subtrees) in the arguments"
    if len(lengths) > 1:
        return None, f"layer stacks of different lengths {sorted(lengths)}"
    (layers,) = lengths
    try:
        shallow = (_copy(goal, truncate(goal.args, 1)), _copy(goal, truncate(goal.args, 2)))
        c1, c2 = (_counts(g) for g in shallow)
    except Exception as e:  # the program may not accept fewer layers
        return None, f"the program does not trace with fewer layers ({type(e).__name__}: {e})"
    full = _counts(goal)
    if any(f != a + (layers - 1) * (b - a) for f, a, b in zip(full, c1, c2)):
        return None, "the program is not affine in its layer count (it may hard-code depth)"
    return ShallowCopies(layers, shallow), ""


def extrapolate(costs: list[Cost], layers: int) -> Cost:
    """The cost at `layers` layers from the costs at 1 and 2 (or a single cost as is)."""
    if len(costs) == 1:
        return costs[0]
    a, b = costs
    k = layers - 1

    def lin(x, y):
        return max(x + k * (y - x), 0)

    kinds = set(a.comm_s_by_kind) | set(b.comm_s_by_kind)
    return Cost(
        step_time_s=lin(a.step_time_s, b.step_time_s),
        compute_s=lin(a.compute_s, b.compute_s),
        comm_s=lin(a.comm_s, b.comm_s),
        argument_bytes=int(lin(a.argument_bytes, b.argument_bytes)),
        peak_memory_bytes=int(lin(a.peak_memory_bytes, b.peak_memory_bytes)),
        comm_bytes=int(lin(a.comm_bytes, b.comm_bytes)),
        flops=lin(a.flops, b.flops),
        collectives=[],
        comm_s_by_kind={
            kind: lin(a.comm_s_by_kind.get(kind, 0.0), b.comm_s_by_kind.get(kind, 0.0))
            for kind in kinds
        },
        memory_limit=b.memory_limit,
    )
