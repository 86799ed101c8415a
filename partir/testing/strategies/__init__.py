"""Hypothesis strategies for property-based suites of partir and of partir's users.

    from hypothesis import given
    from partir.testing import check_plan, meshes, programs, specs

    @given(st.data())
    def test_plans_are_valid(data):
        fn, args = data.draw(programs())
        mesh = data.draw(meshes())
        goal = partir.Goal(fn, args, mesh)
        check_plan(goal, partir.plan(goal, data.draw(specs(goal))))

- `meshes()`: {axis: size} with 1-3 axes whose sizes multiply to at most 8.
- `programs()`: `(fn, args)`: small random JAX functions made of primitives partir has
  sharding rules for, args as `ShapeDtypeStruct` pytrees whose dims are small powers of 2;
  `programs(train_step=True)` gives Adam train steps `(params, opt_state, batch) ->
  (params, opt_state, {"loss": ...})`.
- `specs(goal)` / `specs((fn, args), mesh)`: random valid input shardings {path: P(...)}.
- `goals()`: `partir.Goal`s with a random schedule over the mesh axes and a small budget.
- `goal_texts()`: `(text, goal)`: valid goal files and the Goal each one means.
- `bad_goal_texts()`: goal files with one mistake each (a typo in a keyword, a wrong unit,
  a missing brace, an unknown axis, a dim out of range, a bad strategy, ...).

Everything shrinks towards small, readable examples: a generated function's repr is the
list of its steps (`Forward(dense x[8,16]: dense(8) -> act(tanh) -> out y)`).

One file per section: meshes, programs, specs, goals, goal_files, bad_goal_files.
"""

from partir.testing.strategies.bad_goal_files import BAD_GOAL_KINDS, bad_goal_texts
from partir.testing.strategies.goal_files import goal_texts
from partir.testing.strategies.goals import goals, schedules
from partir.testing.strategies.meshes import AXIS_NAMES, MESH_SIZES, meshes
from partir.testing.strategies.programs import (
    Forward,
    GeneratedProgram,
    Recipe,
    Step,
    TrainStep,
    programs,
)
from partir.testing.strategies.specs import input_shapes, shardings, specs

__all__ = [
    "AXIS_NAMES",
    "BAD_GOAL_KINDS",
    "MESH_SIZES",
    "Forward",
    "GeneratedProgram",
    "Recipe",
    "Step",
    "TrainStep",
    "bad_goal_texts",
    "goal_texts",
    "goals",
    "input_shapes",
    "meshes",
    "programs",
    "schedules",
    "shardings",
    "specs",
]
