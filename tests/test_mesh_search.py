"""Choosing the mesh shape: axes of no size with `devices=N` (Python) or `NAME=? ... over N`
(goal files); every factorization tried is reported, the best plan returned."""

import json
import math
import pathlib
import re
import time

import jax
import numpy as np
import pytest

import partir
from partir import strategies as st
from partir.cli import main
from partir.models import gpt, mlp
from partir.solver.mesh_search import factorizations

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("n", "k", "count"), [(8, 2, 4), (64, 3, 28), (12, 2, 6), (1, 3, 1), (7, 1, 1)]
)
def test_factorizations_are_every_ordered_product(n, k, count):
    got = list(factorizations(n, k))
    assert len(got) == len(set(got)) == count
    assert all(len(f) == k and math.prod(f) == n for f in got)


def open_goal(**kw):
    return partir.Goal(
        mlp.train_step,
        mlp.example_args(abstract=False),
        mesh={"batch": None, "model": None},
        devices=8,
        schedule=[st.batch("batch"), st.megatron("model")],
        search=partir.Search(episodes=20, seed=0),
        **kw,
    )


def test_open_axes_are_solved_on_every_shape_and_the_best_is_returned():
    goal = open_goal()
    plan = partir.solve(goal)
    rows = plan.search["meshes"]
    screened = [r for r in rows if r["round"] == "screened"]
    assert [tuple(r["mesh"].values()) for r in screened] == [(1, 8), (2, 4), (4, 2), (8, 1)]
    searched = [r for r in rows if r["round"] == "searched"]
    chosen = [r for r in rows if r["chosen"]]
    assert len(chosen) == 1 and chosen[0]["mesh"] == plan.mesh
    assert chosen[0]["step_time_s"] == min(r["step_time_s"] for r in searched)
    assert plan.cost.step_time_s == chosen[0]["step_time_s"]
    # the numbers are what a plain solve on that mesh gives
    fixed = partir.Goal(
        goal.fn, goal.args, mesh=plan.mesh, schedule=goal.schedule, search=goal.search
    )
    assert partir.solve(fixed, baselines=False).cost == plan.cost
    assert plan.baselines  # expert plans costed for the chosen shape
    out = plan.jit()(*goal.args)
    want = jax.jit(goal.fn)(*goal.args)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_a_fixed_axis_stays_and_the_open_ones_share_the_rest():
    goal = partir.Goal(
        mlp.train_step,
        mlp.example_args(),
        mesh={"batch": 2, "model": None},
        devices=8,
        schedule=[st.batch("batch"), st.megatron("model")],
        search=partir.Search(episodes=4),
    )
    plan = partir.solve(goal)
    assert plan.mesh == {"batch": 2, "model": 4}
    assert {tuple(r["mesh"].values()) for r in plan.search["meshes"]} == {(2, 4)}


def test_shapes_the_schedule_cannot_use_are_reported_with_their_reason():
    # tiny batch is 8: batch=8 x model=1 works, but with 16 devices batch=16 divides nothing
    goal = partir.Goal(
        mlp.train_step,
        mlp.example_args(),
        mesh={"batch": None, "model": None},
        devices=16,
        schedule=[st.batch("batch"), st.megatron("model")],
        search=partir.Search(episodes=4),
    )
    plan = partir.solve(goal)
    bad = [r for r in plan.search["meshes"] if "error" in r]
    assert [r["mesh"] for r in bad] == [{"batch": 16, "model": 1}]
    assert "batch on axis 'batch' (size 16)" in bad[0]["error"]


@pytest.mark.parametrize(
    ("mesh", "devices", "message"),
    [
        ({"batch": None}, None, "pass devices=N"),
        ({"batch": 3, "model": None}, 8, "cannot cover devices=8"),
        ({"batch": 2, "model": 4}, 16, "cannot cover devices=16"),
        ({"batch": None}, 0, "devices must be a whole number"),
    ],
)
def test_bad_open_meshes_say_why(mesh, devices, message):
    with pytest.raises(ValueError, match=message):
        partir.Goal(mlp.train_step, mlp.example_args(), mesh=mesh, devices=devices)


def test_an_open_goal_has_no_propagator_until_a_shape_is_chosen():
    with pytest.raises(ValueError, match="partir.solve chooses them"):
        open_goal().propagator  # noqa: B018


GOAL = """program "partir.models.mlp:train_step"
inputs  "partir.models.mlp:example_args"(preset="tiny")
mesh    {mesh}
axis batch {{ batch }}
axis model {{ megatron }}
search mcts(episodes=24)
"""


def test_goal_file_mesh_over_n():
    goal = partir.load_goal_text(GOAL.format(mesh="batch=?, model=? over 8"))
    assert goal.mesh == {"batch": None, "model": None} and goal.devices == 8
    goal = partir.load_goal_text(GOAL.format(mesh="batch=2, model=? over 8"))
    assert goal.open_axes == ["model"] and goal.num_devices == 8


def test_a_goal_file_shape_its_strategy_cannot_use_is_recorded_not_raised():
    # as the Python goal above: a strategy's error at its statement, for one shape only
    goal = partir.load_goal_text(GOAL.format(mesh="batch=?, model=? over 16"), "g.partir")
    plan = partir.solve(goal, baselines=False)
    bad = [r for r in plan.search["meshes"] if "error" in r]
    assert [r["mesh"] for r in bad] == [{"batch": 16, "model": 1}]
    assert bad[0]["error"].startswith("g.partir:4:14: error: batch on axis 'batch' (size 16)")
    assert plan.mesh != {"batch": 16, "model": 1}


@pytest.mark.parametrize(
    ("mesh", "where", "message"),
    [
        (
            "batch=?, model=?",
            "3:9",
            "mesh axis 'batch' has size ?, so the mesh needs a device count",
        ),
        ("batch=2, model=2 over 8", "3:31", "the mesh's sizes multiply to 4, not 8"),
        ("batch=3, model=? over 8", "3:31", "8 devices cannot be split over the fixed axes"),
        ("batch=?, model=? over 0", "3:31", "the device count after 'over' must be a positive"),
        ("batch=, model=? over 8", "3:15", "unexpected ','; expected '?' or a number"),
    ],
)
def test_goal_file_mesh_errors_name_the_place(mesh, where, message):
    with pytest.raises(partir.GoalError, match=re.escape(f"<text>:{where}: error: {message}")):
        partir.load_goal_text(GOAL.format(mesh=mesh))


def test_cli_prints_the_mesh_table_and_json_holds_every_shape(tmp_path, capsys):
    path = tmp_path / "open.partir"
    path.write_text(GOAL.format(mesh="batch=?, model=? over 8"))
    assert main(["solve", str(path)]) == 0
    err = capsys.readouterr().err
    assert "mesh shapes tried (8 devices)" in err and "batch=4 x model=2" in err
    assert main(["solve", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert math.prod(d["mesh"].values()) == 8
    assert len([r for r in d["search"]["meshes"] if r["round"] == "screened"]) == 4


@pytest.mark.slow
def test_64_chips_gpt_data_fsdp_tensor_no_worse_than_meshes_chosen_by_hand():
    args = gpt.example_args(layers=24, d_model=2048, heads=16, seq=1024, batch=32, vocab=32000)
    schedule = [st.batch("data"), st.fsdp("fsdp"), st.megatron("tensor")]
    common = dict(device="tpu-v4", memory_limit="32GiB", schedule=schedule)
    t = time.perf_counter()
    plan = partir.solve(
        partir.Goal(
            gpt.train_step,
            args,
            devices=64,
            **common,
            mesh={"data": None, "fsdp": None, "tensor": None},
        )
    )
    seconds = time.perf_counter() - t
    assert plan.cost.fits and seconds < 120  # about 30 s on 2 busy cores
    for data, fsdp, tensor in [(8, 1, 8), (4, 4, 4), (2, 8, 4), (8, 4, 2)]:
        mesh = {"data": data, "fsdp": fsdp, "tensor": tensor}
        hand = partir.solve(partir.Goal(gpt.train_step, args, mesh=mesh, **common), baselines=False)
        # the mesh search screens each shape briefly and searches the best few in full: it
        # chose 2x8x4 at 0.1670 s, the best of these, 4x4x4, at 0.1676 s
        assert plan.cost.step_time_s <= hand.cost.step_time_s * 1.01, mesh


def test_a_deep_model_is_screened_on_its_shallow_copies():
    args = mlp.example_args(preset="tiny", layers=6, d_in=64, d_out=64)  # a stack of 6
    goal = partir.Goal(
        mlp.train_step,
        args,
        mesh={"batch": None, "model": None},
        devices=8,
        schedule=[st.batch("batch"), st.megatron("model")],
        search=partir.Search(episodes=24, seed=0),
    )
    plan = partir.solve(goal)
    screened = [r for r in plan.search["meshes"] if r["round"] == "screened"]
    assert len(screened) == 4
    assert all("1- and 2-layer copies" in r["estimate"] for r in screened)
    chosen = [r for r in plan.search["meshes"] if r["chosen"]]
    assert chosen[0]["round"] == "searched" and "estimate" not in chosen[0]
    assert chosen[0]["step_time_s"] == plan.cost.step_time_s


def test_verify_and_explain_read_a_plan_of_an_open_goal_on_its_chosen_shape(tmp_path, capsys):
    path = tmp_path / "open.partir"
    path.write_text(GOAL.format(mesh="batch=?, model=? over 8"))
    out = tmp_path / "plan.json"
    assert main(["solve", str(path), "--out", str(out)]) == 0
    assert main(["explain", str(path), str(out)]) == 0
    assert "where the collectives come from" in capsys.readouterr().out
    assert main(["verify", str(path), str(out), "--json"]) in (0, 1)  # ran, compared with XLA
    assert "compiled" in json.loads(capsys.readouterr().out)
