"""Programs and inputs functions that misbehave, for the hostile goal files beside this."""

import sys

import jax
import jax.numpy as jnp


def args(batch=8):
    return {"w": jax.ShapeDtypeStruct((16, 16), jnp.float32)}, {
        "x": jax.ShapeDtypeStruct((batch, 16), jnp.float32)
    }


def step(params, data):
    return jnp.sum(jnp.tanh(data["x"] @ params["w"]))


def returns_a_string(params, data):
    return "done"


def branches_on_a_traced_value(params, data):
    if jnp.sum(data["x"]) > 0:
        return data["x"]
    return params["w"]


def exits_while_tracing(params, data):
    sys.exit(3)


def exits_in_inputs():
    sys.exit(0)


def strings_as_inputs():
    return {"w": "weights.npy"}, {"x": jax.ShapeDtypeStruct((8, 16), jnp.float32)}


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message either")


def raises_unprintable():
    raise Unprintable()


def constrained_step(params, data):
    auto = (jax.sharding.AxisType.Auto,)  # jax 0.11's default is Explicit
    mesh = jax.sharding.AbstractMesh((2,), ("batch",), axis_types=auto)
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch", None))
    x = jax.lax.with_sharding_constraint(data["x"], spec)
    return jnp.sum(jnp.tanh(x @ params["w"]))


def two_data_args(batch=8):
    return {"w": jax.ShapeDtypeStruct((16, 16), jnp.float32)}, {
        "x": jax.ShapeDtypeStruct((batch, 16), jnp.float32),
        "y": jax.ShapeDtypeStruct((3, 16), jnp.float32),
    }


def two_data_step(params, data):
    return jnp.sum(data["x"] @ params["w"]) + jnp.sum(data["y"])
