"""A plan as Flax NNX sharding annotations: each `nnx.Variable`'s `out_sharding` metadata.

NNX reads a Variable's sharding from its metadata (`nnx.with_partitioning(init, names)` puts
it there); `nnx.get_partition_spec(state)` and `nnx.get_named_sharding(state, mesh)` turn it
into jit's shardings. `nnx_sharding` writes the plan's mesh axes into that metadata, so an
NNX user's own code (`nnx.update`, `jax.jit(..., in_shardings=nnx.get_named_sharding(...))`)
carries the plan. The program may have taken the argument as an `nnx.State` (its inputs end
in the Variable's `value`) or as `nnx.to_pure_dict` of it (they end in the Variable's key).
"""

from __future__ import annotations

from typing import Any

import jax

from partir.ir.program import path_str
from partir.ir.specs import PlanError

SHARDING_KEY = "out_sharding"  # the metadata key nnx.get_partition_spec reads (flax 0.12)


def nnx_sharding(plan: Any, state: Any, argument: int = 0) -> Any:
    """`state` (an `nnx.State`, or a Module whose `nnx.state` is taken) with every Variable
    copied and its `out_sharding` set to the plan's mesh axes for the program's argument
    number `argument`, one name or None per dim. Needs flax."""
    from flax import nnx

    if plan.goal is None:
        raise PlanError("this plan has no goal (it was read from JSON alone); read it with goal=")
    if isinstance(state, nnx.Module):
        state = nnx.state(state)
    names = plan.goal.program.arg_names
    prefix = names[argument] if argument < len(names) else str(argument)
    inputs = plan.goal.program.inputs
    is_var = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    pairs, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_var)
    if not any(is_var(v) for _, v in pairs):
        raise PlanError(
            f"argument {prefix!r}: the tree holds no nnx.Variable; pass nnx.state(model) or the "
            "State from nnx.split (for plain arrays use plan.shardings() or plan.partitioned)"
        )
    out = []
    for keys, var in pairs:
        if not is_var(var) or not jax.tree_util.tree_leaves(var):
            out.append(var)  # no array: nothing to shard
            continue
        path = _input_path(var, path_str(prefix, keys), inputs)
        value = var.get_value()
        rank = len(getattr(value, "shape", ()))
        spec = tuple(plan.specs[path])
        annotated = var.copy()
        annotated.set_metadata(SHARDING_KEY, spec + (None,) * (rank - len(spec)))
        out.append(annotated)
    return jax.tree_util.tree_unflatten(treedef, out)


def _input_path(var: Any, path: str, inputs: Any) -> str:
    """The program input that holds `var`, found at `path` (the Variable's key path): the
    value's leaf under it (a traced State) or the path itself (a traced pure dict)."""
    leaves = jax.tree_util.tree_flatten_with_path(var)[0]
    if len(leaves) == 1:
        traced = path_str(path, leaves[0][0])
        if traced in inputs:
            return traced
    if path in inputs:
        return path
    raise PlanError(
        f"{path}: no input of the program is this Variable; pass the argument the program "
        "was planned with (the same model and argument number)"
    )
