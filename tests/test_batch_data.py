"""Which inputs `batch` tiles when the program carries no state (a forward pass)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir.strategies import batch, fsdp
from partir.testing import check_plan


def _forward(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def _apply(w, x):
    return jnp.tanh(x @ w)


ARGS = (
    {
        "w1": jax.ShapeDtypeStruct((16, 32), jnp.float32),
        "w2": jax.ShapeDtypeStruct((32, 8), jnp.float32),
    },
    jax.ShapeDtypeStruct((8, 16), jnp.float32),
)


def test_batch_leaves_parameters_of_a_forward_pass_replicated():
    goal = partir.Goal(_forward, ARGS, mesh={"batch": 2}, schedule=[batch("batch")])
    plan = partir.solve(goal)
    assert plan.specs == {
        "params/w1": P(None, None),
        "params/w2": P(None, None),
        "x": P("batch", None),
    }
    check_plan(goal, plan)
    assert any("carries no state" in n and "'params' replicated" in n for n in goal.notes)


def test_named_data_inputs_and_unnamed_parameters_keep_their_meaning():
    # batch(inputs=...) still decides, with no note
    goal = partir.Goal(
        _forward, ARGS, mesh={"batch": 2}, schedule=[batch("batch", inputs=("params/w1",))]
    )
    assert partir.solve(goal).specs["params/w1"] == P("batch", None)
    assert not goal.notes
    # no argument named like parameters: every input is data, as before
    args = (jax.ShapeDtypeStruct((16, 16), jnp.float32), ARGS[1])
    goal = partir.Goal(_apply, args, mesh={"batch": 2}, schedule=[batch("batch")])
    assert partir.solve(goal).specs["w"] == P("batch", None)


@pytest.mark.parametrize("strategy", [batch, fsdp])
def test_carried_state_still_decides_what_is_data(strategy):
    def step(params, x):
        return jax.tree_util.tree_map(lambda p: p - 0.1 * jnp.mean(x), params), jnp.sum(x)

    goal = partir.Goal(step, ARGS, mesh={"batch": 2}, schedule=[strategy("batch")])
    plan = partir.solve(goal)
    assert plan.specs["x"] == P("batch", None)
    assert not any("carries no state" in n for n in goal.notes)
