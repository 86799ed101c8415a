"""The strategies of partir.testing produce what they promise: bounded meshes, programs
of known primitives, valid specs and goals, goal files that mean their Goal, bad goal
files that are rejected."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partir
from partir.dsl import GoalError, load_goal_text
from partir.ir.program import trace
from partir.ir.rules import RULES
from partir.ir.specs import check_sharding, glob_match, to_sharding
from partir.strategies import FSDP, Batch, Replicate, Tile
from partir.strategies.compile import manual_decisions, schedule_axes
from partir.testing import (
    BAD_GOAL_KINDS,
    bad_goal_texts,
    goal_texts,
    goals,
    input_shapes,
    meshes,
    programs,
    shardings,
    specs,
)
from partir.testing.strategies import AXIS_NAMES, MESH_SIZES, Forward, TrainStep


@given(st.data())
def test_meshes_are_bounded(data):
    max_axes = data.draw(st.integers(1, 3), label="max_axes")
    max_devices = data.draw(st.sampled_from((1, 2, 4, 8, 16, 64)), label="max_devices")
    mesh = data.draw(meshes(max_axes, max_devices))
    assert 1 <= len(mesh) <= max_axes
    assert math.prod(mesh.values()) <= max_devices
    assert set(mesh) <= set(AXIS_NAMES) and set(mesh.values()) <= set(MESH_SIZES)


@given(st.data())
def test_meshes_without_size_one_still_meet_min_axes(data):
    min_axes = data.draw(st.integers(1, 3), label="min_axes")
    mesh = data.draw(meshes(3, 8, min_axes=min_axes, sizes=(2, 4, 8)))
    assert min_axes <= len(mesh) <= 3 and math.prod(mesh.values()) <= 8
    assert all(n > 1 for n in mesh.values())


def test_meshes_refuse_bounds_nothing_meets():
    with pytest.raises(ValueError):
        meshes(max_axes=0)
    with pytest.raises(ValueError):
        meshes(max_devices=0)
    with pytest.raises(ValueError):
        meshes(min_axes=3, max_devices=4, sizes=(2, 4))


def _dims_ok(args) -> bool:
    return all(
        d in (2, 4, 8, 16, 32, 64) for leaf in jax.tree_util.tree_leaves(args) for d in leaf.shape
    )


@given(programs())
def test_programs_are_small_and_use_only_primitives_with_rules(program):
    fn, args = program
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(args))
    assert _dims_ok(args), args
    prog = trace(fn, args)
    assert set(prog.primitives()) - {"_link"} <= set(RULES)
    assert input_shapes(program) == input_shapes(prog)
    if isinstance(fn, TrainStep):
        assert [n for n in prog.arg_names] == ["params", "opt_state", "batch"]
        state = {p for p in prog.inputs if not p.startswith("batch/")}
        assert set(prog.carried.values()) == state  # params and Adam state go round
        assert prog.values[prog.outputs["out/2/loss"]].shape == ()
    else:
        assert isinstance(fn, Forward) and "out/y" in prog.outputs
        assert not prog.carried


@settings(max_examples=10)
@given(programs(train_step=True), programs(train_step=False))
def test_programs_can_be_asked_for_one_kind(train, forward):
    assert isinstance(train[0], TrainStep) and len(train[1]) == 3
    assert isinstance(forward[0], Forward) and len(forward[1]) == 2


@given(programs(), meshes(), st.data())
def test_specs_are_valid_for_the_program_and_mesh(program, mesh, data):
    spec = data.draw(specs(program, mesh))
    shapes = input_shapes(program)
    assert set(spec) <= set(shapes)
    for path, s in spec.items():
        check_sharding(path, shapes[path], to_sharding(s, len(shapes[path])), mesh)


@given(st.lists(st.sampled_from((2, 4, 8, 16, 6)), max_size=4), meshes(), st.data())
def test_shardings_use_each_axis_once_and_divide(shape, mesh, data):
    sharding = data.draw(shardings(shape, mesh))
    assert len(sharding) == len(shape)
    check_sharding("x", tuple(shape), sharding, mesh)


def test_specs_need_a_mesh_without_a_goal():
    with pytest.raises(TypeError):
        specs((lambda x: x, (jax.ShapeDtypeStruct((2,), np.float32),)))


@given(goals())
def test_goals_have_small_budgets_and_valid_schedules(goal):
    assert goal.search.episodes == 20
    assert all(s.axis in goal.mesh for s in goal.schedule)
    assert set(schedule_axes(goal)) <= set(goal.mesh)
    prop = goal.propagator
    _, rejected = prop.apply_all(prop.empty(), manual_decisions(goal))
    assert not rejected
    tiled = {(s.path, s.axis) for s in goal.schedule if isinstance(s, Tile)}
    assert not tiled & {(s.path, s.axis) for s in goal.schedule if isinstance(s, Replicate)}


def _abstract(args):
    return jax.tree_util.tree_map(lambda x: (x.shape, np.dtype(x.dtype)), args)


@given(goal_texts())
def test_goal_texts_parse_to_their_goal(text_and_goal):
    text, want = text_and_goal
    got = load_goal_text(text)
    assert list(got.mesh.items()) == list(want.mesh.items())
    assert got.schedule == want.schedule
    assert got.device == want.device
    assert got.memory_limit == want.memory_limit
    assert got.objective == want.objective
    assert got.search == want.search
    assert got.fn is want.fn and got.filename == want.filename == "<text>"
    assert _abstract(got.args) == _abstract(want.args)


@settings(max_examples=5)
@given(goal_texts())
def test_goal_text_programs_trace(text_and_goal):
    goal = text_and_goal[1]
    assert goal.program.inputs and set(goal.program.primitives()) - {"_link"} <= set(RULES)


@pytest.mark.parametrize("kind", BAD_GOAL_KINDS)
@settings(max_examples=8)
@given(data=st.data())
def test_every_kind_of_bad_goal_text_is_rejected(kind, data):
    text = data.draw(bad_goal_texts([kind]))
    with pytest.raises(GoalError):
        load_goal_text(text)


def test_bad_goal_texts_refuse_unknown_kinds():
    with pytest.raises(ValueError, match="unknown kinds"):
        bad_goal_texts(["nonsense"])


def test_generated_programs_say_what_they_compute():
    from partir.testing.strategies import Recipe, Step

    fn = Forward(Recipe("dense", 8, 16, steps=(Step("dense", 8), Step("act", fn="tanh"))))
    assert repr(fn) == "Forward(dense x[8, 16]: dense(8) -> act(tanh) -> out y)"
    goal = partir.Goal(fn, fn.example_args(), {"x": 2})
    assert set(goal.program.inputs) == {"params/l0/w", "data/x"}


# Issue: goals() and goal_texts() drew contradictory goals about 1.3% of the time (batch with
# a replicate of the data input on the same axis; a tile and a replicate of one input on
# one axis), so that users' property suites failed spuriously. The statements are checked
# against each other at many examples (cheap: nothing is traced); the goals are solved at a
# few here and at a thousand in the slow suite.


def _contradictions(goal: partir.Goal) -> list[str]:
    """Pairs of statements of the goal's schedule that cannot both hold."""
    paths = list(input_shapes(goal))
    data = [p for p in paths if p.startswith(("batch/", "data/"))]
    batch_axes = {s.axis for s in goal.schedule if isinstance(s, Batch | FSDP)}
    out = []
    for r in (s for s in goal.schedule if isinstance(s, Replicate)):
        kept = {p for p in paths if glob_match(r.path, p)}
        for t in (s for s in goal.schedule if isinstance(s, Tile) and s.axis == r.axis):
            if kept & {p for p in paths if glob_match(t.path, p)}:
                out.append(f"{t} and {r}")
        if r.axis in batch_axes and kept & set(data):
            out.append(f"{r} on a batch axis")
    return out


@settings(max_examples=300)
@given(goals())
def test_drawn_goals_have_no_contradicting_statements(goal):
    assert not _contradictions(goal)


@settings(max_examples=300)
@given(goal_texts())
def test_drawn_goal_texts_have_no_contradicting_statements(text_and_goal):
    assert not _contradictions(text_and_goal[1])


def _solves(goal: partir.Goal) -> None:
    goal = goal.replace(search=partir.Search(episodes=2, prune=None))  # the schedule is tested
    try:
        partir.solve(goal, baselines=False)
    except partir.PlanError as e:
        raise AssertionError(f"schedule={goal.schedule}: {e}") from None


@settings(max_examples=30)
@given(goals())
def test_drawn_goals_solve(goal):
    _solves(goal)


@settings(max_examples=30)
@given(goal_texts())
def test_drawn_goal_texts_solve(text_and_goal):
    _solves(text_and_goal[1])


@pytest.mark.slow
@settings(max_examples=1000)
@given(goals())
def test_a_thousand_drawn_goals_solve(goal):
    _solves(goal)


@pytest.mark.slow
@settings(max_examples=1000)
@given(goal_texts())
def test_a_thousand_drawn_goal_texts_solve(text_and_goal):
    _solves(text_and_goal[1])
