"""`partir.jit`: plans at the first call from the arguments' shapes, then runs like jax.jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir import strategies as st

SCHEDULE = [st.batch("batch"), st.megatron("model")]
MESH = {"batch": 2, "model": 4}
FAST = partir.Search(episodes=30, seed=0)


def step(params, x, scale):
    h = jnp.tanh(x @ params["w1"])
    return {"y": (h @ params["w2"]) * scale, "w1": params["w1"] * 0.5, "w2": params["w2"] - 1}


def example(batch=8):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (16, 32)), "w2": jax.random.normal(k2, (32, 8))}
    return params, jax.random.normal(k3, (batch, 16))


def assert_close(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


def test_first_call_plans_later_calls_reuse_it_new_shapes_plan_again():
    f = partir.jit(step, mesh=MESH, schedule=SCHEDULE, search=FAST, static_argnums=2)
    params, x = example()
    assert f.plan is None
    out = f(params, x, 2.0)
    assert_close(out, jax.jit(step, static_argnums=2)(params, x, 2.0))
    assert f.searches == 1 and f.plan.specs["x"] == P("batch", None)  # named by fn's params
    assert out["y"].sharding.spec == f.plan.out_specs["out/y"]
    f(params, x + 1.0, 2.0)
    assert f.searches == 1  # same shapes: the plan is reused
    f(params, x, 3.0)  # a new static value is a new program
    _, x16 = example(batch=16)
    f(params, x16, 2.0)
    assert f.searches == 3 and len(f.plans) == 3
    assert f.plan.goal.program.values[f.plan.goal.program.inputs["x"]].shape == (16, 16)


def test_donated_arguments_are_consumed_as_under_jax_jit():
    f = partir.jit(
        step, mesh=MESH, schedule=SCHEDULE, search=FAST, static_argnums=(2,), donate_argnums=(0,)
    )
    params, x = example()
    f(params, x, 1.0)
    assert params["w1"].is_deleted() and not x.is_deleted()


def test_plans_are_kept_on_disk_keyed_by_the_program(tmp_path):
    params, x = example()
    first = partir.jit(
        step, mesh=MESH, schedule=SCHEDULE, search=FAST, static_argnums=2, cache_dir=tmp_path
    )
    want = first(params, x, 2.0)
    assert first.searches == 1 and len(list(tmp_path.glob("step-*.json"))) == 1
    again = partir.jit(
        step, mesh=MESH, schedule=SCHEDULE, search=FAST, static_argnums=2, cache_dir=tmp_path
    )
    assert_close(again(params, x, 2.0), want)
    assert again.searches == 0 and again.plan.specs == first.plan.specs
    other = partir.jit(
        step, mesh=MESH, schedule=SCHEDULE, search=FAST, static_argnums=2, cache_dir=tmp_path
    )
    other(params, x, 5.0)  # another program (the static value is in its jaxpr)
    assert other.searches == 1 and len(list(tmp_path.glob("step-*.json"))) == 2


def test_a_jax_mesh_and_the_decorator_form():
    mesh = jax.make_mesh((2, 4), ("batch", "model"), devices=jax.devices()[::-1])

    @partir.jit(mesh=mesh, schedule=SCHEDULE, search=FAST)
    def f(params, x):
        return step(params, x, 1.0)

    out = f(*example())
    assert out["y"].sharding.mesh.devices.flat[0] == jax.devices()[-1]


def test_keyword_arguments_are_refused_with_a_reason():
    f = partir.jit(step, mesh=MESH, schedule=SCHEDULE, search=FAST)
    params, x = example()
    with pytest.raises(TypeError, match="positional arguments only"):
        f(params, x, scale=1.0)
    with pytest.raises(ValueError, match="both static and donated"):
        partir.jit(step, mesh=MESH, static_argnums=0, donate_argnums=0)


def test_the_mesh_shape_chosen_at_the_first_call():
    f = partir.jit(
        step,
        mesh={"batch": None, "model": None},
        devices=8,
        schedule=SCHEDULE,
        search=FAST,
        static_argnums=2,
    )
    params, x = example()
    out = f(params, x, 1.0)
    assert f.plan.mesh["batch"] * f.plan.mesh["model"] == 8
    assert len(f.plan.search["meshes"]) >= 4
    assert dict(out["y"].sharding.mesh.shape) == f.plan.mesh
    assert_close(out, jax.jit(step, static_argnums=2)(params, x, 1.0))
