"""Deep models are searched on their 1- and 2-layer copies (partir/solver/shallow_copies.py)."""

import jax
import jax.numpy as jnp
import pytest

import partir
from partir import strategies as st
from partir.models import gpt
from partir.solver.plan import make_plan
from partir.solver.shallow_copies import extrapolate, make_shallow_copies, stack_lengths, truncate

S = jax.ShapeDtypeStruct
SIZE = {"d_model": 256, "heads": 8, "seq": 64, "batch": 16, "vocab": 256}
SCHEDULE = [st.batch("batch"), st.zero("batch", 3), st.megatron("model")]


def gpt_goal(layers: int, proxy: bool = True, memory_limit=None) -> partir.Goal:
    args = gpt.example_args(abstract=True, layers=layers, **SIZE)
    return partir.Goal(
        gpt.train_step,
        args,
        {"batch": 2, "model": 4},
        device="tpu-v4",
        memory_limit=memory_limit,
        schedule=SCHEDULE,
        search=partir.Search(seed=0, proxy=proxy),
    )


def test_stacks_are_found_in_params_and_the_moments_that_mirror_them():
    args = gpt.example_args(abstract=True, layers=6, **SIZE)
    assert stack_lengths(args) == {6}
    short = truncate(args, 2)
    assert stack_lengths(short) == set()  # 2 < MIN_LAYERS
    paths = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(short)}
    assert any("['layers'][1]" in p for p in paths)
    assert not any("['layers'][2]" in p for p in paths)
    assert len(jax.tree_util.tree_leaves(short)) < len(jax.tree_util.tree_leaves(args))


def test_the_proxy_search_finds_the_full_search_plan():
    full = partir.solve(gpt_goal(8, proxy=False), baselines=False)
    fast = partir.solve(gpt_goal(8), baselines=False)
    assert full.search["proxy"] == {"used": False, "reason": "switched off"}
    proxy = fast.search["proxy"]
    assert proxy["layers"] == 8 and proxy["used"]
    assert proxy["full_over_predicted"] == pytest.approx(1.0, rel=1e-6)
    assert fast.specs == full.specs
    assert fast.cost.step_time_s == pytest.approx(full.cost.step_time_s, rel=1e-9)
    assert any("model" in str(spec) for spec in fast.specs.values())
    for name in ("attn/q", "mlp/w_in", "mlp/w_out"):  # the layers the search never saw
        assert fast.specs[f"params/layers/7/{name}"] == fast.specs[f"params/layers/0/{name}"]


def test_extrapolated_cost_matches_the_full_program_cost():
    goal = gpt_goal(8)
    plan = partir.solve(goal, baselines=False)
    proxy, _ = make_shallow_copies(goal)
    costs = []
    for small in proxy.shallow:
        shardings = {p: plan.specs[p] for p in small.program.inputs}
        costs.append(make_plan(small, shardings).cost)
    guess = extrapolate(costs, proxy.layers)
    assert guess.flops == pytest.approx(plan.cost.flops, rel=1e-6)
    assert guess.comm_bytes == pytest.approx(plan.cost.comm_bytes, rel=1e-6)
    assert guess.step_time_s == pytest.approx(plan.cost.step_time_s, rel=1e-6)
    assert guess.argument_bytes == pytest.approx(plan.cost.argument_bytes, rel=1e-6)
    assert guess.peak_memory_bytes == pytest.approx(plan.cost.peak_memory_bytes, rel=0.02)


def test_the_memory_limit_holds_for_the_full_program():
    loose = partir.solve(gpt_goal(8), baselines=False)
    limit = int(loose.cost.peak_memory_bytes * 0.8)
    tight = partir.solve(gpt_goal(8, memory_limit=limit), baselines=False)
    assert tight.search["proxy"]["used"]
    assert tight.cost.peak_memory_bytes <= limit


def _mlp_stack(layers: int):
    w = [{"w": S((32, 32), jnp.float32)} for _ in range(layers)]
    return w, S((8, 32), jnp.float32)


def test_a_program_that_hard_codes_its_depth_is_searched_whole():
    def step(ws, x):
        for i in range(6):  # ignores how many layers it is given
            x = jnp.tanh(x @ ws[i]["w"])
        return jnp.sum(x)

    goal = partir.Goal(step, _mlp_stack(6), {"m": 4}, schedule=[st.auto("m")])
    plan = partir.solve(goal, baselines=False)
    assert not plan.search["proxy"]["used"]
    assert "does not trace with fewer layers" in plan.search["proxy"]["reason"]


def test_a_program_not_affine_in_depth_is_searched_whole():
    def step(ws, x):
        for i in range(len(ws)):
            for _ in range(i + 1):  # quadratic in depth
                x = jnp.tanh(x @ ws[i]["w"])
        return jnp.sum(x)

    goal = partir.Goal(step, _mlp_stack(5), {"m": 4}, schedule=[st.auto("m")])
    plan = partir.solve(goal, baselines=False)
    assert plan.search["proxy"]["reason"].startswith("the program is not affine")


def test_auto_search_replays_its_actions_in_order_on_the_full_program():
    goals = [
        gpt_goal(6, proxy=p).replace(
            schedule=[st.auto("batch"), st.auto("model")],
            search=partir.Search(seed=0, episodes=60, proxy=p),
        )
        for p in (True, False)
    ]
    fast, full = (partir.solve(g, baselines=False) for g in goals)
    assert fast.search["proxy"]["used"]
    assert sum(len(a["chosen"]) for a in fast.search["axes"]) > 1  # several actions replayed
    assert fast.specs == full.specs
    assert fast.cost.step_time_s == pytest.approx(full.cost.step_time_s, rel=1e-9)
