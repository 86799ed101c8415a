"""An example op for every primitive of the rule table, for the golden texts in
tests/data/rules.txt: operand shapes (None: a literal), result shapes and params, written
out where they are plain, traced from a JAX function where JAX builds them (gather,
scatter, convolution dimension numbers)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from partir.ir.program import trace

S = jax.ShapeDtypeStruct
f32, i32 = jnp.float32, jnp.int32
X = (4, 8)
WINDOW = {"window_dimensions": (1, 2), "window_strides": (1, 2), "padding": ((0, 0), (0, 0))}
BINARY = {
    "add",
    "add_any",
    "and",
    "atan2",
    "complex",
    "div",
    "eq",
    "ge",
    "gt",
    "igamma",
    "igammac",
    "le",
    "lt",
    "max",
    "min",
    "mul",
    "ne",
    "nextafter",
    "or",
    "polygamma",
    "pow",
    "random_fold_in",
    "rem",
    "shift_left",
    "shift_right_arithmetic",
    "shift_right_logical",
    "sub",
    "xor",
    "zeta",
}
TERNARY = {"clamp", "select_n"}

Example = tuple[list, list, dict]

# primitive -> (operand shapes, result shapes, params)
WRITTEN: dict[str, Example] = {
    "argmax": ([X], [(4,)], {"axes": (1,)}),
    "argmin": ([X], [(8,)], {"axes": (0,)}),
    "argsort": ([X], [X], {"dimension": 1}),
    "bitcast_convert_type": ([X], [(4, 8, 2)], {}),
    "broadcast_in_dim": ([(4, 1)], [(4, 3, 8)], {"broadcast_dimensions": (0, 2)}),
    "concatenate": ([X, (4, 2)], [(4, 10)], {"dimension": 1}),
    "cumlogsumexp": ([X], [X], {"axis": 1}),
    "cummax": ([X], [X], {"axis": 0}),
    "cummin": ([X], [X], {"axis": 1}),
    "cumprod": ([X], [X], {"axis": 1}),
    "cumsum": ([X], [X], {"axis": 1}),
    "dot_general": (
        [(2, 4, 16), (2, 16, 8)],
        [(2, 4, 8)],
        {"dimension_numbers": (((2,), (1,)), ((0,), (0,)))},
    ),
    "dynamic_slice": ([X, None, None], [(4, 4)], {}),
    "dynamic_update_slice": ([X, (4, 2), None, None], [X], {}),
    "empty": ([], [(8, 4)], {}),
    "expand_dims": ([X], [(4, 1, 8)], {"dimensions": (1,)}),
    "iota": ([], [(8, 4)], {"dimension": 0}),
    "optimization_barrier": ([X, (8,)], [X, (8,)], {}),
    "pad": ([X, None], [(4, 12)], {"padding_config": ((0, 0, 0), (2, 2, 0))}),
    "polynomial": ([X, (), (), ()], [X], {}),
    "random_bits": ([()], [X], {}),
    "random_split": ([()], [(4,)], {}),
    "random_unwrap": ([(4,)], [(4, 2)], {}),
    "random_wrap": ([(4, 2)], [(4,)], {}),
    "reduce_and": ([X], [(4,)], {"axes": (1,)}),
    "reduce_max": ([X], [(8,)], {"axes": (0,)}),
    "reduce_min": ([X], [(4,)], {"axes": (1,)}),
    "reduce_or": ([X], [(4,)], {"axes": (1,)}),
    "reduce_prod": ([X], [(4,)], {"axes": (1,)}),
    "reduce_sum": ([(2, 4, 8)], [(4,)], {"axes": (0, 2)}),
    "reduce_window": ([X], [(4, 4)], WINDOW),
    "reduce_window_max": ([X], [(4, 4)], WINDOW),
    "reduce_window_min": ([X], [(4, 4)], WINDOW),
    "reduce_window_sum": ([X], [(4, 4)], WINDOW),
    "reshape": ([X], [(4, 2, 4)], {}),
    "rev": ([X], [X], {"dimensions": (1,)}),
    "rng_bit_generator": ([(4,)], [(4,), X], {}),
    "select_and_gather_add": ([X, X], [(4, 4)], WINDOW),
    "select_and_scatter_add": ([(4, 4), X, None], [X], WINDOW),
    "shard_map": (
        [(8, 32), (4, 6)],
        [(8,)],
        {"in_specs": (P("a", "b"), P(None, "a")), "out_specs": (P(("a", "b")),)},
    ),
    "slice": ([X], [(4, 4)], {}),
    "sort": ([X, X], [X, X], {"dimension": 1}),
    "split": ([X], [(4, 2), (4, 6)], {"axis": 1}),
    "squeeze": ([(4, 1, 8)], [X], {"dimensions": (1,)}),
    "threefry2x32": ([X] * 4, [X, X], {}),
    "stack": ([X, X], [(4, 2, 8)], {"axis": 1}),
    "top_k": ([X], [(4, 2), (4, 2)], {}),
    "transpose": ([(4, 8, 2)], [(8, 4, 2)], {"permutation": (1, 0, 2)}),
    "unstack": ([(3, 4, 5)], [(3, 5)] * 4, {"axis": 1}),
}

# primitive -> (JAX function, its args, the primitives its op may be named: JAX renames some)
TRACED: dict[str, tuple[Callable, tuple, tuple[str, ...]]] = {
    "conv_general_dilated": (
        lambda x, k: jax.lax.conv_general_dilated(
            x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        ),
        (S((2, 8, 8, 3), f32), S((3, 3, 3, 4), f32)),
        ("conv_general_dilated",),
    ),
    "gather": (lambda e, i: e[i], (S((16, 8), f32), S((2, 3), i32)), ("gather",)),
    "scatter": (
        lambda z, i, u: z.at[i].set(u),
        (S((16, 8), f32), S((5,), i32), S((5, 8), f32)),
        ("scatter",),
    ),
}
for _name, _method in (
    ("scatter-add", "add"),
    ("scatter_add", "add"),
    ("scatter-max", "max"),
    ("scatter-min", "min"),
    ("scatter-mul", "multiply"),
):
    TRACED[_name] = (
        lambda z, i, u, m=_method: getattr(z.at[i], m)(u),
        (S((16, 8), f32), S((5,), i32), S((5, 8), f32)),
        (_name.replace("_", "-"), _name.replace("-", "_")),
    )


def example(primitive: str) -> Example:
    """(operand shapes, result shapes, params) of an op of `primitive`."""
    if primitive in WRITTEN:
        return WRITTEN[primitive]
    if primitive in TRACED:
        fn, args, names = TRACED[primitive]
        prog = trace(fn, args)
        op = next(op for op in prog.ops if op.primitive in names)
        ins = [None if v is None else prog.values[v].shape for v in op.inputs]
        return ins, [prog.values[v].shape for v in op.outputs], dict(op.params)
    n = 3 if primitive in TERNARY else 2 if primitive in BINARY else 1
    return [X] * n, [X], {}
