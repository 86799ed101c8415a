"""Invariant checks for plans: validity, and numerics against the unsharded program."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from partir.ir.specs import check_sharding

RELATIVE_TOLERANCE = 1e-5


class InvalidPlan(AssertionError):
    """A plan that breaks an invariant; the message names the value and the rule."""


class NumericsMismatch(AssertionError):
    """Sharded and unsharded runs of a plan disagree beyond the tolerance."""


def check_plan(goal, plan) -> None:
    """Raise InvalidPlan unless the plan shards every input and output validly: each path
    of the args pytree present, axes in the mesh and once per value, sizes dividing, and
    carried state leaving with the sharding it came in with."""
    prog = goal.program
    if set(plan.input_tilings) != set(prog.inputs):
        missing = sorted(set(prog.inputs) - set(plan.input_tilings))
        extra = sorted(set(plan.input_tilings) - set(prog.inputs))
        raise InvalidPlan(
            f"plan paths do not match the args: missing {missing[:3]}, unknown {extra[:3]}"
        )
    for paths, shardings in (
        (prog.inputs, plan.input_tilings),
        (prog.outputs, plan.output_tilings),
    ):
        for path, vid in paths.items():
            try:
                check_sharding(path, prog.values[vid].shape, shardings[path], goal.mesh)
            except ValueError as err:
                raise InvalidPlan(str(err)) from None
    for out, src in prog.carried.items():
        if plan.output_tilings[out] != plan.input_tilings[src]:
            raise InvalidPlan(
                f"{out} leaves with {plan.output_tilings[out]} but {src} comes in "
                f"with {plan.input_tilings[src]}"
            )
    if plan.state is not None:
        prop = goal.propagator
        for vid, sharding in plan.state.shardings.items():
            axes = [a for dim in sharding for a in dim]
            if len(axes) != len(set(axes)):
                raise InvalidPlan(f"value {vid} uses a mesh axis twice: {sharding}")
            for size, dim in zip(prop.shapes[vid], sharding):
                if size % math.prod(goal.mesh[a] for a in dim):
                    raise InvalidPlan(f"value {vid}: {dim} does not divide {size}")
        # resharding of carried state must be costed: a link whose sides differ adds a
        # collective; check the cost model saw every such link
        model = goal.cost_model
        for op in prog.ops:
            if op.primitive == "_link" and op.params["kind"] == "state":
                src, dst = op.inputs

                def real(sharding):  # axes of size 1 tile nothing
                    return tuple(tuple(a for a in d if goal.mesh[a] > 1) for d in sharding)

                differ = real(prop.sharding(plan.state, src)) != real(
                    prop.sharding(plan.state, dst)
                )
                if differ and not model.op_cost(op.index, plan.state).collectives:
                    raise InvalidPlan(
                        f"carried value {prog.input_paths[dst]} is resharded "
                        "without a costed collective"
                    )


def real_args(goal, seed: int = 0):
    """The goal's args as small real arrays: its own arrays if it has them, otherwise
    floats uniform in [0, 0.1) (non-negative, so optimizer second moments stay valid),
    integers zero (a valid index anywhere), typed PRNG keys from `seed`."""
    rng = np.random.default_rng(seed)

    def make(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.split(jax.random.key(seed), math.prod(x.shape) or 1).reshape(x.shape)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.asarray(rng.uniform(0, 0.1, x.shape), x.dtype)
        return jnp.zeros(x.shape, x.dtype)

    return jax.tree_util.tree_map(make, goal.args)


def _as_numpy(leaf) -> np.ndarray:
    """A leaf as a NumPy array; typed PRNG keys as their key data."""
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


def _kind(dtype) -> str:
    """ "inexact" for every float and complex dtype (bfloat16 and fp8 included, which
    NumPy does not count as floating), "exact" for integers and bools."""
    if jnp.issubdtype(dtype, jnp.inexact):
        return "inexact"
    if jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_):
        return "exact"
    return "other"


def _widen(x: np.ndarray) -> np.ndarray:
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return x.astype(np.complex128)
    return x.astype(np.float64)


def _largest(y: np.ndarray) -> float:
    return float(np.max(np.abs(np.where(np.isfinite(y), y, 0.0)), initial=0.0))


def max_relative_error(a, b, *, floor: float = 1e-2) -> float:
    """Largest over the leaves of max|a - b| / max|b|, for every numeric dtype: floats of
    any width (bfloat16 and fp8 included), complex (|a - b| is the modulus), integers and
    bools (exact: any difference counts at least 1 / max|b|), typed PRNG keys (their key
    data). A float leaf much smaller than the rest is measured against `floor` times the
    largest magnitude of all float leaves instead: after an Adam step, a small parameter
    moves by about the learning rate whatever its gradient, so the rounding of a sharded
    reduction shows up in it out of proportion to its size. Leaves whose shapes differ
    count as an infinite error."""
    exact, inexact = [], []
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = _as_numpy(x), _as_numpy(y)
        if x.shape != y.shape:
            return float("inf")
        kinds = {_kind(x.dtype), _kind(y.dtype)}
        if not y.size or "other" in kinds:
            continue
        if kinds == {"exact"}:
            differ = x != y  # before widening: 2**53 + 1 and 2**53 are one float64
            diff = np.where(differ, np.maximum(np.abs(_widen(x) - _widen(y)), 1.0), 0.0)
            exact.append((diff, _largest(_widen(y))))
        else:
            inexact.append((_widen(x), _widen(y)))
    overall = max((_largest(y) for _, y in inexact), default=0.0)
    worst = max((float(np.max(d)) / max(s, 1.0) for d, s in exact), default=0.0)
    for x, y in inexact:
        same = (x == y) | (np.isnan(x) & np.isnan(y))  # equal infinities and NaNs agree
        if not np.all(same | (np.isfinite(x) & np.isfinite(y))):
            return float("inf")  # a NaN or infinity on one side only
        with np.errstate(invalid="ignore"):  # inf - inf where `same` masks it anyway
            diff = np.where(same, 0.0, np.abs(x - y))
        scale = max(_largest(y), floor * overall) or 1.0
        worst = max(worst, float(np.max(diff)) / scale)
    return worst


def check_numerics(goal, plan, args=None, *, tolerance: float = RELATIVE_TOLERANCE) -> float:
    """Run the plan sharded on fake devices and the program unsharded on the same small
    real args; raise NumericsMismatch beyond `tolerance`, else return the error."""
    args = args if args is not None else real_args(goal)
    expected = jax.jit(goal.fn)(*args)
    got = plan.jit()(*args)
    err = max_relative_error(got, expected)
    if not err <= tolerance:
        raise NumericsMismatch(
            f"sharded and unsharded results differ: max relative error {err:.3g} > {tolerance:g}"
        )
    return err
