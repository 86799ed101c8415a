"""The search: strategies compile to constraints, MCTS composes them, CP-SAT prunes."""

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest

import partir
from partir import strategies as st
from partir.bench import REALISTIC
from partir.ir.groups import find_groups
from partir.models import gpt, mlp
from partir.solver import search as search_module
from partir.solver.axis_env import STOP, AxisEnvironment, AxisNode, Stop
from partir.solver.programs import Programs
from partir.solver.prune import InfeasibleMemory, prune_actions
from partir.solver.reward import Reward
from partir.strategies.compile import compile_axis, zero_decisions
from partir.testing import check_plan

S = jax.ShapeDtypeStruct


def gpt_goal(mesh=None, schedule=None, **kw):
    args = gpt.example_args(preset="tiny", batch=64, seq=32, d_model=64, heads=8)
    return partir.Goal(
        gpt.train_step,
        args,
        mesh or {"batch": 2, "model": 4},
        device="tpu-v4",
        schedule=schedule
        if schedule is not None
        else [st.batch("batch"), st.zero("batch", 3), st.megatron("model")],
        search=partir.Search(seed=0),
        **kw,
    )


def test_groups_tie_params_to_moments_and_layers():
    goal = gpt_goal()
    groups = {g.name: g for g in find_groups(goal.program)}
    q = groups["layers/*/attn/q"]
    assert len(q.params) == 2 and len(q.moments) == 4  # 2 layers x (param, mu, nu)
    assert groups["batch/tokens"].data and not groups["batch/tokens"].params


@pytest.mark.parametrize(
    "zero, experts",
    [(True, ("BP+MP+Z3",)), (False, ("BP", "BP+MP"))],
    ids=["with-zero3", "without-zero"],
)
def test_searched_plan_is_valid_and_beats_the_applicable_experts(zero, experts):
    """Applicable: the experts the schedule can express. zero(stage=3) tiles every
    parameter, so with it BP and BP+MP are outside the search space, and without it
    BP+MP+Z3 is."""
    schedule = [st.batch("batch")] + ([st.zero("batch", 3)] if zero else [])
    goal = gpt_goal(schedule=schedule + [st.megatron("model")])
    plan = partir.solve(goal)
    check_plan(goal, plan)
    best = min(plan.baselines[n].step_time_s for n in experts)
    assert plan.cost.step_time_s <= best * 1.0001
    assert plan.search["actions_after"] < plan.search["actions_before"]
    assert plan.specs["batch/tokens"][0] == "batch"


def test_megatron_axis_finds_head_and_hidden_parallel_layers():
    # wide enough that head-parallel attention pays for its all-reduce (at d_model 256 the
    # fused attention costs less than the collective, and the search leaves it whole)
    args = gpt.example_args(preset="small", layers=2, d_model=2048, heads=16, seq=512)
    goal = partir.Goal(
        gpt.train_step,
        args,
        {"batch": 2, "model": 4},
        device="tpu-v4",
        schedule=[st.batch("batch"), st.megatron("model")],
    )
    plan = partir.solve(goal, baselines=False)
    assert plan.specs["params/layers/0/attn/q"][1] == "model"  # heads
    assert plan.specs["params/layers/0/attn/o"][0] == "model"
    assert plan.specs["params/layers/0/mlp/w_in"][1] == "model"  # hidden, column-parallel
    assert plan.specs["params/layers/0/mlp/w_out"][0] == "model"  # row-parallel
    assert plan.specs["batch/tokens"] == partir.Plan.from_json(plan.to_json()).specs["batch/tokens"]


def test_search_is_deterministic_for_a_seed_and_respects_an_episode_budget():
    goal = gpt_goal()
    goal = goal.replace(search=partir.Search(seed=3, episodes=8))
    a, b = partir.solve(goal, baselines=False), partir.solve(goal, baselines=False)
    assert a.specs == b.specs
    assert a.search["episodes"] <= 8


def test_auto_on_every_axis_is_no_worse_than_data_parallel():
    args = mlp.example_args(preset="small")
    goal = partir.Goal(
        mlp.train_step,
        args,
        {"a": 2, "b": 4},
        device="tpu-v4",
        schedule=[st.auto("a"), st.auto("b")],
        search=partir.Search(seed=0),
    )
    plan = partir.solve(goal)
    check_plan(goal, plan)
    assert plan.cost.step_time_s <= plan.baselines["BP"].step_time_s


def test_auto_may_split_a_dim_an_earlier_axis_tiles():
    # FSDP over two axes tiles the batch dim on both; `auto` on the second axis could not
    # (only untiled dims were actions) and stayed 1.14x the FSDP expert on gpt small 2x4
    def model_axis_actions(second):
        goal = gpt_goal(schedule=[st.batch("batch"), second])
        prop, groups = goal.propagator, find_groups(goal.program)
        required = compile_axis(goal, "batch", prop.empty(), groups, 10).required
        state = prop.apply_all(prop.empty(), required)[0]
        return goal, state, compile_axis(goal, "model", state, groups, 20).actions

    goal, state, actions = model_axis_actions(st.auto("model"))
    prop, tokens = goal.propagator, goal.program.inputs["batch/tokens"]
    assert prop.sharding(state, tokens)[0] == ("batch",)
    (split,) = [a for a in actions if a.group == "batch/tokens" and a.dim == 0]
    state = prop.apply_all(state, split.decisions("model", 29))[0]
    assert prop.sharding(state, tokens)[0] == ("batch", "model")
    # an axis is not offered twice, and megatron still leaves the data alone
    again = compile_axis(goal, "model", state, find_groups(goal.program), 30).actions
    assert not any(a.group == "batch/tokens" for a in again)
    _, _, megatron = model_axis_actions(st.megatron("model"))
    assert megatron and not any(a.group.startswith("batch/") for a in megatron)


@pytest.mark.slow
def test_auto_reaches_fsdp_under_a_limit_only_zero_meets():
    # gpt small 2x4 at 145 MiB (FSDP peaks at 138.2 MiB, BP+MP+Z3 at 157.2). An auto axis may
    # end with deferred ZeRO, and while `model` is still to come the data axis is held to 4x the
    # limit (what `model` can divide at most). Without the first, auto fit at 1.40x the
    # FSDP expert; without the second, it minimised memory on `data` alone (1.35x at 160)
    args = gpt.example_args(abstract=True, preset="small")
    goal = partir.Goal(
        gpt.train_step,
        args,
        {"data": 2, "model": 4},
        device="tpu-v4",
        memory_limit="145MiB",
        schedule=[st.auto("data"), st.auto("model")],
        search=partir.Search(seed=0),
    )
    plan = partir.solve(goal)
    assert plan.cost.fits
    assert plan.cost.step_time_s <= 1.01 * plan.baselines["FSDP"].step_time_s
    assert any(c.startswith("zero(stage=") for a in plan.search["axes"] for c in a["chosen"])


def test_a_zero_stop_is_its_own_state_scored_with_zero_applied():
    goal = gpt_goal(schedule=[st.auto("batch"), st.auto("model")])
    programs = Programs(goal, None)
    view = programs.full
    view.actions = compile_axis(goal, "batch", view.state, view.groups, 10).actions
    reward = Reward(goal, programs)
    env = AxisEnvironment([view], "batch", 19, reward, (3,))
    root = AxisNode((view.state,), False)
    assert env.actions(root)[:2] == [STOP, Stop(3)]
    plain, zero = (env.step(root, a) for a in env.actions(root)[:2])
    assert env.key(plain) != env.key(zero) and zero.zero_stage == 3
    assert env.is_terminal(plain) and env.is_terminal(zero)
    costs = [programs.cost((view.state,), extra=env.zero_at_stop(z)) for z in (None, 3)]
    assert costs[1].argument_bytes < costs[0].argument_bytes  # ZeRO-3 tiles the params
    # over a limit both miss, the reward follows memory: the ZeRO stop scores higher
    tight = goal.replace(memory_limit=costs[1].peak_memory_bytes // 2)
    env = AxisEnvironment([view], "batch", 19, Reward(tight, programs), (3,))
    assert env.reward(zero) > env.reward(plain)


def test_the_bound_with_shallow_copies_counts_the_zero_an_auto_axis_may_end_with():
    # gpt small 2x4 auto at 140 MiB: the bound once took the copies' activations without
    # ZeRO and declared "smallest possible 147.41 MiB", while the whole program's bound
    # (with it) was 127.33 MiB and searched
    args = gpt.example_args(abstract=True, preset="small")
    goal = partir.Goal(
        gpt.train_step,
        args,
        {"data": 2, "model": 4},
        device="tpu-v4",
        memory_limit="140MiB",
        schedule=[st.auto("data"), st.auto("model")],
        search=partir.Search(seed=0, episodes=20),
    )
    plan = partir.solve(goal, baselines=False)  # no InfeasibleMemory
    assert plan.search["proxy"]["used"]


def test_a_plan_the_shallow_copies_mispredict_is_searched_again_whole(monkeypatch):
    # auto on mlp 1b 8x8: the copies mispredicted it 2x while the model charged a result-
    # anchored reshard; now they predict it exactly, and their plan (3.8 ms) beats the 5.1 ms
    # the whole search found then
    preset, overrides = REALISTIC["mlp"]
    args = mlp.example_args(abstract=True, preset=preset, **dict(overrides))
    goal = partir.Goal(
        mlp.train_step,
        args,
        {"data": 8, "model": 8},
        device="tpu-v4",
        memory_limit="32GiB",
        schedule=[st.auto("data"), st.auto("model")],
        search=partir.Search(seed=0, episodes=40),
    )
    trusted = partir.solve(goal, baselines=False)
    assert trusted.search["proxy"]["used"]
    assert trusted.search["proxy"]["full_over_predicted"] == pytest.approx(1.0, rel=0.01)
    # said to mispredict, the whole program is searched too, and the better plan is kept
    monkeypatch.setattr(search_module, "_mispredicted", lambda plan: "said to mispredict")
    plan = partir.solve(goal, baselines=False)
    proxy = plan.search["proxy"]
    assert 0 < proxy["episodes_on_copies"] <= 40 and 0 < proxy["episodes_on_whole"] <= 40
    assert proxy["episodes_on_copies"] + proxy["episodes_on_whole"] == plan.search["episodes"]
    kept_copies = proxy["used"]
    other = (
        proxy["whole_search"]["step_time_s"]
        if kept_copies
        else (proxy["rejected_plan_step_time_s"])
    )
    assert plan.cost.step_time_s <= other
    monkeypatch.undo()

    # where the copies predict the full program, their plan is kept
    small = partir.Goal(
        gpt.train_step,
        gpt.example_args(abstract=True, preset="small"),
        {"batch": 2, "model": 4},
        device="tpu-v4",
        schedule=[st.batch("batch"), st.zero("batch", 3), st.megatron("model")],
    )
    kept = partir.solve(small, baselines=False).search["proxy"]
    assert kept["used"] and kept["full_over_predicted"] == pytest.approx(1.0, rel=0.01)


def test_ctrl_c_returns_the_plan_so_far_without_a_second_search(monkeypatch):
    monkeypatch.setattr(search_module, "_mispredicted", lambda plan: "say it was")
    pressed = []

    def interrupt(axis, episode, seconds, best):
        if axis == "b" and not pressed:
            pressed.append(episode)
            raise KeyboardInterrupt

    args = gpt.example_args(abstract=True, preset="small")  # searched on shallow copies
    goal = partir.Goal(
        gpt.train_step,
        args,
        {"a": 2, "b": 4},
        device="tpu-v4",
        schedule=[st.batch("a"), st.auto("b")],
    )
    plan = partir.solve(goal, baselines=False, progress=interrupt)
    assert pressed and plan.search["axes"][-1]["stop_reason"] == "interrupted"
    assert plan.search["proxy"]["used"]


def test_memory_limit_that_cannot_be_met_says_why():
    goal = gpt_goal(memory_limit="64KiB")
    with pytest.raises(
        InfeasibleMemory,
        match=r"needs at least .* per device; "
        r"the limit is 64.00 KiB",
    ):
        partir.solve(goal)


def test_cpsat_forces_tiling_when_memory_is_tight():
    tx = optax.adam(1e-3)

    def step(params, opt_state, batch):
        def loss(p):
            return jnp.mean((jnp.tanh(batch["x"] @ p["w1"]) @ p["w2"] - batch["y"]) ** 2)

        v, g = jax.value_and_grad(loss)(params)
        u, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, u), opt_state, {"loss": v}

    params = {"w1": S((1024, 1024), jnp.float32), "w2": S((1024, 1024), jnp.float32)}
    args = (
        params,
        jax.eval_shape(tx.init, params),
        {"x": S((8, 1024), jnp.float32), "y": S((8, 1024), jnp.float32)},
    )
    free = partir.Goal(step, args, {"m": 8}, schedule=[st.megatron("m")])
    limit = free.cost_model.cost(free.propagator.empty()).peak_memory_bytes // 3
    goal = partir.Goal(step, args, {"m": 8}, memory_limit=limit, schedule=[st.megatron("m")])
    plan = partir.solve(goal, baselines=False)
    assert plan.cost.fits
    unpruned = partir.Goal(
        step,
        args,
        {"m": 8},
        memory_limit=limit,
        schedule=[st.megatron("m")],
        search=partir.Search(prune=None),
    )
    assert partir.solve(unpruned, baselines=False).cost.fits


def test_cpsat_counts_the_axes_of_deferred_zero_stages():
    # ZeRO-3 on `data` is applied after the search; the bound for the `model` axis once
    # left `data` out and declared 26 MiB infeasible ("smallest possible 49.6 MiB") on a
    # schedule whose unpruned search meets it.
    mesh = {"data": 2, "model": 4}
    schedule = [st.batch("data"), st.zero("data", 3), st.megatron("model")]
    args = mlp.example_args(preset="small")

    def goal(**kw):
        return partir.Goal(mlp.train_step, args, mesh, device="tpu-v4", schedule=schedule, **kw)

    unpruned = partir.solve(goal(search=partir.Search(seed=0, prune=None)), baselines=False)
    limit = int(unpruned.cost.peak_memory_bytes * 1.05)
    plan = partir.solve(goal(memory_limit=limit, search=partir.Search(seed=0)), baselines=False)
    assert plan.cost.peak_memory_bytes <= limit


def test_cpsat_lets_the_search_stop_where_the_axis_own_zero_fits(monkeypatch):
    # [megatron, zero(stage=3)] on one axis, at a limit that ZeRO alone meets: no group must
    # be tiled by Megatron. The bound once left this axis's own ZeRO out of the "left whole"
    # option and forbade stopping.
    mesh, axis = {"model": 4}, "model"
    schedule = [st.megatron(axis), st.zero(axis, 3)]
    args = mlp.example_args(preset="small")

    def zero_only(goal):
        prop, groups = goal.propagator, find_groups(goal.program)
        problem = compile_axis(goal, axis, prop.empty(), groups, 10)
        state = prop.apply_all(prop.empty(), problem.required)[0]
        state = prop.apply_all(state, zero_decisions(goal, state, groups, problem.deferred))[0]
        return problem, state

    free = partir.Goal(mlp.train_step, args, mesh, device="tpu-v4", schedule=schedule)
    limit = free.cost_model.cost(zero_only(free)[1]).peak_memory_bytes
    goal = partir.Goal(
        mlp.train_step, args, mesh, device="tpu-v4", schedule=schedule, memory_limit=limit
    )
    results = []

    def spy(*a, **kw):
        results.append(prune_actions(*a, **kw))
        return results[-1]

    monkeypatch.setattr(search_module, "prune_actions", spy)
    partir.solve(goal, baselines=False)
    (result,) = results
    assert result.must_tile == [] and result.removed == 0


def test_manual_tile_and_replicate_are_honoured():
    goal = gpt_goal(
        schedule=[
            st.batch("batch"),
            st.megatron("model"),
            st.tile("params/embed", 0, "model"),
            st.replicate("params/**/scale", "model"),
        ]
    )
    plan = partir.solve(goal, baselines=False)
    assert plan.specs["params/embed"][0] == "model"
    assert all("model" not in str(s) for p, s in plan.specs.items() if p.endswith("/scale"))


def test_json_round_trip():
    goal = gpt_goal()
    goal = goal.replace(search=partir.Search(seed=0, episodes=5))
    plan = partir.solve(goal, baselines=False)
    again = partir.Plan.from_json(plan.to_json(), goal)
    assert again.specs == plan.specs and again.out_specs == plan.out_specs
    loose = partir.Plan.from_json(plan.to_json())
    assert loose.specs == plan.specs
    assert loose.cost.step_time_s == pytest.approx(plan.cost.step_time_s)
    assert dict(plan.to_rules())["**/layers/*/attn/q"] == plan.specs["params/layers/0/attn/q"]


def test_replicate_keeps_inputs_whole_on_its_axis_against_zero_and_propagation():
    schedule = [
        st.batch("batch"),
        st.zero("batch", 3),
        st.megatron("model"),
        st.replicate("params/**/scale", "batch"),
        st.replicate("params/embed", "batch"),
    ]
    goal = gpt_goal(schedule=schedule)
    plan = partir.solve(goal, baselines=False)
    kept = [p for p in plan.specs if p.startswith("params/") and p.endswith("/scale")]
    kept.append("params/embed")
    assert len(kept) > 2
    for path in kept:
        assert "batch" not in jax.tree.leaves(tuple(plan.specs[path])), (path, plan.specs[path])
    # ZeRO still tiles what replicate does not name: the embedding's moments, other params
    assert "batch" in jax.tree.leaves(tuple(plan.specs["opt_state/0/mu/embed"]))
    assert "batch" in jax.tree.leaves(tuple(plan.specs["params/unembed"]))
    check_plan(goal, plan)


def test_replicate_holds_on_an_auto_axis_that_ends_with_zero():
    schedule = [st.auto("batch"), st.auto("model"), st.replicate("params/**", "model")]
    goal = gpt_goal(schedule=schedule, objective="memory")
    plan = partir.solve(goal, baselines=False)
    params = [p for p in plan.specs if p.startswith("params/")]
    assert params
    for path in params:
        assert "model" not in jax.tree.leaves(tuple(plan.specs[path])), (path, plan.specs[path])


def test_a_plan_that_tiles_a_replicated_input_is_refused_and_experts_honour_replicate():
    from jax.sharding import PartitionSpec as P

    from partir.ir.specs import PlanError
    from partir.solver.baselines import expert_plans

    goal = gpt_goal(schedule=[st.replicate("params/**/scale", "batch")])
    with pytest.raises(PlanError, match="replicate statement"):
        partir.evaluate(goal, {"params/ln_f/scale": P("batch")})
    plans = expert_plans(goal)
    assert "BP+MP+Z3" in plans  # ZeRO-3 would tile every scale on batch: left whole instead
    specs = plans["BP+MP+Z3"].specs
    assert specs["params/ln_f/scale"] == P() or "batch" not in tuple(specs["params/ln_f/scale"])
    assert "batch" in jax.tree.leaves(tuple(specs["params/unembed"]))


def test_batch_and_megatron_on_one_axis_is_an_error_not_a_silent_drop():
    from partir.ir.specs import PlanError

    with pytest.raises(PlanError, match="different mesh axes"):  # when the goal is built
        gpt_goal({"x": 4}, schedule=[st.batch("x"), st.megatron("x")])


@pytest.mark.parametrize(
    "kw",
    [
        {"episodes": 0},
        {"episodes": -3},
        {"episodes": 2.5},
        {"seconds": 0},
        {"seconds": -1},
        {"seconds": float("nan")},
        {"seconds": float("inf")},
        {"prune": "sat"},
    ],
)
def test_a_search_budget_that_means_nothing_is_refused(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        partir.Search(**kw)


def test_the_episode_budget_is_shared_by_the_axes_and_never_exceeded():
    goal = gpt_goal(schedule=[st.auto("batch"), st.auto("model")])
    goal = goal.replace(search=partir.Search(seed=0, episodes=1))
    plan = partir.solve(goal, baselines=False)
    assert plan.search["episodes"] == 1  # was one per axis: 2
    # an axis with nothing to choose (batch: its decisions are required) leaves its share
    # to the next one
    goal = gpt_goal()
    goal = goal.replace(search=partir.Search(seed=0, episodes=8))
    plan = partir.solve(goal, baselines=False)
    batch, model = plan.search["axes"]
    assert batch["episodes"] == 0
    assert model["episodes"] == 8 or model["stop_reason"] == "exhausted"


def test_comm_rewards_tell_plans_apart_by_their_bytes():
    # the replicated plan moves no bytes: as the reference it made every plan's "speedup"
    # about 1e-6, and the rewards of all plans that fit agreed to 6 decimals
    from jax.sharding import PartitionSpec as P

    goal = gpt_goal(schedule=[st.auto("batch"), st.auto("model")], objective="comm")
    scorer = Reward(goal, Programs(goal, None))
    bp = partir.evaluate(goal, {"batch/*": P("batch")})
    bp_mp = partir.evaluate(goal, {"batch/*": P("batch"), "params/**/mlp/w_in": P(None, "model")})
    assert 0 < bp.comm_bytes < bp_mp.comm_bytes
    assert scorer.of(bp) - scorer.of(bp_mp) > 0.01
    assert 0.5 < scorer.of(bp_mp) < scorer.of(bp) <= 1.0
    # and it never saturates: plans moving 1/8 and 1/64 of the argument bytes differ too
    args = scorer.reference.argument_bytes
    few, fewer = (dataclasses.replace(bp, comm_bytes=args // k) for k in (8, 64))
    assert scorer.of(few) < scorer.of(fewer) < 1.0


def test_batch_on_an_axis_that_divides_no_batch_is_an_error_that_says_so():
    from partir.ir.specs import PlanError

    goal = gpt_goal({"batch": 3, "model": 4})  # the batch is 64
    with pytest.raises(PlanError, match=r"size 3\) can tile no data input: .*batch/tokens 64"):
        partir.solve(goal, baselines=False)
    # 4 x 32 over one batch of 64: the second axis finds it split 4 ways already
    goal = gpt_goal({"a": 4, "b": 32}, schedule=[st.batch("a"), st.fsdp("b")])
    with pytest.raises(PlanError, match="already split 4 ways"):
        partir.solve(goal, baselines=False)


def test_batch_whose_data_a_replicate_keeps_whole_is_an_error():
    from partir.ir.specs import PlanError

    goal = gpt_goal(schedule=[st.batch("batch"), st.replicate("batch/*", "batch")])
    with pytest.raises(PlanError, match="a replicate statement keeps every data input whole"):
        partir.solve(goal, baselines=False)


def test_a_plan_file_is_refused_by_a_goal_that_now_replicates_what_it_tiles():
    from partir.ir.specs import PlanError

    plan = partir.solve(
        gpt_goal(schedule=[st.batch("batch"), st.zero("model", 3)]), baselines=False
    )
    stricter = gpt_goal(
        schedule=[st.batch("batch"), st.megatron("model"), st.replicate("params/**", "model")]
    )
    with pytest.raises(PlanError, match="a replicate statement of the goal keeps whole"):
        partir.Plan.from_json(plan.to_json(), stricter)


def test_without_a_memory_statement_the_devices_hbm_is_the_limit():
    """A weight that fits no device replicated (8 GiB, its gradient and the update beside it,
    on a 16 GiB device): with no limit given, auto must still shard it."""

    def step(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 1e-3 * g

    args = (
        jax.ShapeDtypeStruct((2**15, 2**16), jnp.float32),
        jax.ShapeDtypeStruct((64, 2**15), jnp.float32),
    )
    goal = partir.Goal(
        step,
        args,
        {"x": 8},
        device="cpu",
        schedule=[st.auto("x")],
        search=partir.Search(seed=0, episodes=30),
    )
    assert goal.memory_limit == 16 * 2**30 and goal.memory_limit_source == "the cpu HBM"
    plan = partir.solve(goal, baselines=False)
    assert plan.cost.fits and plan.cost.peak_memory_bytes <= 16 * 2**30
    assert "x" in str(plan.specs["w"])


def test_a_goal_is_frozen_and_checked_when_built():
    from partir.ir.specs import PlanError

    goal = gpt_goal(schedule=[st.batch("batch"), st.megatron("model")])
    with pytest.raises(AttributeError, match=r"goal.replace\(memory_limit=...\)"):
        goal.memory_limit = 1
    _ = goal.program
    looser = goal.replace(memory_limit="1TiB")
    assert looser.memory_limit == 1 << 40 and goal.memory_limit != looser.memory_limit
    assert looser.program is goal.program  # the trace is shared, not redone
    with pytest.raises(ValueError, match=r"schedule\[0\] is 'batch' \(str\), not a strategy"):
        goal.replace(schedule=["batch"])
    with pytest.raises(ValueError, match="schedule must be a list of strategies"):
        goal.replace(schedule="batch")
    with pytest.raises(PlanError, match="megatron keeps them whole"):
        goal.replace(schedule=[st.batch("model"), st.megatron("model")])
    with pytest.raises(PlanError, match=r"mesh axis 'modle'.*did you mean 'model'"):
        goal.replace(schedule=[st.megatron("modle")])
    with pytest.raises(TypeError, match="unknown fields"):
        goal.replace(memory=1)


def _constrained_layers(act):
    """MaxText's pattern: scanned layers whose activations the program constrains (`act`,
    features on `model`, the residual stream too), parameters carried."""

    def step(params, x):
        def loss(p):
            def body(h, w):
                h = jax.lax.with_sharding_constraint(h, act)
                u = jax.lax.with_sharding_constraint(jax.nn.gelu(h @ w["up"]), act)
                return h + u @ w["down"], None

            return jnp.mean(jax.lax.scan(body, x, p)[0] ** 2)

        return jax.tree.map(lambda a, g: a - 0.1 * g, params, jax.grad(loss)(params))

    return step


def _constrained_goal(schedule, episodes: int):
    """The MaxText-pattern toy on data x model, activations constrained (data, -, model)."""
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    step = _constrained_layers(NamedSharding(mesh, P("data", None, "model")))
    params = {"up": S((4, 64, 256), jnp.float32), "down": S((4, 256, 64), jnp.float32)}
    args = (params, S((16, 32, 64), jnp.float32))
    search = partir.Search(episodes=episodes, seed=0)
    return partir.Goal(step, args, mesh, schedule=schedule, search=search)


def test_the_users_constraints_leave_the_parameters_to_the_search():
    # seeded first, the constraints chose every weight's sharding through the matmuls, and
    # megatron had nothing left to tile (MaxText: the tensor axis searched no action, and the
    # plan moved 1.8x the bytes of MaxText's own). Now the weights stay open, the search
    # scores each plan as make_plan propagates it (constraints with the input shardings)
    goal = _constrained_goal([st.batch("data"), st.megatron("model")], episodes=200)
    prog, prop = goal.program, goal.propagator
    root = prop.empty()
    assert not any(any(prop.sharding(root, prog.inputs[p])) for p in ("params/up", "params/down"))
    for op in prog.ops:  # the constraints hold from the start
        if op.primitive == "sharding_constraint":
            assert any(prop.sharding(root, op.outputs[0]))
    plan = partir.solve(goal, baselines=False)
    (model,) = [a for a in plan.search["axes"] if a["axis"] == "model"]
    assert model["actions_after"] > 0  # was 0: the constraints had tiled every weight
    assert plan.cost.step_time_s == pytest.approx(partir.plan(goal, plan.specs).cost.step_time_s)
    # (XLA's bytes for this plan are not asserted: with the weights replicated the model
    # prices the weight gradients' all-reduces that XLA's propagation avoids, an open gap)


def test_a_search_step_holds_the_later_axes_out_of_the_parameters():
    # an MoE weight tiled on `expert` used to take the constraint's `tensor` too, through the
    # matmul it feeds, before megatron's step, which then had no action on it (MaxText
    # Mixtral on data x expert x tensor: XLA allocated 1.17x MaxText's own plan; 0.81x now)
    from partir.ir.propagate import Decision

    goal = _constrained_goal([st.zero("data", 3), st.megatron("model")], episodes=50)
    prog, prop = goal.program, goal.propagator
    up = prog.inputs["params/up"]
    decision = Decision(10, up, 2, "data")
    prop.hold_back(["model"])  # as while `data` is searched
    assert prop.sharding(prop.apply(prop.empty(), decision), up) == ((), (), ("data",))
    prop.hold_back(())  # once `model` is searched, the constraint reaches the weight
    assert prop.sharding(prop.apply(prop.empty(), decision), up) == ((), ("model",), ("data",))
    plan = partir.solve(goal, baselines=False)
    assert not prop.held_back  # the goal's propagator is left as it was
    (model,) = [a for a in plan.search["axes"] if a["axis"] == "model"]
    assert model["actions_after"] > 0
