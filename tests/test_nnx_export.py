"""A plan handed to Flax NNX: `plan.nnx_sharding` writes each Variable's sharding metadata,
so that NNX's own `nnx.get_partition_spec` / `nnx.get_named_sharding` give the plan, and a
`jax.jit` with them runs a functional NNX train step (over `nnx.State`) as the unsharded
step does. Also: a train state holding the model and its optimizer in one argument gets
rules shared by a parameter and its moments."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import partir
from partir import strategies as st
from partir.solver.partition_rules import partition_rules

MESH = {"batch": 2, "model": 4}
MEGATRON = [
    {"batch/*": P("batch")},
    {
        "**/up/kernel/value": P(None, "model"),
        "**/up/bias/value": P("model"),
        "**/down/kernel/value": P("model", None),
    },
]


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.up = nnx.Linear(32, 128, rngs=rngs)
        self.down = nnx.Linear(128, 32, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


def loss_fn(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def batch_data():
    kx, ky = jax.random.split(jax.random.key(1))
    return {"x": jax.random.normal(kx, (16, 32)), "y": jax.random.normal(ky, (16, 32))}


def mlp_step():
    """A functional step over nnx.State: `train_step(model, optimizer, batch)`."""
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    model_def, model_state = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)

    def train_step(model, optimizer, batch):
        m, o = nnx.merge(model_def, model), nnx.merge(opt_def, optimizer)
        loss, grads = nnx.value_and_grad(loss_fn)(m, batch)
        o.update(m, grads)
        return nnx.state(m), nnx.state(o), loss

    return train_step, model, optimizer, (model_state, opt_state, batch_data())


def goal_for(fn, args):
    return partir.Goal(
        fn, args, MESH, device="tpu-v4", schedule=[st.batch("batch"), st.megatron("model")]
    )


def norm(spec) -> tuple:
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def flat_specs(tree) -> list[tuple]:
    return [norm(s) for s in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, P))]


def planned(plan, argument: str) -> list[tuple]:
    return [norm(s) for p, s in plan.specs.items() if p.startswith(argument + "/")]


def test_nnx_sharding_gives_nnx_the_plans_specs_and_jit_with_them_matches_unsharded():
    fn, model, optimizer, args = mlp_step()
    goal = goal_for(fn, args)
    assert "model/up/kernel/value" in goal.program.inputs  # a traced State ends in `value`
    assert "optimizer/opt_state/0/mu/up/kernel/value" in goal.program.inputs
    plan = partir.plan(goal, MEGATRON)

    model_state = plan.nnx_sharding(model)  # a Module: its nnx.state, annotated
    opt_state = plan.nnx_sharding(nnx.state(optimizer), 1)
    assert model_state["up"]["kernel"].get_metadata("out_sharding") == (None, "model")
    assert opt_state["opt_state"][0]["nu"]["down"]["kernel"].get_metadata("out_sharding") == (
        "model",
        None,
    )
    assert flat_specs(nnx.get_partition_spec(model_state)) == planned(plan, "model")
    assert flat_specs(nnx.get_partition_spec(opt_state)) == planned(plan, "optimizer")
    assert any(planned(plan, "model"))  # something is tiled
    specs = (
        nnx.get_partition_spec(model_state),
        nnx.get_partition_spec(opt_state),
        {"x": P("batch"), "y": P("batch")},
    )
    assert partir.plan(goal, specs).specs == plan.specs  # NNX's specs read back as jit's

    mesh = jax.make_mesh((2, 4), ("batch", "model"), axis_types=(AxisType.Auto,) * 2)
    batch_sharding = {k: NamedSharding(mesh, plan.specs[f"batch/{k}"]) for k in args[2]}
    in_shardings = (
        nnx.get_named_sharding(model_state, mesh),
        nnx.get_named_sharding(opt_state, mesh),
        batch_sharding,
    )
    sharded_args = jax.device_put((model_state, opt_state, args[2]), in_shardings)
    assert sharded_args[0]["up"]["kernel"].get_value().sharding.spec == P(None, "model")
    got = jax.jit(fn, in_shardings=in_shardings)(*sharded_args)
    want = jax.jit(fn)(*args)
    assert got[0]["up"]["kernel"].get_value().sharding.spec == P(None, "model")
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6)

    # as NNX's with_partitioning recipe does: the metadata onto the model, then its arrays
    nnx.update(model, model_state)
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, nnx.get_named_sharding(state, mesh)))
    assert model.down.kernel.get_value().sharding.spec == P("model", None)


class TrainState(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.model = MLP(rngs)
        self.optimizer = nnx.Optimizer(self.model, optax.adamw(1e-2), wrt=nnx.Param)


def test_model_and_moments_in_one_argument_share_rules_and_annotations():
    train = TrainState(nnx.Rngs(0))
    state_def, state = nnx.split(train)

    def train_step(state, batch):
        t = nnx.merge(state_def, state)
        loss, grads = nnx.value_and_grad(loss_fn)(t.model, batch)
        t.optimizer.update(t.model, grads)
        return nnx.state(t), loss

    goal = goal_for(train_step, (state, batch_data()))
    plan = partir.plan(goal, MEGATRON)
    assert plan.specs["state/optimizer/opt_state/0/mu/up/kernel/value"] == P(None, "model")
    rules = plan.to_rules()
    assert rules == [
        ("**/down/kernel/value", P("model", None)),
        ("**/up/bias/value", P("model")),
        ("**/up/kernel/value", P(None, "model")),
        ("batch/x", P("batch", None)),
        ("batch/y", P("batch", None)),
        ("**", P()),
    ]
    annotated = plan.nnx_sharding(state)
    assert flat_specs(nnx.get_partition_spec(annotated)) == planned(plan, "state")


def test_nnx_sharding_of_a_pure_dict_program_and_its_errors():
    model = MLP(nnx.Rngs(0))
    model_def, model_state = nnx.split(model)

    def loss_step(params, batch):
        return loss_fn(nnx.merge(model_def, params), batch)

    goal = goal_for(loss_step, (nnx.to_pure_dict(model_state), batch_data()))
    assert "params/up/kernel" in goal.program.inputs
    plan = partir.plan(goal, [{"batch/*": P("batch")}, {"params/up/kernel": P(None, "model")}])
    annotated = plan.nnx_sharding(model_state)
    assert annotated["up"]["kernel"].get_metadata("out_sharding") == (None, "model")
    assert annotated["down"]["kernel"].get_metadata("out_sharding") == (None, None)

    with pytest.raises(partir.PlanError, match="holds no nnx.Variable"):
        plan.nnx_sharding(nnx.to_pure_dict(model_state))
    other = nnx.state(nnx.Linear(4, 4, rngs=nnx.Rngs(0)))
    with pytest.raises(partir.PlanError, match="params/bias: no input of the program"):
        plan.nnx_sharding(other)
    assert jnp.asarray(model_state["up"]["kernel"].get_value()).shape == (32, 128)


class NamedMLP(nnx.Module):
    """The MLP with logical dim names, as MaxText-style NNX code writes its parameters."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        init, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros
        self.up = nnx.Linear(
            32,
            128,
            kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
            bias_init=nnx.with_partitioning(zeros, ("mlp",)),
            rngs=rngs,
        )
        self.down = nnx.Linear(
            128, 32, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")), rngs=rngs
        )

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


def test_nnx_logical_names_read_back_as_logical_axis_rules():
    with nnx.use_eager_sharding(False):  # logical names are no mesh axes: no placing yet
        model = NamedMLP(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    model_def, model_state = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)

    def train_step(model, optimizer, batch):
        m, o = nnx.merge(model_def, model), nnx.merge(opt_def, optimizer)
        loss, grads = nnx.value_and_grad(loss_fn)(m, batch)
        o.update(m, grads)
        return nnx.state(m), nnx.state(o), loss

    goal = goal_for(train_step, (model_state, opt_state, batch_data()))
    plan = partir.plan(goal, MEGATRON)
    logical = (
        nnx.get_partition_spec(model_state),
        nnx.get_partition_spec(opt_state),
        {"x": P("activation_batch"), "y": P("activation_batch")},
    )
    rules = plan.logical_axis_rules(logical)  # the moments carry their parameter's names
    assert rules == [("mlp", "model"), ("embed", None), ("activation_batch", "batch")]
    with nnx.logical_axis_rules(rules):
        assert flat_specs(nnx.get_partition_spec(model_state)) == planned(plan, "model")
        assert flat_specs(nnx.get_partition_spec(opt_state)) == planned(plan, "optimizer")


def test_one_argument_folds_copies_of_a_tree_but_not_sibling_modules():
    tiled, whole = ((), ("model",)), ((), ())
    state = {
        "state/params/dense/w": tiled,
        "state/params/dense/b": whole,
        "state/params/head/w": whole,
        "state/params/head/b": whole,
        "state/opt_state/0/mu/dense/w": tiled,
        "state/opt_state/0/mu/dense/b": whole,
        "state/opt_state/0/mu/head/w": whole,
        "state/opt_state/0/mu/head/b": whole,
    }
    assert partition_rules(state) == [("**/dense/w", tiled), ("**", ())]
    layers = {
        "params/linear_0/w": tiled,
        "params/linear_0/b": whole,
        "params/linear_1/w": whole,
        "params/linear_1/b": whole,
    }
    assert partition_rules(layers) == [("params/linear_0/w", tiled), ("**", ())]
