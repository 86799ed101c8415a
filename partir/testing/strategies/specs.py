"""Specs: random valid input shardings for a goal, a traced program or an `(fn, args)` pair."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from hypothesis import strategies as st
from jax.sharding import PartitionSpec

from partir.goal import Goal
from partir.ir.program import Program, arg_names, path_str


def input_shapes(program_or_goal: Any) -> dict[str, tuple[int, ...]]:
    """{input path: shape} of a `Goal`, a traced `Program`, or an `(fn, args)` pair,
    named as partir names them (`params/l0/w`); a Goal or pair is not traced for this."""
    obj = program_or_goal
    if isinstance(obj, Program):
        return {p: obj.values[v].shape for p, v in obj.inputs.items()}
    if isinstance(obj, Goal):
        if "program" in obj.__dict__:  # already traced
            return input_shapes(obj.program)
        fn, args = obj.fn, obj.args
    else:
        fn, args = obj
    args = tuple(args)
    names = arg_names(fn, len(args))
    out: dict[str, tuple[int, ...]] = {}
    for name, arg in zip(names, args):
        leaves, _ = jax.tree_util.tree_flatten_with_path(arg)
        for keypath, leaf in leaves:
            out[path_str(name, keypath)] = tuple(int(d) for d in jnp.shape(leaf))
    return out


def shardings(
    shape: Sequence[int], mesh: Mapping[str, int]
) -> st.SearchStrategy[tuple[tuple[str, ...], ...]]:
    """A partir sharding of `shape` (per dim, a tuple of mesh axes, major first): each
    axis at most once, the sizes of a dim's axes dividing it. Shrinks to replicated."""
    shape = tuple(shape)

    @st.composite
    def draw_sharding(draw) -> tuple[tuple[str, ...], ...]:
        dims: list[list[str]] = [[] for _ in shape]
        if not shape:
            return ()
        for axis in draw(st.permutations(list(mesh))):
            fits = [
                d
                for d in range(len(shape))
                if shape[d] % (math.prod(mesh[a] for a in dims[d]) * mesh[axis]) == 0
            ]
            dim = draw(st.sampled_from([None, *fits]))
            if dim is not None:
                dims[dim].append(axis)
        return tuple(tuple(d) for d in dims)

    return draw_sharding()


def _as_spec(sharding: Sequence[Sequence[str]], trim: bool) -> PartitionSpec:
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in sharding]
    while trim and entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def specs(
    program_or_goal: Any, mesh: Mapping[str, int] | None = None
) -> st.SearchStrategy[dict[str, PartitionSpec]]:
    """Random valid input shardings `{path: PartitionSpec}` for a `Goal` (on its mesh
    unless `mesh` is given), a traced `Program` or an `(fn, args)` pair: mesh axes at most
    once per value, their sizes dividing the dims. Paths left out are replicated; trailing
    `None`s are sometimes left out too, as people write specs."""
    if mesh is None:
        if not isinstance(program_or_goal, Goal):
            raise TypeError("specs(program, mesh): give the mesh, or pass a Goal")
        mesh = program_or_goal.sizes
    mesh = dict(mesh)
    shapes = input_shapes(program_or_goal)

    @st.composite
    def draw_specs(draw) -> dict[str, PartitionSpec]:
        out = {}
        for path, shape in shapes.items():
            sharding = draw(shardings(shape, mesh))
            if any(sharding) or draw(st.booleans()):
                out[path] = _as_spec(sharding, trim=draw(st.booleans()))
        return out

    return draw_specs()
