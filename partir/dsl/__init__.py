"""Goal files (`*.partir`): grammar, parser, checks, and compilation to `partir.Goal`.

A goal file is code, like a Python script: `partir check`, `solve`, `verify` and
`explain` import the modules it names and call its `inputs` function and its program, so
run only goal files you would run as Python. Its own text is not evaluated (call
arguments are literals), and functions of Python's standard library or builtins are
refused as entry points (no model lives there; `os:system` would run a shell command).
Statements need no separator; `#` starts a comment.

    program "module:function"                 # or "file.py:function", next to the goal file
    inputs  "module:function"(k=v, ...)       # called once; returns the program's args tuple
    mesh    batch=8, model=8                  # axis=size, in order, major first
    mesh    data=?, fsdp=?, tensor=? over 64  # ... or sizes partir chooses (every shape)
    device  "tpu-v4"                          # a catalog device ...
    device  { hbm 32GiB  flops 275T  hbm_bandwidth 1.2T/s  link batch 50G/s }  # ... or a block
    device  "h100" { link model 400G/s }      # ... or a catalog device with some fields changed
    memory  <= 32GiB                          # per-device limit ("<=" may be left out)
    objective time                            # time | memory | comm
    axis batch { batch  zero(stage=3) }       # the strategies on one axis; block order = schedule
    tile      "params/embed" dim 0 on model   # manual decisions (paths may be globs)
    replicate "params/**/scale" on model
    search mcts(seconds=60, seed=0)           # episodes, patience, rollout="greedy"|"random", uct_c, proxy
    prune  cpsat                              # or: prune none
    constraints ignore                        # the program's with_sharding_constraint
                                              # calls: honour (the default) or ignore

Values in calls: numbers (with units), "strings", true, false, none, and [lists] of those;
arguments are `name=value` (`inputs` also takes positional values, passed first).
Units: sizes `B KiB MiB GiB TiB KB MB GB TB`; rates `/s G/s T/s GB/s ...` (bytes per
second); counts `K M G T` (`275T` = 275e12); times `s ms us ns`. A plain number is in base
units (bytes, bytes/s, seconds).

A device block takes `hbm`, `flops`, `hbm_bandwidth`, `link [AXIS]`, `network_bandwidth`,
`latency` and `node_size`. Started from a catalog name, it keeps that device's name and
replaces only the fields it gives (`link AXIS` adds a per-axis link). On its own it is
named "custom" and needs `hbm`, `flops` and `hbm_bandwidth`, and a link bandwidth for each
mesh axis (`link AXIS ...` each, or one `link ...` for all).

`load_goal(path)` / `load_goal_text(text)` return a `partir.Goal`; `parse(text)` returns
a `GoalSpec` (everything checked that needs no import). Every problem is a `GoalError`:

    gpt.partir:10:5: error: unknown strategy 'megatorn'; did you mean 'megatron'?
        megatorn
        ^

Things worth telling that are not errors (a mesh axis with no block, a memory limit above
the device's HBM) go to `Goal.notes` / `GoalSpec.notes`, as `FILE:LINE:COL: note: ...`.
"""

from partir.dsl.checker import parse as parse
from partir.dsl.compiler import compile_spec as compile_spec
from partir.dsl.compiler import load_goal as load_goal
from partir.dsl.compiler import load_goal_text as load_goal_text
from partir.dsl.errors import GoalError as GoalError
from partir.dsl.errors import Pos as Pos
from partir.dsl.goal_spec import AxisSpec as AxisSpec
from partir.dsl.goal_spec import EntryPoint as EntryPoint
from partir.dsl.goal_spec import GoalSpec as GoalSpec
from partir.dsl.goal_spec import ManualSpec as ManualSpec
from partir.dsl.goal_spec import StrategySpec as StrategySpec

__all__ = [
    "AxisSpec",
    "EntryPoint",
    "GoalError",
    "GoalSpec",
    "ManualSpec",
    "Pos",
    "StrategySpec",
    "compile_spec",
    "load_goal",
    "load_goal_text",
    "parse",
]
