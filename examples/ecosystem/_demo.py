"""What every recipe's script does once it has a train step: plan it on 8 fake CPU
devices, check the plan, run it sharded beside the unsharded step, print the rules."""

from collections.abc import Callable
from typing import Any

import jax

import partir
from partir import strategies as st


def nest_paths(flat: dict[str, Any]) -> dict:
    """{"dense/kernel": x} -> {"dense": {"kernel": x}}: a library's variable paths as a tree."""
    out: dict = {}
    for path, x in flat.items():
        *outer, leaf = path.split("/")
        node = out
        for key in outer:
            node = node.setdefault(key, {})
        node[leaf] = x
    return out


def get_path(tree: dict, path: str) -> Any:
    """The leaf of `nest_paths`'s tree at a slash-separated path."""
    for key in path.split("/"):
        tree = tree[key]
    return tree


def goal_for(train_step: Callable, args: tuple) -> partir.Goal:
    return partir.Goal(
        train_step,
        args,
        mesh={"batch": 2, "model": 4},
        device="tpu-v4",
        schedule=[st.batch("batch"), st.megatron("model")],
        search=partir.Search(seed=0, episodes=40),
    )


def plan_and_compare(
    train_step_and_args: Callable[[], tuple],
    moments: Callable[[Any], Any] = lambda s: s[0].mu,
) -> None:
    """`train_step_and_args()` is called once the fake devices are set up;
    `moments(optimizer state)` picks Adam's first moments, compared sharded/unsharded."""
    jax.config.update("jax_num_cpu_devices", 8)  # fake devices: a script may, a library not
    from partir.testing import check_plan, max_relative_error

    train_step, args = train_step_and_args()
    goal = goal_for(train_step, args)
    plan = partir.solve(goal)
    check_plan(goal, plan)
    print(plan)
    got, want = plan.jit()(*args), jax.jit(train_step)(*args)
    print("loss sharded / unsharded:", float(got[2]["loss"]), float(want[2]["loss"]))
    print(
        "max relative error of the gradients (Adam's mu):",
        max_relative_error(moments(got[1]), moments(want[1])),
    )
    print(plan.rules_source())
