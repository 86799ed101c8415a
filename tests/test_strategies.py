"""Each strategy class owns its meaning: its arguments, its conflicts, its constraints."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import partir
from partir import strategies as S
from partir.strategies.base import conflict


def test_catalog_is_made_of_the_classes():
    assert list(S.CATALOG) == ["batch", "zero", "fsdp", "megatron", "expert", "auto"]
    assert S.CATALOG["zero"].arguments == ("stage",)
    assert S.CATALOG["batch"].arguments == ("inputs",)
    assert S.CATALOG["megatron"].arguments == ()


def test_arguments_are_checked_by_their_class():
    assert S.Zero.check_argument("stage", 2) == 2
    with pytest.raises(ValueError, match="zero stage must be 1, 2 or 3, not 4"):
        S.zero("a", stage=4)
    with pytest.raises(ValueError, match="not true"):
        S.Zero.check_argument("stage", True, show=lambda v: str(v).lower())
    assert S.Batch.check_argument("inputs", "batch/*") == ("batch/*",)
    with pytest.raises(ValueError, match="a path glob or a list of them"):
        S.Batch.check_argument("inputs", [])


def test_conflicts_say_what_to_change():
    why = conflict([S.batch("a"), S.megatron("a")])
    assert why is not None and "different mesh axes" in why
    assert conflict([S.megatron("a"), S.fsdp("a")]) is not None
    twice = conflict([S.zero("a", 1), S.zero("a", 3)])
    assert twice is not None and "twice" in twice and "'a'" in twice
    assert conflict([S.batch("a"), S.zero("a")]) is None
    assert conflict([S.tile("x", 0, "a"), S.tile("y", 1, "a")]) is None
    assert conflict([S.replicate("x", "a"), S.replicate("y", "a")]) is None


def _moe_step(params, x):
    """A MaxText-named MoE block: nothing in its paths says `moe` or `experts`."""

    def loss(p):
        h = jax.nn.relu(jnp.einsum("ecd,edf->ecf", x, p["MoeBlock_0"]["wi_0"]))
        return jnp.sum(jnp.einsum("ecf,efd->ecd", h, p["MoeBlock_0"]["wo"]) ** 2)

    g = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda w, d: w - 1e-3 * d, params, g)


def _moe_args(experts=4):
    f32 = jnp.float32
    params = {
        "MoeBlock_0": {
            "wi_0": jax.ShapeDtypeStruct((experts, 16, 32), f32),
            "wo": jax.ShapeDtypeStruct((experts, 32, 16), f32),
        }
    }
    return params, jax.ShapeDtypeStruct((experts, 8, 16), f32)


def test_expert_finds_moe_weights_by_structure():
    goal = partir.Goal(
        _moe_step,
        _moe_args(),
        {"expert": 4},
        schedule=[S.expert("expert")],
        search=partir.Search(seed=0, episodes=5),
    )
    plan = partir.solve(goal, baselines=False)
    assert plan.specs["params/MoeBlock_0/wi_0"][0] == "expert"
    assert plan.specs["params/MoeBlock_0/wo"][0] == "expert"


def _routed_step(params, batch):
    """Top-1 routing by gathering each token's expert weights (`w[top_k(logits)]`), beside
    an embedding looked up by token ids: only the experts' weights are MoE weights."""

    def loss(p):
        x = p["embed"][batch["tokens"]]  # (tokens, d)
        _, chosen = jax.lax.top_k(x @ p["router"], 1)  # (tokens, 1)
        h = jax.nn.relu(jnp.einsum("td,tdf->tf", x, p["w_in"][chosen[:, 0]]))
        return jnp.sum(jnp.einsum("tf,tfd->td", h, p["w_out"][chosen[:, 0]]) ** 2)

    g = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda w, d: w - 1e-3 * d, params, g)


def test_expert_finds_weights_a_router_dispatches_by_index():
    from partir.ir.groups import expert_dims

    f32 = jnp.float32
    params = {
        "embed": jax.ShapeDtypeStruct((64, 16), f32),
        "router": jax.ShapeDtypeStruct((16, 4), f32),
        "w_in": jax.ShapeDtypeStruct((4, 16, 32), f32),
        "w_out": jax.ShapeDtypeStruct((4, 32, 16), f32),
    }
    batch = {"tokens": jax.ShapeDtypeStruct((8,), jnp.int32)}
    goal = partir.Goal(
        _routed_step,
        (params, batch),
        {"expert": 4},
        schedule=[S.expert("expert")],
        search=partir.Search(seed=0, episodes=5),
    )
    prog = goal.program
    found = {prog.input_paths[v]: d for v, d in expert_dims(prog).items()}
    assert found == {"params/w_in": 0, "params/w_out": 0}  # not the embedding, not the router
    plan = partir.solve(goal, baselines=False)
    assert plan.specs["params/w_in"][0] == plan.specs["params/w_out"][0] == "expert"
    from partir.testing.checks import check_numerics

    assert check_numerics(goal, plan) < 1e-5  # each device gathers from the experts it holds


def test_expert_by_name_reads_maxtext_blocks_and_leaves_the_router():
    from partir.strategies.expert import _named_moe

    assert _named_moe("decoder/layers/MoeBlock_0/wi_0/value")
    assert _named_moe("model/block_sparse_moe/experts/0/w1")
    assert not _named_moe("decoder/layers/MoeBlock_0/gate/kernel/value")  # the router
    assert not _named_moe("params/remove/w") and not _named_moe("params/amoeba/w")


def test_expert_that_tiles_nothing_says_so():
    goal = partir.Goal(
        _moe_step, _moe_args(experts=3), {"expert": 2}, schedule=[S.expert("expert")]
    )
    with pytest.raises(partir.PlanError, match="finds no mixture-of-experts weight"):
        partir.solve(goal, baselines=False)


def test_expert_params_name_the_moe_weights_and_no_others():
    goal = partir.Goal(
        _moe_step,
        _moe_args(),
        {"expert": 4},
        schedule=[S.expert("expert", params="**/wi_0")],
        search=partir.Search(seed=0, episodes=5),
    )
    from partir.ir.groups import find_groups
    from partir.strategies.compile import compile_axis

    prop = goal.propagator
    problem = compile_axis(goal, "expert", prop.empty(), find_groups(goal.program), 10)
    required = {goal.program.input_paths[d.value] for d in problem.required}
    assert "params/MoeBlock_0/wi_0" in required and "params/MoeBlock_0/wo" not in required
    plan = partir.solve(goal, baselines=False)
    assert plan.specs["params/MoeBlock_0/wi_0"][0] == "expert"  # wo follows by propagation
    unmatched = goal.replace(schedule=[S.expert("expert", params=["**/router"])])
    with pytest.raises(
        partir.PlanError, match=r"expert\(params=\['\*\*/router'\]\).*tiles nothing"
    ):
        partir.solve(unmatched, baselines=False)
    with pytest.raises(ValueError, match="a path glob or a list of them"):
        S.expert("expert", params=[])
    spec = partir.load_goal_text(
        'program "partir.models.moe:train_step"\ninputs "partir.models.moe:example_args"()\n'
        'mesh data=2, model=4\naxis model { expert(params=["**/moe/w_in"]) }\n'
    )
    assert spec.schedule[0] == S.expert("model", params=("**/moe/w_in",))
