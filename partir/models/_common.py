"""Helpers shared by the model zoo: parameter specs, size resolution, example args, MLP blocks.

Parameters are first described as a pytree of `Init` leaves (shape + how to fill it), then
materialized either with `jax.random` (traceable, so `jax.eval_shape(init)` allocates nothing)
or with a NumPy generator (real example args without compiling a PRNG program per shape).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

PyTree = Any
Params = dict[str, Any]
Key = jax.Array | np.random.Generator

SEED = 0


# ----------------------------------------------------------------------------- parameter specs


@dataclasses.dataclass(frozen=True)
class Init:
    """A float32 parameter of `shape`: N(0, std^2) if std > 0, else filled with `fill`."""

    shape: tuple[int, ...]
    std: float = 0.0
    fill: float = 0.0


def normal(shape: tuple[int, ...], std: float) -> Init:
    return Init(tuple(shape), std=std)


def zeros(shape: tuple[int, ...]) -> Init:
    return Init(tuple(shape))


def ones(shape: tuple[int, ...]) -> Init:
    return Init(tuple(shape), fill=1.0)


def _jax_leaf(key: jax.Array, leaf: Init) -> jax.Array:
    if leaf.std > 0:
        return leaf.std * jax.random.normal(key, leaf.shape, jnp.float32)
    return jnp.full(leaf.shape, leaf.fill, jnp.float32)


def _numpy_leaf(rng: np.random.Generator, leaf: Init) -> np.ndarray:
    if leaf.std > 0:
        return (leaf.std * rng.standard_normal(leaf.shape)).astype(np.float32)
    return np.full(leaf.shape, leaf.fill, np.float32)


def materialize(key: Key, spec: PyTree) -> Params:
    """Replace every `Init` leaf of `spec` by an array (jax.Array for a JAX key, else NumPy)."""
    leaves, treedef = jax.tree.flatten(spec)
    arrays: list[np.ndarray] | list[jax.Array]
    if isinstance(key, np.random.Generator):
        arrays = [_numpy_leaf(key, leaf) for leaf in leaves]
    else:
        keys = jax.random.split(key, len(leaves))
        arrays = [_jax_leaf(k, leaf) for k, leaf in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, arrays)


def stack(trees: list[PyTree]) -> PyTree:
    """Stack same-structured pytrees leaf by leaf along a new leading axis."""

    def stack_leaves(*xs: Any) -> Any:
        if all(isinstance(x, np.ndarray) for x in xs):
            return np.stack(xs)
        return jnp.stack(xs)

    return jax.tree.map(stack_leaves, *trees)


def dense(d_in: int, d_out: int) -> Params:
    """Spec of a `{"w": [d_in, d_out], "b": [d_out]}` layer with LeCun-normal weights."""
    return {"w": normal((d_in, d_out), 1.0 / math.sqrt(d_in)), "b": zeros((d_out,))}


def mlp_spec(sizes: list[int]) -> Params:
    """Spec of `{"layers": [dense, ...]}` mapping sizes[0] -> ... -> sizes[-1]."""
    return {"layers": [dense(a, b) for a, b in zip(sizes[:-1], sizes[1:])]}


def layer_norm_spec(d: int) -> Params:
    return {"scale": ones((d,)), "bias": zeros((d,))}


# ----------------------------------------------------------------------------- sizes, args


def resolve_size(
    presets: Mapping[str, Mapping[str, Any]],
    preset: str | None,
    size: Mapping[str, Any],
    optional: Mapping[str, Any] | None = None,
    require_all: bool = True,
) -> dict[str, Any]:
    """Merge optional defaults, a named preset and explicit overrides into one size dict.

    The allowed keys are those of the presets plus `optional`; anything else is a TypeError,
    as is (with `require_all`) a missing required key.
    """
    optional = dict(optional or {})
    required = set().union(*(p.keys() for p in presets.values())) - optional.keys()
    if preset is None:
        base: dict[str, Any] = {}
    elif preset in presets:
        base = dict(presets[preset])
    else:
        raise ValueError(f"unknown preset {preset!r}; known presets: {sorted(presets)}")
    unknown = set(size) - required - optional.keys()
    if unknown:
        raise TypeError(
            f"unknown size kwargs {sorted(unknown)}; allowed: {sorted(required | optional.keys())}"
        )
    cfg = {**optional, **base, **size}
    missing = required - cfg.keys()
    if missing and require_all:
        raise TypeError(f"missing size kwargs {sorted(missing)}")
    return cfg


def build_example_args(
    init: Callable[..., Params],
    optimizer: Callable[..., optax.GradientTransformation],
    batch_shapes: Callable[..., PyTree],
    make_batch: Callable[..., PyTree],
    cfg: Mapping[str, Any],
    abstract: bool,
) -> tuple[Params, PyTree, PyTree]:
    """(params, opt_state, batch): ShapeDtypeStructs when `abstract`, else real arrays.

    Abstract params come from `jax.eval_shape(init)`; real ones from `init` with a NumPy
    generator seeded with SEED (same shapes, deterministic, nothing to compile).
    """
    opt = optimizer(**cfg)
    if abstract:
        params = jax.eval_shape(lambda: init(jax.random.key(SEED), **cfg))
        return params, jax.eval_shape(opt.init, params), batch_shapes(**cfg)
    rng = np.random.default_rng(SEED)
    params = jax.device_put(init(rng, **cfg))
    batch = jax.device_put(make_batch(rng, **cfg))
    return params, opt.init(params), batch


def count_params(
    init: Callable[..., Params],
    presets: Mapping[str, Mapping[str, Any]],
    preset: str | None,
    size: Mapping[str, Any],
    optional: Mapping[str, Any] | None = None,
) -> int:
    """Number of parameters `init` would create for these sizes, computed without allocating."""
    cfg = resolve_size(presets, preset, size, optional, require_all=False)
    shapes = jax.eval_shape(lambda: init(jax.random.key(SEED), **cfg))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))


def sds(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype))


# ----------------------------------------------------------------------------- layers, steps


def mlp_apply(
    p: Params, x: jax.Array, activation: Callable[[jax.Array], jax.Array] = jax.nn.relu
) -> jax.Array:
    """Dense layers with `activation` between them (not after the last)."""
    layers = p["layers"]
    for i, layer in enumerate(layers):
        x = x @ layer["w"] + layer["b"]
        if i < len(layers) - 1:
            x = activation(x)
    return x


def layer_norm(p: Params, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last axis."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def apply_updates(
    optimizer: optax.GradientTransformation, grads: Params, opt_state: PyTree, params: Params
) -> tuple[Params, PyTree]:
    """One optimizer step: (new params, new optimizer state)."""
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
