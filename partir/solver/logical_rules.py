"""A plan as MaxText's and T5X's `logical_axis_rules`, and as Flax's `nn.Partitioned` boxes.

MaxText names every dim of every parameter with a logical axis (`("embed", "mlp")`) and maps
those names to mesh axes with one rule list. `logical_axis_rules` reads a plan back in that
form: for each logical name, the mesh axes the plan gives the dims so named. A plan that
shards two dims of one name differently cannot be written as such rules; the error names
the places (or, with `strict=False`, the rules follow what most of the name's bytes get).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from partir.ir.specs import PlanError
from partir.solver.spec_tree import display_keys, match_tree

MeshAxes = str | tuple[str, ...] | None  # as a rule's right-hand side: None keeps it whole


def logical_axis_rules(
    plan: Any, logical: Any, *, strict: bool = True
) -> list[tuple[str, MeshAxes]]:
    """`[(logical name, mesh axes)]`, one per name in the order names first appear, such
    that Flax's `nn.logical_to_mesh(logical, rules)` gives back the plan's specs.

    `logical` is shaped like the program's args, or a prefix of them (as jit's
    in_shardings): leaves are PartitionSpecs of logical names (what `nn.get_partition_spec`
    returns for `LogicallyPartitioned` params), or None for inputs without names."""
    uses = _named_dims(plan, logical)
    rules: list[tuple[str, MeshAxes]] = []
    differ: list[str] = []
    for name, found in uses.items():
        weight: dict[MeshAxes, int] = {}
        for _, _, axes, nbytes in found:
            weight[axes] = weight.get(axes, 0) + nbytes
        chosen = max(weight, key=weight.__getitem__)  # ties: the first seen
        rules.append((name, chosen))
        differ += [
            f"{path} dim {dim} is {_show(axes)} where the rule says {_show(chosen)}"
            for path, dim, axes, _ in found
            if axes != chosen
        ]
        if strict and differ:
            shown = "; ".join(differ[:3]) + ("; ..." if len(differ) > 3 else "")
            raise PlanError(
                f"logical axis {name!r} is sharded two ways by the plan ({shown}), so no rule "
                "list gives it back; give those dims names of their own in the model, or pass "
                "strict=False for the rules most of the bytes agree with"
            )
    return rules


def partitioned(plan: Any, tree: Any, argument: int = 0) -> Any:
    """`tree` (the program's argument number `argument`, e.g. the params) with every array
    boxed in Flax's `nn.Partitioned`, named by the plan's mesh axes: what `nn.Partitioned`
    params carry into `nn.get_sharding` and `flax.training` state. Needs flax."""
    from flax import linen as nn

    names = plan.goal.program.arg_names
    prefix = names[argument] if argument < len(names) else str(argument)
    paths = [p for p in plan.goal.program.inputs if p == prefix or p.startswith(prefix + "/")]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if len(leaves) != len(paths):
        raise PlanError(
            f"the tree has {len(leaves)} arrays but argument {prefix!r} of the program has "
            f"{len(paths)}; pass the argument the program was planned with"
        )
    boxed: list[Any] = []
    for x, path in zip(leaves, paths):
        spec = plan.specs[path]
        rank = len(getattr(x, "shape", ()))
        boxed.append(nn.Partitioned(x, names=tuple(spec) + (None,) * (rank - len(spec))))
    return jax.tree_util.tree_unflatten(treedef, boxed)


def _named_dims(plan: Any, logical: Any) -> dict[str, list[tuple[str, int, MeshAxes, int]]]:
    """{logical name: [(input path, dim, the plan's mesh axes there, bytes of the input)]}."""
    goal = plan.goal
    prog = goal.program
    args = tuple(goal.args)
    if isinstance(logical, list) and len(logical) == len(args):
        logical = tuple(logical)
    found: list = []
    match_tree(logical, args, found, (), prog.arg_names)
    paths = list(prog.inputs)
    uses: dict[str, list[tuple[str, int, MeshAxes, int]]] = {}
    k = 0
    for keys, leaf, n in found:
        names = _names(leaf, display_keys(keys, prog.arg_names))
        for path in paths[k : k + n]:
            value = prog.values[prog.inputs[path]]
            if len(names) > len(value.shape):
                raise PlanError(
                    f"{path}: {len(names)} logical names for a value of rank {len(value.shape)}"
                )
            spec = plan.specs[path]
            nbytes = math.prod(value.shape) * value.itemsize
            for dim, name in enumerate(names):
                if name is not None:
                    uses.setdefault(name, []).append((path, dim, _axes(spec, dim), nbytes))
        k += n
    return uses


def _names(leaf: Any, where: str) -> Sequence[str | None]:
    if leaf is None:
        return ()
    if not isinstance(leaf, PartitionSpec):
        raise PlanError(f"{where}: logical names are a PartitionSpec of names, not {leaf!r}")
    out = []
    for e in leaf:
        if e is not None and not isinstance(e, str):
            raise PlanError(
                f"{where}: {leaf} names a dim {e!r}; give each dim one logical name or None"
            )
        out.append(e)
    return out


def _axes(spec: PartitionSpec, dim: int) -> MeshAxes:
    e = spec[dim] if dim < len(spec) else None
    if not e:
        return None
    if isinstance(e, str):
        return e
    return e[0] if len(e) == 1 else tuple(e)


def _show(axes: MeshAxes) -> str:
    return "whole" if axes is None else f"on {axes!r}"
