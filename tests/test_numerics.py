"""`max_relative_error` and `check_numerics` over every numeric dtype a program returns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir.testing import check_numerics, max_relative_error

DTYPES = [
    jnp.float32,
    jnp.float16,
    jnp.bfloat16,
    jnp.float8_e4m3fn,
    jnp.float8_e5m2,
    jnp.complex64,
    jnp.int8,
    jnp.int32,
    jnp.uint8,
    jnp.bool_,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_a_difference_in_any_dtype_counts(dtype):
    ones, zeros = jnp.ones(4, dtype), jnp.zeros(4, dtype)
    assert max_relative_error(ones, zeros) == 1.0
    assert max_relative_error(ones, ones) == 0.0
    # one wrong element among right ones, beside a float leaf of another scale
    got = {"x": jnp.ones(8, dtype).at[3].set(jnp.zeros((), dtype)), "y": jnp.full(2, 100.0)}
    want = {"x": jnp.ones(8, dtype), "y": jnp.full(2, 100.0)}
    assert max_relative_error(got, want) == 1.0


def test_complex_integers_and_keys_are_measured_exactly():
    assert max_relative_error(jnp.array([3 + 4j]), jnp.array([0j + 1e-30])) > 1e29
    assert max_relative_error(jnp.array([1 + 1j]), jnp.array([1 + 0j])) == 1.0
    # int64 values that one float64 holds alike still differ
    assert max_relative_error(np.array([2**62 + 1]), np.array([2**62])) > 0
    assert max_relative_error(np.array([7, 100]), np.array([7, 0])) == 100 / 7
    key = jax.random.key(0)
    assert max_relative_error(key, key) == 0.0
    assert max_relative_error(key, jax.random.key(1)) > 0
    assert max_relative_error(
        jnp.array([np.nan], jnp.bfloat16), jnp.array([1.0], jnp.bfloat16)
    ) == float("inf")
    assert max_relative_error(jnp.ones((2, 2)), jnp.ones(4)) == float("inf")


def _bf16_step(x):
    return (x * 2).astype(jnp.bfloat16), jnp.sum(x > 0.05).astype(jnp.int32)


def test_check_numerics_measures_bfloat16_and_integer_outputs():
    goal = partir.Goal(
        _bf16_step, (jax.ShapeDtypeStruct((8, 4), jnp.float32),), mesh={"batch": 2}, device="cpu"
    )
    plan = partir.plan(goal, {"x": P("batch")})
    x = jnp.asarray(np.random.default_rng(0).uniform(0, 0.1, (8, 4)), jnp.float32)
    assert check_numerics(goal, plan, (x,)) == 0.0
    wrong = (x * 2).astype(jnp.bfloat16) + 1, jnp.int32(0)
    assert max_relative_error(wrong, jax.jit(_bf16_step)(x)) > 1.0
