"""Sub-axis shardings (partir/solver/subaxes.py): a megatron axis wider than a GQA model's
key-value heads is also searched split in two parts; the split plan runs on the user's mesh
with its devices reshaped, XLA's collectives are the model's, and the numbers are the
unsharded step's."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir.models import llama
from partir.solver import subaxes
from partir.strategies import batch, megatron
from partir.testing.checks import check_numerics

BOTH = ("tensor:0", "tensor:1")


def goal_of(kv_heads: int, mesh=None, **options) -> partir.Goal:
    # 8 query heads over 2 key-value heads; f32 compute, so numerics compare exactly
    args = llama.example_args(
        preset="small", kv_heads=kv_heads, layers=2, compute_dtype="float32", **options
    )
    return partir.Goal(
        llama.train_step,
        args,
        mesh=mesh or {"data": 2, "tensor": 4},
        device="cpu",
        schedule=[batch("data"), megatron("tensor")],
        search=partir.Search(seconds=20, seed=0),
    )


def test_a_split_is_proposed_where_the_axis_is_wider_than_a_weight_dim():
    assert subaxes.split_meshes(goal_of(kv_heads=2)) == [{"data": 2, "tensor:0": 2, "tensor:1": 2}]
    assert subaxes.split_meshes(goal_of(kv_heads=4)) == []  # 4 ways divide every weight dim
    split = subaxes.split_goal(goal_of(kv_heads=2), {"data": 2, "tensor:0": 2, "tensor:1": 2})
    assert [(type(s).__name__, s.axis) for s in split.schedule] == [
        ("Batch", "data"),
        ("Megatron", "tensor:0"),
        ("Megatron", "tensor:1"),
    ]
    assert subaxes.split_meshes(split) == []  # a split goal is not split again


def test_megatron_on_the_minor_part_may_cut_what_the_major_part_cuts():
    from partir.strategies.base import AxisContext

    split = subaxes.split_goal(goal_of(kv_heads=2), {"data": 2, "tensor:0": 2, "tensor:1": 2})
    prog = split.program
    q = prog.inputs["params/layers/attn/q"]  # (layers, d, heads 8, head dim)
    state = partir.plan(split, {"**/attn/q": P(None, None, "tensor:0", None)}).state
    ctx = AxisContext(split, "tensor:1", state, ())
    assert 2 in ctx.free_dims(q, minor_to={"tensor:0"})
    assert 2 not in ctx.free_dims(q)
    # a dim cut by an axis of another strategy stays closed to megatron
    state = partir.plan(split, {"**/attn/q": P(None, None, "data", None)}).state
    ctx = AxisContext(split, "tensor:1", state, ())
    assert 2 not in ctx.free_dims(q, minor_to={"tensor:0"})


def test_the_kv_heads_on_the_major_part_and_query_heads_on_both_agree_with_xla():
    goal = goal_of(kv_heads=2)
    split = subaxes.split_goal(goal, subaxes.split_meshes(goal)[0])
    plan = partir.plan(
        split,
        {
            "batch/*": P("data"),
            "**/attn/q": P(None, None, BOTH, None),
            "**/attn/[kv]": P(None, None, "tensor:0", None),
            "**/attn/o": P(None, BOTH, None, None),
            "**/mlp/w_[gi]*": P(None, None, BOTH),
            "**/mlp/w_out": P(None, BOTH, None),
        },
    )
    report = partir.verify(split, plan)
    assert report.ok, str(report)
    assert report.compiled["all-reduce"] == plan.cost.bytes_by_kind()["all-reduce"] > 0
    assert report.compiled["all-gather"] == report.compiled["all-to-all"] == 0
    assert check_numerics(split, plan) < 1e-5


@pytest.mark.slow
def test_solve_keeps_the_split_when_it_pays_and_runs_it_on_the_users_mesh(tmp_path):
    mesh = jax.make_mesh((2, 4), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    goal = goal_of(kv_heads=2, mesh=mesh)
    plan = partir.solve(goal, baselines=False)
    rows = plan.search["splits"]
    assert [r["mesh"] for r in rows] == [
        {"data": 2, "tensor": 4},
        {"data": 2, "tensor:0": 2, "tensor:1": 2},
    ]
    whole, split = rows
    assert split["chosen"] and split["step_time_s"] < whole["step_time_s"]
    assert plan.mesh == {"data": 2, "tensor:0": 2, "tensor:1": 2}
    # the CLI's table of both
    from rich.console import Console

    from partir.cli import _split_table

    console = Console(record=True, width=120)
    console.print(_split_table(plan))
    text = console.export_text()
    assert "data=2 x tensor=4" in text and "tensor:0=2 x tensor:1=2" in text and "chosen" in text
    # the parts' devices are those of the user's axis, in its order
    ins, _ = plan.shardings()
    run_on = jax.tree_util.tree_leaves(ins)[0].mesh
    assert run_on.devices.reshape(2, 4).tolist() == mesh.devices.tolist()
    assert check_numerics(plan.goal, plan) < 1e-5
    # a plan file of the split plan reads back against the user's goal
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    again = partir.Plan.from_json(path.read_text(), goal)
    assert again.mesh == plan.mesh and again.specs == plan.specs
