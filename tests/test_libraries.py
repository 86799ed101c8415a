"""partir on train steps that come from libraries: Flax NNX, Flax linen with logical axis
names (the MaxText recipe), Haiku, Jraph (fast), and the Keras 3 and Penzai recipes (slow).
Each step is built by its script in examples/ecosystem/, traced, planned, run with
`plan.jit` on the 8 fake CPU devices and compared with the unsharded step; its plan is
exported as a Flax/T5X-style rule list that must give back the plan's specs exactly."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir import strategies as st
from partir.cli import main
from partir.ir.rules import UnknownPrimitiveWarning
from partir.ir.specs import glob_match
from partir.testing import check_numerics, check_plan

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "ecosystem"
MESH = {"batch": 2, "model": 4}


@functools.cache
def example(name: str):
    """The module of examples/ecosystem/<name>.py (which may import its sibling _demo)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"eco_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (linen modules) look their module up
    spec.loader.exec_module(module)
    return module


def shapes(args):
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)


def goal_for(fn, args, schedule=None, episodes=20):
    """A goal over the args' shapes (nothing allocated), batch then Megatron."""
    schedule = schedule if schedule is not None else [st.batch("batch"), st.megatron("model")]
    return partir.Goal(
        fn,
        shapes(args),
        MESH,
        device="tpu-v4",
        schedule=schedule,
        search=partir.Search(seed=0, episodes=episodes),
    )


def norm(spec) -> tuple:
    """A spec as a tuple without trailing Nones: P(None, None) and P() shard alike."""
    entries = [tuple(e) if isinstance(e, list) else e for e in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def first_match(rules, path):
    for pattern, spec in rules:
        if glob_match(pattern, path):
            return spec
    return P()


def assert_rules_give_back(plan):
    """The rule list, applied first-match-wins, reproduces every input spec; so do the
    exported Python module (its own matcher, on the real pytree) and the JSON file."""
    rules = plan.to_rules()
    assert rules[-1] == ("**", P())
    got = {p: norm(first_match(rules, p)) for p in plan.specs}
    want = {p: norm(s) for p, s in plan.specs.items()}
    assert got == want, {p: (got[p], want[p]) for p in got if got[p] != want[p]}
    namespace: dict = {}
    exec(plan.rules_source("rules.py"), namespace)
    goal = plan.goal
    names = goal.program.arg_names
    trees = [namespace["tree_specs"](a, n) for a, n in zip(goal.args, names)]
    flat = jax.tree_util.tree_leaves(trees, is_leaf=lambda x: isinstance(x, P))
    assert {p: norm(s) for p, s in zip(goal.program.inputs, flat)} == want
    from_json = [
        (p, P(*[tuple(e) if isinstance(e, list) else e for e in s]))
        for p, s in json.loads(plan.rules_source("rules.json"))
    ]
    assert from_json == rules
    return rules


def warm_adam(args):
    """The args with Adam's second moments (every `nu` leaf) set to one. From the zero `nu`
    of a fresh optimizer Adam's first update is about lr * sign(grad), which turns rounding
    in a near-zero gradient into an lr-sized difference; with `nu` = 1 it is linear in the
    gradient."""

    def warm(key_path, x):
        names = [getattr(k, "key", getattr(k, "name", None)) for k in key_path]
        return jnp.ones_like(x) if "nu" in names else x

    return jax.tree_util.tree_map_with_path(warm, args)


def check_on_initialised_state(goal, plan, args) -> float:
    """The whole step (loss, parameters, both moments), sharded and not, agrees on the
    library's own random initialisation. check_numerics' default synthetic args (weights
    uniform in [0, 0.1), all tokens 0) are ill-conditioned for these models: the unsharded
    float32 step alone is off its float64 result by about 1e-5, and the GNN overflows."""
    return check_numerics(goal, plan, warm_adam(args))


def model_sharded(plan) -> list[str]:
    return [p for p, s in plan.specs.items() if "model" in str(s)]


# -- Flax NNX -----------------------------------------------------------------------------
def nnx_step():
    return example("flax_nnx").train_step_and_args()


@pytest.mark.slow
def test_nnx_searched_plan_runs_sharded_and_matches():
    fn, args = nnx_step()
    goal = goal_for(fn, args)
    assert "params/blocks/1/attn/query/kernel" in goal.program.inputs
    assert "optimizer/opt_state/0/mu/blocks/1/attn/query/kernel" in goal.program.inputs
    assert len(goal.program.carried) == len(goal.program.inputs) - 2  # all but the batch
    plan = partir.solve(goal, baselines=False)
    check_plan(goal, plan)
    assert plan.specs["batch/tokens"] == P("batch", None)
    assert model_sharded(plan)  # Megatron found something worth tiling
    check_on_initialised_state(goal, plan, args)
    rules = assert_rules_give_back(plan)
    assert not any("blocks/0" in p or "blocks/1" in p for p, _ in rules)  # layers folded
    assert not any("opt_state" in p for p, _ in rules)  # moments folded with params


def step_with_model_named_state(fn):
    def train_step(model, optimizer, batch):
        return fn(model, optimizer, batch)

    return train_step


NNX_MEGATRON = {  # hand-written, as in a Flax/T5X rule list
    "**/attn/query/kernel": P(None, "model"),
    "**/attn/key/kernel": P(None, "model"),
    "**/attn/value/kernel": P(None, "model"),
    "**/attn/value/bias": P("model"),
    "**/attn/out/kernel": P("model", None),
    "**/mlp_in/kernel": P(None, "model"),
    "**/mlp_in/bias": P("model"),
    "**/mlp_out/kernel": P("model", None),
}


@pytest.mark.slow
def test_nnx_rules_fold_layers_and_moments_and_narrow_where_they_disagree():
    fn, args = nnx_step()
    goal = goal_for(step_with_model_named_state(fn), args)
    assert "model/blocks/0/attn/query/kernel" in goal.program.inputs
    plan = partir.plan(goal, [{"batch/*": P("batch")}, NNX_MEGATRON])
    rules = assert_rules_give_back(plan)
    assert ("**/blocks/*/attn/query/kernel", P(None, "model")) in rules
    assert ("batch/tokens", P("batch", None)) in rules
    assert len(rules) == len(NNX_MEGATRON) + 3  # one per weight, the batch, the catch-all
    check_on_initialised_state(goal, plan, args)

    # layer 0 only, and ZeRO-1 on the moments of the head: narrower rules, still exact
    mixed = partir.plan(
        goal,
        [
            {"batch/*": P("batch")},
            {
                "**/blocks/0/mlp_in/kernel": P(None, "model"),
                "optimizer/**/mu/head/kernel": P("model"),
            },
        ],
    )
    rules = assert_rules_give_back(mixed)
    assert ("**/blocks/0/mlp_in/kernel", P(None, "model")) in rules
    assert ("optimizer/opt_state/*/mu/head/kernel", P("model", None)) in rules


def test_nnx_search_with_model_named_state():
    fn, args = nnx_step()
    goal = goal_for(step_with_model_named_state(fn), args)
    plan = partir.solve(goal, baselines=False)
    assert model_sharded(plan)


# -- Flax linen with logical axis names, as MaxText writes it ------------------------------
def test_linen_logical_plan_reads_back_as_logical_axis_rules():
    recipe = example("linen_logical")
    fn, args, logical = recipe.train_step_and_args()
    goal = goal_for(fn, args)
    assert "params/layers/query/kernel" in goal.program.inputs  # scanned: one stacked weight
    plan = partir.solve(goal, baselines=False)
    check_plan(goal, plan)
    rules = plan.logical_axis_rules(logical)
    assert recipe.rules_give_back(plan, logical, rules)
    assert dict(rules)["activation_batch"] == "batch" and dict(rules)["mlp"] == "model"
    check_on_initialised_state(goal, plan, args)
    assert_rules_give_back(plan)


def test_logical_axis_rules_refuse_a_name_sharded_two_ways():
    recipe = example("linen_logical")
    fn, args, logical = recipe.train_step_and_args()
    goal = goal_for(fn, args)
    embed = goal.program.inputs  # tile one 'embed' dim only: no rule list gives that back
    plan = partir.plan(goal, {"params/layers/query/kernel": P(None, "model")})
    assert "params/token_embedder/embedding" in embed
    with pytest.raises(partir.PlanError, match="logical axis 'embed' is sharded two ways"):
        plan.logical_axis_rules(logical)
    rules = dict(plan.logical_axis_rules(logical, strict=False))
    assert rules["embed"] is None  # most of embed's bytes are whole


def test_partitioned_boxes_the_params_with_the_plans_mesh_axes():
    import flax.linen as nn

    recipe = example("linen_logical")
    fn, args, _ = recipe.train_step_and_args()
    goal = goal_for(fn, args)
    plan = partir.plan(goal, {"params/layers/wi/kernel": P(None, None, "model")})
    boxed = plan.partitioned(args[0])
    assert boxed["layers"]["wi"]["kernel"].names == (None, None, "model")
    assert boxed["decoder_norm"]["scale"].names == (None,)
    specs = nn.get_partition_spec(boxed)
    assert specs["layers"]["wi"]["kernel"] == P(None, None, "model")
    with pytest.raises(partir.PlanError, match="pass the argument the program was planned with"):
        plan.partitioned(args[2])


# -- Haiku --------------------------------------------------------------------------------
def test_haiku_searched_plan_runs_sharded_and_matches():
    fn, args = example("haiku_mlp").train_step_and_args()
    goal = goal_for(fn, args)
    assert "params/mlp/~/linear_0/w" in goal.program.inputs
    plan = partir.solve(goal, baselines=False)
    check_plan(goal, plan)
    assert plan.specs["batch/x"] == P("batch", None)
    assert model_sharded(plan)
    check_on_initialised_state(goal, plan, args)
    rules = assert_rules_give_back(plan)
    assert not any(p.startswith("opt_state") for p, _ in rules)


# -- Jraph --------------------------------------------------------------------------------
@pytest.mark.slow
def test_jraph_searched_plan_runs_sharded_and_matches():
    fn, args = example("jraph_gnn").train_step_and_args()
    goal = goal_for(fn, args)
    assert {"batch/graph/nodes", "batch/graph/senders", "batch/graph/n_node"} <= set(
        goal.program.inputs
    )
    plan = partir.solve(goal, baselines=False)
    check_plan(goal, plan)
    assert plan.specs["batch/graph/nodes"][0] == "batch"
    check_on_initialised_state(goal, plan, args)
    assert_rules_give_back(plan)


def test_jraph_step_has_a_rule_for_every_op():
    fn, args = example("jraph_gnn").train_step_and_args()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnknownPrimitiveWarning)
        goal_for(fn, args).propagator  # noqa: B018


# -- the CLI's --rules --------------------------------------------------------------------
def test_cli_solve_writes_rules_as_python_and_json(tmp_path, capsys):
    (tmp_path / "haiku_prog.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('h', {str(EXAMPLES / 'haiku_mlp.py')!r})\n"
        "m = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(m)\n"
        "train_step, _args = m.train_step_and_args(hidden=512)\n"
        "def example_args():\n"
        "    return _args\n"
    )
    goal_file = tmp_path / "haiku.partir"
    goal_file.write_text(
        'program "haiku_prog.py:train_step"\n'
        'inputs  "haiku_prog.py:example_args"()\n'
        "mesh    batch=2, model=4\n"
        'device  "tpu-v4"\n'
        "axis batch { batch }\n"
        "axis model { megatron }\n"
        "search mcts(episodes=10, seed=0)\n"
    )
    py, js = tmp_path / "rules.py", tmp_path / "rules.json"
    assert main(["solve", str(goal_file), "--json", "--rules", str(py)]) == 0
    specs = json.loads(capsys.readouterr().out)["specs"]
    assert main(["solve", str(goal_file), "--json", "--rules", str(js)]) == 0
    capsys.readouterr()
    namespace: dict = {}
    exec(py.read_text(), namespace)
    rules = namespace["RULES"]
    assert rules[-1] == ("**", P())
    for path, entries in specs.items():
        assert norm(namespace["spec_for"](path)) == norm(entries), path
    from_json = json.loads(js.read_text())
    assert [p for p, _ in from_json] == [p for p, _ in rules]
    assert [P(*s) for _, s in from_json] == [P(*s) for _, s in rules]


# -- every recipe end to end, as a user runs it --------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["flax_nnx", "haiku_mlp", "jraph_gnn", "keras_mlp", "penzai_mlp", "linen_logical"]
)
def test_example_script_runs(name):
    needs = {"keras_mlp": "keras", "penzai_mlp": "penzai"}  # looked up, not imported: keras
    if name in needs and importlib.util.find_spec(needs[name]) is None:  # picks its backend
        pytest.skip(f"{needs[name]} is not installed (not in the test extra)")  # at import
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RULES" in done.stdout or "logical_axis_rules" in done.stdout
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("loss sharded")]
    if lines:
        got, want = map(float, lines[0].split(":")[1].split())
        assert np.isclose(got, want, rtol=1e-5)


# -- benchmarks/libraries.py: partir against the plans libraries ship ----------------------
def test_library_bench_measures_both_plans_with_xla():
    """The harness on jraph's case at a small size: the library's plan (edges split, as
    jraph's sharded_graphnet) sums its gradients over the devices; both plans are compiled
    and read back, and the estimate of the library's plan is held to XLA's bytes."""
    path = ROOT / "benchmarks" / "libraries.py"
    spec = importlib.util.spec_from_file_location("libraries_bench", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    import library_steps  # on sys.path once the bench is loaded

    case = bench.Case(
        "jraph-gns", "jraph", lambda: library_steps.jraph_gns_step(nodes=16, edges=32)
    )
    row = bench.run_case(case, seconds=1.0, log=lambda _: None)
    assert row.mesh == "d8" and row.error is None
    assert row.library.by_kind.get("all-reduce", 0) > 0
    assert row.library.allocated_bytes > 0 and row.partir.allocated_bytes > 0
    assert row.ratio("allocated_bytes") == row.partir.allocated_bytes / row.library.allocated_bytes
    assert row.estimate_ratio is not None and abs(row.estimate_ratio - 1) <= 0.10
    assert "jraph-gns" in bench.table([row])
