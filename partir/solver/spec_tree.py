"""JAX's own sharding forms: args-shaped pytrees of specs in, pytrees of NamedSharding out.

`jax.jit(in_shardings=...)` takes a pytree shaped like the args whose leaves are
`PartitionSpec`, `NamedSharding` or None, and a leaf may stand for a whole subtree (a
prefix pytree). `rules_of_tree` turns such a pytree into partir's {path: spec} rules, one
exact path per input (escaped, so a path holding glob characters matches only itself);
`named_shardings` goes the other way for a plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from partir.ir.program import path_str
from partir.ir.specs import PlanError, to_spec
from partir.solver import subaxes


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec | NamedSharding)


def is_rule_dict(x: Any) -> bool:
    """A {path or glob: spec} dict, partir's own rule form."""
    return isinstance(x, Mapping) and all(isinstance(k, str) for k in x)


def looks_like_tree(specs: Any, args: Sequence[Any]) -> bool:
    """Whether `specs` is meant as an args-shaped pytree (jit's in_shardings form) rather
    than partir's rule dict or a list of rule dicts (a schedule of stages)."""
    if _is_spec(specs):
        return True
    if isinstance(specs, Mapping) or not isinstance(specs, tuple | list):
        return False
    if not all(is_rule_dict(s) for s in specs):
        return True  # not stages: read it as a pytree, whose errors name the place
    if len(specs) != len(args):
        return False
    try:
        match_tree(tuple(specs), tuple(args), [], (), ())
    except PlanError:
        return False
    return True


def _describe(x: Any) -> str:
    if x is None:
        return "None"
    if isinstance(x, Mapping):
        return f"a dict with keys {sorted(map(str, x))}"
    if isinstance(x, tuple | list):
        return f"a {type(x).__name__} of {len(x)}"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def _children(x: Any) -> tuple[list, Any]:
    """One level of a pytree node: [(key, child)], and the node's treedef."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(
        x, is_leaf=lambda y: y is not x or _is_spec(y)
    )
    return [(kp[0], c) for kp, c in pairs], treedef


def match_tree(spec: Any, arg: Any, out: list, keys: tuple, names: Sequence[str]) -> None:
    """Append (key path, spec leaf, number of array leaves it covers) in flatten order;
    `names`: the function's parameter names, for the paths in messages."""
    where = lambda: display_keys(keys, names)  # noqa: E731
    if _is_spec(spec):
        out.append((keys, spec, len(jax.tree_util.tree_leaves(arg))))
        return
    if arg is None or jax.tree_util.all_leaves([arg]):  # an NNX Variable has a shape: a node
        raise PlanError(
            f"{where()}: the shardings have {_describe(spec)} where the args have "
            f"{_describe(arg)}; give one PartitionSpec, NamedSharding or None here"
        )
    s_children, s_def = _children(spec)
    a_children, a_def = _children(arg)
    if s_def != a_def and not _alike(spec, arg, s_children, a_children):
        hint = ""
        if isinstance(spec, Mapping) and isinstance(arg, Mapping):
            missing = [str(k) for k in arg if k not in spec]
            extra = [str(k) for k in spec if k not in arg]
            hint = (f" (missing {missing})" if missing else "") + (
                f" (not in the args: {extra})" if extra else ""
            )
        raise PlanError(
            f"{where()}: the shardings have {_describe(spec)} where the args have "
            f"{_describe(arg)}{hint}; the shardings must be shaped like the args, or a "
            "prefix of them (one spec for a whole subtree)"
        )
    for (k, s), (_, a) in zip(s_children, a_children):
        match_tree(s, a, out, keys + (k,), names)


def _alike(spec: Any, arg: Any, s_children: list, a_children: list) -> bool:
    """Nodes of one type with the same child keys, whose static data may differ (an NNX
    Variable annotated with a sharding beside the same Variable without)."""
    keys = lambda pairs: [k for k, _ in pairs]  # noqa: E731
    return type(spec) is type(arg) and keys(s_children) == keys(a_children)


def display_keys(keys: tuple, names: Sequence[str]) -> str:
    """A key path as partir names inputs: `params/layers/0/w`."""
    if not keys:
        return "the args"
    first = keys[0]
    i = getattr(first, "idx", None)
    head = names[i] if isinstance(i, int) and i < len(names) else path_str("", keys[:1])
    return path_str(head, keys[1:]) or head


def escape_path(path: str) -> str:
    """`path` as a glob that matches only itself."""
    return "/".join("".join(f"[{c}]" if c in "*?[" else c for c in e) for e in path.split("/"))


def rules_of_tree(goal: Any, specs: Any) -> dict[str, PartitionSpec]:
    """{escaped input path: PartitionSpec} from an args-shaped (prefix) pytree of
    `PartitionSpec` / `NamedSharding` / None (None: replicated), as jit's in_shardings."""
    prog = goal.program
    args = tuple(goal.args)
    if isinstance(specs, list) and len(specs) == len(args):
        specs = tuple(specs)
    found: list = []
    match_tree(specs, args, found, (), prog.arg_names)
    paths = list(prog.inputs)
    rules: dict[str, PartitionSpec] = {}
    k = 0
    for keys, leaf, n in found:
        spec = _spec_of(leaf, goal, keys)
        for path in paths[k : k + n]:
            rank = len(prog.values[prog.inputs[path]].shape)
            if len(spec) > rank:
                raise PlanError(
                    f"{path}: {spec} has {len(spec)} entries for a value of rank {rank}"
                )
            rules[escape_path(path)] = spec
        k += n
    if k != len(paths):  # a pytree node JAX flattens differently from the program's trace
        raise PlanError(
            f"the shardings cover {k} arrays of the args but the program has {len(paths)} inputs"
        )
    return rules


def _spec_of(leaf: Any, goal: Any, keys: tuple) -> PartitionSpec:
    if leaf is None:
        return PartitionSpec()
    if isinstance(leaf, NamedSharding):
        theirs = {str(a): int(s) for a, s in leaf.mesh.shape.items()}
        if theirs != goal.mesh:
            where = display_keys(keys, goal.program.arg_names)
            raise PlanError(
                f"{where}: the NamedSharding is on mesh {theirs}, the goal's mesh is "
                f"{goal.mesh}; build it on the goal's mesh, or pass its .spec"
            )
        leaf = leaf.spec
    return PartitionSpec(*[None if e is PartitionSpec.UNCONSTRAINED else e for e in leaf])


def auto_mesh(mesh: Mesh) -> Mesh:
    """`mesh` with Auto axis types: partir's plans leave the compiler to propagate inside
    (under Explicit axes Megatron and ZeRO plans are refused by JAX's type rules)."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def plan_mesh(plan: Any, mesh: Mesh | None = None) -> Mesh:
    """The mesh a plan runs on: `mesh`, the goal's jax Mesh, or one over jax.devices()."""
    from partir.solver.jit import make_mesh

    if mesh is None and plan.goal is not None and plan.goal.jax_mesh is not None:
        mesh = plan.goal.jax_mesh
    if mesh is None:
        mesh = make_mesh(subaxes.parent_sizes(plan.mesh))
    theirs = {str(a): int(s) for a, s in mesh.shape.items()}
    if subaxes.is_split(plan.mesh) and theirs == subaxes.parent_sizes(plan.mesh):
        return subaxes.refine_mesh(mesh, plan.mesh)  # the user's axes, split as the plan's
    if theirs != dict(plan.mesh):
        raise PlanError(f"the mesh {theirs} is not the plan's mesh {dict(plan.mesh)}")
    return auto_mesh(mesh)


def named_shardings(plan: Any, mesh: Mesh | None = None) -> tuple[Any, Any]:
    """(in_shardings, out_shardings): pytrees of NamedSharding like the program's args and
    outputs, ready for `jax.jit(fn, in_shardings=..., out_shardings=...)`."""
    if plan.goal is None:
        raise PlanError("this plan has no goal (it was read from JSON alone); read it with goal=")
    prog = plan.goal.program
    mesh = plan_mesh(plan, mesh)
    ins = [NamedSharding(mesh, to_spec(plan.input_tilings[p])) for p in prog.inputs]
    outs = [NamedSharding(mesh, to_spec(plan.output_tilings[p])) for p in prog.outputs]
    return (
        jax.tree_util.tree_unflatten(prog.in_tree, ins),
        jax.tree_util.tree_unflatten(prog.out_tree, outs),
    )
