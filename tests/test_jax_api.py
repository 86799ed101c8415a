"""JAX's own types in partir's API: a `jax.sharding.Mesh` as the goal's mesh, jit-style
in_shardings pytrees for `partir.plan` / `partir.evaluate`, and `plan.shardings()` for a
user's own `jax.jit`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from partir import strategies as st
from partir.models import mlp


def mlp_goal(mesh=None, **kw) -> partir.Goal:
    mesh = mesh if mesh is not None else {"batch": 2, "model": 4}
    schedule = [st.batch("batch"), st.megatron("model")]
    return partir.Goal(
        mlp.train_step, mlp.example_args(abstract=False), mesh=mesh, schedule=schedule, **kw
    )


def assert_close(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_goal_takes_a_jax_mesh_and_plan_jit_runs_on_its_devices():
    devices = jax.devices()[::-1]  # not the default order: the plan must use these
    mesh = jax.make_mesh((2, 4), ("batch", "model"), devices=devices)  # Explicit axes
    goal = mlp_goal(mesh)
    assert goal.mesh == {"batch": 2, "model": 4} and goal.jax_mesh is mesh
    plan = partir.plan(goal, {"batch/*": P("batch"), "params/layers/0/w": P(None, "model")})
    step = plan.jit()
    out = step(*goal.args)
    leaf = out[0]["layers"][0]["w"]
    assert leaf.sharding.mesh.devices.flat[0] == devices[0]
    assert leaf.sharding.spec == P(None, "model")
    assert_close(out, jax.jit(goal.fn)(*goal.args))


def test_a_bad_mesh_says_what_a_mesh_is():
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        mlp_goal([("batch", 2)])
    with pytest.raises(ValueError, match="sizes must be whole numbers"):
        mlp_goal({"batch": 0})


def in_shardings_tree(goal):
    params, opt_state, _ = goal.args
    mesh = jax.make_mesh((2, 4), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)
    return (
        jax.tree.map(lambda _: P(), params),
        None,  # the whole optimizer state replicated
        {"x": P("batch"), "y": NamedSharding(mesh, P("batch", None))},
    )


def test_plan_and_evaluate_take_an_in_shardings_pytree_as_jit_does():
    goal = mlp_goal()
    from_tree = partir.plan(goal, in_shardings_tree(goal))
    from_rules = partir.plan(goal, {"batch/*": P("batch")})
    assert from_tree.specs == from_rules.specs
    assert from_tree.specs["batch/y"] == P("batch", None)
    assert partir.evaluate(goal, in_shardings_tree(goal)) == from_rules.cost
    # a prefix: one spec for the whole batch argument, None for everything else
    prefix = partir.plan(goal, (None, None, P("batch")))
    assert prefix.specs == from_rules.specs


def test_paths_with_glob_characters_need_no_escaping_in_a_pytree():
    def step(params, x):
        return x @ params["w*"] + x @ params["[w]"] + x @ params["ww"]

    args = (
        {"w*": jnp.ones((8, 8)), "[w]": jnp.ones((8, 8)), "ww": jnp.ones((8, 8))},
        jnp.ones((4, 8)),
    )
    goal = partir.Goal(step, args, mesh={"m": 8})
    plan = partir.plan(goal, ({"w*": P(None, "m"), "[w]": None, "ww": P("m")}, None))
    assert plan.specs["params/w*"] == P(None, "m")
    assert plan.specs["params/[w]"] == P(None, None)
    assert plan.specs["params/ww"] == P("m", None)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (
            (None, None),
            "the args: the shardings have a tuple of 2 where the args have a tuple of 3",
        ),
        ((None, None, {"x": P("batch")}), r"batch: .* \(missing \['y'\]\)"),
        ((None, None, {"x": P("batch", None, None), "y": None}), "batch/x: .* 3 entries .* rank 2"),
        ((None, None, {"x": P("nope"), "y": None}), "batch/x: mesh axis 'nope' is not in the mesh"),
        ((None, [P(), P()], None), "opt_state: .* a list of 2 where the args have a tuple of 2"),
        ((None, None, {"x": {"a": P()}, "y": None}), "batch/x: the shardings have a dict .* array"),
    ],
)
def test_a_pytree_that_does_not_fit_the_args_names_the_place(specs, message):
    goal = mlp_goal()
    with pytest.raises(partir.PlanError, match=message):
        partir.plan(goal, specs)


def test_a_named_sharding_on_another_mesh_is_refused_by_name():
    goal = mlp_goal()
    other = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    specs = (None, None, {"x": NamedSharding(other, P("data")), "y": None})
    with pytest.raises(
        partir.PlanError, match=r"batch/x: the NamedSharding is on mesh \{'data': 8\}"
    ):
        partir.plan(goal, specs)


def test_a_list_of_rule_dicts_is_still_a_schedule_of_stages():
    goal = mlp_goal()
    plan = partir.plan(goal, [{"batch/*": P("batch")}, {"params/layers/0/w": P(None, "model")}])
    assert plan.specs["params/layers/0/w"] == P(None, "model")


def test_plan_shardings_run_under_a_users_own_jit_equal_to_plan_jit():
    goal = mlp_goal(jax.make_mesh((2, 4), ("batch", "model")))
    plan = partir.plan(goal, {"batch/*": P("batch"), "params/layers/1/w": P("model")})
    ins, outs = plan.shardings()
    assert jax.tree.structure(ins) == jax.tree.structure(goal.args)
    assert all(isinstance(s, NamedSharding) for s in jax.tree.leaves(ins))
    assert ins[2]["x"].spec == P("batch", None)
    assert ins[0]["layers"][1]["w"].spec == P("model", None)
    mine = jax.jit(goal.fn, in_shardings=ins, out_shardings=outs)
    got = mine(*goal.args)
    assert got[0]["layers"][1]["w"].sharding.spec == P("model", None)
    assert_close(got, plan.jit()(*goal.args))


def test_plan_shardings_refuse_a_mesh_of_another_shape():
    plan = partir.plan(mlp_goal(), {"batch/*": P("batch")})
    with pytest.raises(partir.PlanError, match="not the plan's mesh"):
        plan.shardings(jax.make_mesh((8,), ("batch",)))
