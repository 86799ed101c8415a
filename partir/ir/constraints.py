"""The user's own sharding constraints inside the program, as partir decisions.

A `jax.lax.with_sharding_constraint` (primitive `sharding_constraint`) or a
`jax.sharding.reshard` (primitive `reshard`) in the user's model is a decision the user
made. partir honours it with the highest priority: the constrained value gets the
constraint's sharding on the goal mesh axes of the same names. Axes the goal mesh lacks,
and axes whose sizes do not divide the dim, are left out, and the program's first such
case is named in one `ConstraintWarning`. `Goal(honour_constraints=False)` (goal file:
`constraints ignore`) ignores them all; plan.jit then runs partir's sharding in their place.

A `jax.shard_map` states shardings too: its operands and results are pinned, the same way
and with the same priority, to the axes its in/out specs name.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

from jax.sharding import PartitionSpec

from partir.ir.program import Op, Program
from partir.ir.propagate import Decision

CONSTRAINT_PRIMITIVES = {"sharding_constraint": "sharding", "reshard": "dst_sharding"}
# Below the manual tile statements' priority (-1): the user's constraints come first.
CONSTRAINT_PRIORITY = -2


class ConstraintWarning(UserWarning):
    """A sharding constraint in the program that partir cannot follow in full."""


def constraint_ops(program: Program) -> list[Op]:
    """The program's sharding_constraint and reshard ops, in program order."""
    return [op for op in program.ops if op.primitive in CONSTRAINT_PRIMITIVES]


def constraint_decisions(program: Program, mesh: Mapping[str, int]) -> list[Decision]:
    """Decisions that give each constrained value its constraint's sharding on `mesh`, and
    each operand and result of a shard_map the sharding its in/out specs name.

    What cannot be followed (an axis the mesh lacks, a size that does not divide, a
    sharding that is no NamedSharding) is dropped and told in one warning."""
    decisions: list[Decision] = []
    problems: list[str] = []
    for op in program.ops:
        if op.primitive in CONSTRAINT_PRIMITIVES:
            sharding = op.params.get(CONSTRAINT_PRIMITIVES[op.primitive])
            spec = getattr(sharding, "spec", None)
            if not isinstance(spec, PartitionSpec):
                problems.append(f"{_name(op)}: {type(sharding).__name__} is not a NamedSharding")
                continue
            decisions += _pin(program, op, op.outputs[0], spec, mesh, problems)
        elif op.primitive == "shard_map":
            pairs = [
                *zip(op.inputs, op.params["in_specs"]),
                *zip(op.outputs, op.params["out_specs"]),
            ]
            for value, spec in pairs:
                if value is not None:
                    decisions += _pin(program, op, value, spec, mesh, problems)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        warnings.warn(
            f"sharding constraint {problems[0]}{more}; partir follows the rest of the "
            "constraint and ignores that part (set honour_constraints=False, or write "
            "`constraints ignore` in the goal file, to ignore every constraint)",
            ConstraintWarning,
            stacklevel=2,
        )
    return decisions


def _pin(
    program: Program,
    op: Op,
    value: int,
    spec: PartitionSpec,
    mesh: Mapping[str, int],
    problems: list[str],
) -> list[Decision]:
    """Decisions that tile `value` as `spec` says, on the axes of `mesh` that can; what
    cannot is added to `problems`."""
    shape = program.values[value].shape
    decisions = []
    for dim, axes in enumerate(_spec_entries(spec, len(shape))):
        kept: list[str] = []
        for axis in axes:
            if axis not in mesh:
                problems.append(
                    f"{_name(op)}: mesh axis {axis!r} is not in the goal mesh {dict(mesh)}"
                )
                continue
            n = math.prod(mesh[a] for a in kept + [axis])
            if shape[dim] % n:
                problems.append(
                    f"{_name(op)}: dim {dim} of size {shape[dim]} is not "
                    f"divisible by {n} (mesh axes {tuple(kept + [axis])})"
                )
                continue
            kept.append(axis)
        decisions += [
            Decision(CONSTRAINT_PRIORITY, value, dim, axis, position=k)
            for k, axis in enumerate(kept)
        ]
    return decisions


def _spec_entries(spec: PartitionSpec, rank: int) -> list[tuple[str, ...]]:
    """Per dim, the mesh axes a PartitionSpec names (UNCONSTRAINED and None: none)."""
    entries: list[tuple[str, ...]] = []
    for e in tuple(spec)[:rank]:
        if e is None or e is PartitionSpec.UNCONSTRAINED:
            entries.append(())
        elif isinstance(e, str):
            entries.append((e,))
        else:
            entries.append(tuple(e))
    return entries + [()] * (rank - len(entries))


def _name(op: Op) -> str:
    return f"'{op.primitive}'{op.location}"
