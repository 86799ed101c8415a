"""Goal files (partir/dsl): DESIGN's example, compilation, every check's message and place,
units, comments, and fuzzing (garbage and mutations parse or raise GoalError, nothing else)."""

from __future__ import annotations

import dataclasses
import glob
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partir import strategies as S
from partir.dsl import GoalError, GoalSpec, load_goal, load_goal_text, parse
from partir.dsl.errors import Pos
from partir.goal import Goal, Search
from partir.ir.devices import CATALOG as DEVICES
from partir.ir.units import UnitError, read

HERE = os.path.dirname(os.path.abspath(__file__))
GOALS = os.path.join(HERE, "data", "goals")

# The example of DESIGN.md, section "The goal file", exactly as written there.
DESIGN_EXAMPLE = """\
# GPT-style language model, training step, 64 chips
program "partir.models.gpt:train_step"
inputs  "partir.models.gpt:example_args"(layers=24, d_model=2048, heads=16, seq=1024, batch=256, vocab=32000)
mesh    batch=8, model=8
device  "tpu-v4"
memory  <= 32GiB
objective time

axis batch {
    batch
    zero(stage=3)
}
axis model {
    megatron
}

tile      "params/embed" dim 0 on model
replicate "params/**/scale" on model

search mcts(seconds=60, seed=0)
prune  cpsat
"""

# A goal on the tiny model of tests/data/goals/tiny_model.py; statements are appended.
TINY = """\
program "tiny_model.py:train_step"
inputs  "tiny_model.py:example_args"(layers=2, d_model=32, vocab=64, batch=8)
mesh    batch=4, model=2
"""
TINY_LINES = TINY.count("\n")

ERROR_RE = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.+)$")


def check_form(err: GoalError, text: str, filename: str) -> None:
    """`FILE:LINE:COL: error: MESSAGE`, then the source line, then a caret under COL."""
    lines = str(err).split("\n")
    assert len(lines) == 3, str(err)
    m = ERROR_RE.match(lines[0])
    assert m, lines[0]
    assert m["file"] == filename == err.filename
    assert int(m["line"]) == err.line and int(m["col"]) == err.column
    assert m["msg"] == err.message
    source = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # CR alone ends a line
    want = source[err.line - 1] if err.line <= len(source) else ""
    assert lines[1] == want
    assert lines[2].endswith("^") and len(lines[2]) == err.column
    assert lines[2][:-1].strip(" \t") == ""
    assert 1 <= err.column <= len(want) + 1


def parse_error(text: str, filename: str = "goal.partir") -> GoalError:
    with pytest.raises(GoalError) as info:
        parse(text, filename)
    check_form(info.value, text, filename)
    return info.value


def load_error(text: str, filename: str = "goal.partir") -> GoalError:
    with pytest.raises(GoalError) as info:
        load_goal_text(text, filename, base_dir=GOALS)
    check_form(info.value, text, filename)
    return info.value


def in_tail(tail: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """(line, column) of the nth `needle` of `tail`, in the text TINY + tail."""
    line, col = at(tail, needle, nth)
    return TINY_LINES + line, col


def at(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, column) of the nth occurrence of `needle`."""
    i = -1
    for _ in range(nth + 1):
        i = text.index(needle, i + 1)
    line = text.count("\n", 0, i) + 1
    return line, i - (text.rfind("\n", 0, i) + 1) + 1


# ------------------------------------------------------------------------------ DESIGN


def test_design_example_parses_as_written():
    spec = parse(DESIGN_EXAMPLE, "gpt.partir")
    assert isinstance(spec, GoalSpec)
    assert spec.filename == "gpt.partir"
    assert spec.program.target == "partir.models.gpt:train_step"
    assert spec.inputs.target == "partir.models.gpt:example_args"
    assert spec.inputs.args == ()
    assert spec.inputs.kwargs == {
        "layers": 24,
        "d_model": 2048,
        "heads": 16,
        "seq": 1024,
        "batch": 256,
        "vocab": 32000,
    }
    assert spec.mesh == {"batch": 8, "model": 8}
    assert list(spec.mesh) == ["batch", "model"]
    assert spec.device == DEVICES["tpu-v4"]
    assert spec.memory_limit == 32 * 2**30
    assert spec.objective == "time"
    assert [a.name for a in spec.axes] == ["batch", "model"]
    assert spec.schedule == [
        S.batch("batch"),
        S.zero("batch", stage=3),
        S.megatron("model"),
        S.tile("params/embed", 0, "model"),
        S.replicate("params/**/scale", "model"),
    ]
    assert spec.search == Search(seconds=60, seed=0, prune="cpsat")
    assert spec.search.seconds == 60 and spec.search.seed == 0 and spec.search.prune == "cpsat"
    assert spec.notes == []
    # positions are kept for later errors
    assert spec.manual[0].path_pos == Pos(*at(DESIGN_EXAMPLE, '"params/embed"'))
    assert spec.axes[1].strategies[0].pos == Pos(*at(DESIGN_EXAMPLE, "megatron"))


def test_design_example_compiles_against_gpt():
    try:
        from partir.models import gpt  # noqa: F401
    except Exception as e:  # the model zoo is written in parallel
        pytest.skip(f"partir.models.gpt does not import: {e}")
    goal = load_goal_text(DESIGN_EXAMPLE, "gpt.partir")
    assert goal.mesh == {"batch": 8, "model": 8} and goal.memory_limit == 32 * 2**30
    assert goal.device.name == "tpu-v4" and goal.search.prune == "cpsat"
    assert list(goal.schedule) == parse(DESIGN_EXAMPLE).schedule
    assert len(goal.args) == 3


def test_the_same_goal_as_the_python_api():
    goal = load_goal(os.path.join(GOALS, "tiny.partir"))
    assert isinstance(goal, Goal)
    assert goal.filename == os.path.join(GOALS, "tiny.partir")
    assert goal.fn.__name__ == "train_step" and len(goal.args) == 3
    assert goal.mesh == {"batch": 4, "model": 2}
    assert goal.device == DEVICES["cpu"].with_links({"model": 20e9})
    assert goal.device.name == "cpu"
    assert goal.memory_limit == 2**30 and goal.objective == "time"
    assert list(goal.schedule) == [
        S.batch("batch", inputs=["data/*"]),
        S.zero("batch", stage=1),
        S.megatron("model"),
        S.tile("params/embed", 1, "model"),
        S.replicate("params/**/scale", "model"),
    ]
    assert goal.search == Search(seconds=5, episodes=10_000, seed=1, prune=None, rollout="random")
    assert goal.notes == ()
    # the inputs were built by the named function with the given sizes
    params, _, data = goal.args
    assert params["embed"].shape == (64, 32) and data["tokens"].shape == (8, 16)


def test_load_goal_text_resolves_files_from_base_dir(tmp_path):
    goal = load_goal_text(TINY + "axis batch { batch }", "t.partir", base_dir=GOALS)
    assert list(goal.schedule) == [S.batch("batch")]
    assert goal.filename == "t.partir"
    # a goal file elsewhere, naming the model by a relative path
    rel = os.path.relpath(os.path.join(GOALS, "tiny_model.py"), tmp_path)
    path = tmp_path / "g.partir"
    path.write_text(TINY.replace("tiny_model.py", rel) + "axis batch { batch }")
    assert load_goal(path).fn.__name__ == "train_step"
    # load_goal_text looks next to `filename` when no base_dir is given
    text = path.read_text()
    assert load_goal_text(text, filename=str(path)).fn.__name__ == "train_step"


def test_program_traces_with_the_paths_used_by_the_checks():
    goal = load_goal(os.path.join(GOALS, "tiny.partir"))
    assert "params/embed" in goal.program.inputs
    assert "data/tokens" in goal.program.inputs


# ------------------------------------------------------------------------------ syntax


def test_comments_whitespace_and_one_line():
    text = (
        "program 'x'".replace("'", '"').replace("x", "m:f")
        + "   # trailing comment\n\n  # a comment line\n"
        + 'inputs "m:g"( # comment inside a call\n  a = 1 ,\n  b = [1, 2,] ,\n)\n'
        + "mesh batch = 2 ,model=4\n"
        + "axis batch{batch zero ( stage = 1 )}axis model{megatron}\n"
    )
    spec = parse(text)
    assert spec.inputs.kwargs == {"a": 1, "b": [1, 2]}
    assert spec.mesh == {"batch": 2, "model": 4}
    assert spec.schedule == [S.batch("batch"), S.zero("batch", 1), S.megatron("model")]
    one_line = " ".join(
        line.split("#")[0] for line in DESIGN_EXAMPLE.splitlines() if line.split("#")[0]
    )
    assert "\n" not in one_line
    assert parse(one_line) == parse(DESIGN_EXAMPLE)
    crlf = DESIGN_EXAMPLE.replace("\n", "\r\n")
    assert parse(crlf) == parse(DESIGN_EXAMPLE)
    tabs = DESIGN_EXAMPLE.replace("    ", "\t")
    assert parse(tabs) == parse(DESIGN_EXAMPLE)


def test_names_may_be_words_that_are_keywords_elsewhere():
    spec = parse(
        'program "m:f" inputs "m:g"(mesh=1, on=2, true_=3) mesh on=2, dim=2, tile=2 '
        'axis on { batch } axis dim { zero } tile "p" dim 0 on tile'
    )
    assert spec.mesh == {"on": 2, "dim": 2, "tile": 2}
    assert spec.inputs.kwargs == {"mesh": 1, "on": 2, "true_": 3}
    assert spec.schedule == [S.batch("on"), S.zero("dim"), S.tile("p", 0, "tile")]


def test_values_in_calls():
    spec = parse(
        'program "m:f" inputs "m:g"(1, "s", a=-2, b=0.5, c=true, d=false, e=none, '
        'f="x y", g=[1, "a"], h=1e-3, i=32K, j=2GiB, k="a\\"b") mesh a=1'
    )
    assert spec.inputs.args == (1, "s")
    assert spec.inputs.kwargs == {
        "a": -2,
        "b": 0.5,
        "c": True,
        "d": False,
        "e": None,
        "f": "x y",
        "g": [1, "a"],
        "h": 1e-3,
        "i": 32_000,
        "j": 2 * 2**30,
        "k": 'a"b',
    }


def test_optional_parts():
    spec = parse('program "m:f" inputs "m:g" mesh a=2 memory 1GB search mcts prune none')
    assert spec.inputs.kwargs == {} and spec.memory_limit == 10**9
    assert spec.search == Search(prune=None)
    assert spec.device is None and spec.objective == "time"
    assert parse('program "m:f" inputs "m:g"() mesh a=2').search == Search()


# ------------------------------------------------------------------------------ units


@pytest.mark.parametrize(
    "text, value, kind",
    [
        ("8", 8, "number"),
        ("10_000", 10_000, "number"),
        ("0.5", 0.5, "number"),
        ("1e-6", 1e-6, "number"),
        ("512B", 512, "size"),
        ("32GiB", 32 * 2**30, "size"),
        ("1.5KiB", 1536, "size"),
        ("4MiB", 4 * 2**20, "size"),
        ("2TiB", 2 * 2**40, "size"),
        ("500MB", 500 * 10**6, "size"),
        ("32GB", 32 * 10**9, "size"),
        ("1KB", 1000, "size"),
        ("3TB", 3 * 10**12, "size"),
        ("275T", 275e12, "count"),
        ("10K", 10_000, "count"),
        ("3M", 3e6, "count"),
        ("1G", 1e9, "count"),
        ("1.2T/s", 1.2e12, "rate"),
        ("50G/s", 50e9, "rate"),
        ("400M/s", 400e6, "rate"),
        ("5K/s", 5e3, "rate"),
        ("25GB/s", 25e9, "rate"),
        ("1GiB/s", 2**30, "rate"),
        ("2us", 2e-6, "time"),
        ("5ms", 5e-3, "time"),
        ("3s", 3.0, "time"),
        ("100ns", 1e-7, "time"),
    ],
)
def test_units(text, value, kind):
    q = read(text)
    assert q.kind == kind
    assert q.value == pytest.approx(value, rel=1e-12)


def test_unknown_unit_points_at_the_unit():
    with pytest.raises(UnitError, match="unknown unit 'Gib' in '32Gib'; did you mean 'GiB'") as e:
        read("32Gib")
    assert e.value.offset == 2


def test_device_block_and_units():
    text = TINY + (
        "device { hbm 32GiB  flops 275T  hbm_bandwidth 1.2T/s\n"
        "         link batch 50G/s  link model 100G/s  latency 2us }\n"
    )
    d = parse(text).device
    assert d.name == "custom" and d.hbm == 32 * 2**30 and d.flops == 275e12
    assert d.hbm_bandwidth == 1.2e12 and d.latency == pytest.approx(2e-6)
    assert d.links == {"batch": 50e9, "model": 100e9}
    assert d.axis_bandwidths({"batch": 4, "model": 2}) == {"batch": 50e9, "model": 100e9}
    d = parse(
        TINY + "device { hbm 1TB flops 1T/s hbm_bandwidth 1e12 link 10G/s "
        "node_size 4 network_bandwidth 5G/s }"
    ).device
    assert d.link_bandwidth == 10e9 and d.node_size == 4 and d.network_bandwidth == 5e9
    d = parse(TINY + 'device "h100" { hbm 40GB link model 400G/s }').device
    assert d == dataclasses.replace(DEVICES["h100"], hbm=40 * 10**9).with_links({"model": 400e9})


# ------------------------------------------------------------------------------ errors

# (what is appended to TINY, the offending token, expected message) — parse-time checks
PARSE_ERRORS = [
    (
        "axis batch { batch }\naxis modle { megatron }",
        "modle",
        "axis 'modle' is not a mesh axis (the mesh has 'batch' and 'model'); did you mean 'model'?",
    ),
    (
        'tile "params/embed" dim 0 on modle',
        "modle",
        "axis 'modle' is not a mesh axis (the mesh has 'batch' and 'model'); did you mean 'model'?",
    ),
    (
        'replicate "params/embed" on btach',
        "btach",
        "axis 'btach' is not a mesh axis (the mesh has 'batch' and 'model'); did you mean 'batch'?",
    ),
    (
        "axis model {\n    megatorn\n}",
        "megatorn",
        "unknown strategy 'megatorn'; did you mean 'megatron'?",
    ),
    (
        "axis model { tile }",
        "tile",
        "unknown strategy 'tile'; 'tile' is a statement of its own, outside axis blocks",
    ),
    (
        "axis batch { zero(stages=3) }",
        "stages",
        "strategy 'zero' has no argument 'stages'; did you mean 'stage'? (it takes stage)",
    ),
    (
        "axis model { megatron(heads=4) }",
        "heads",
        "strategy 'megatron' has no argument 'heads' (it takes no arguments)",
    ),
    ("axis batch { zero(stage=4) }", "4", "zero stage must be 1, 2 or 3, not 4"),
    ("axis batch { zero(stage=true) }", "true", "zero stage must be 1, 2 or 3, not true"),
    ('axis batch { zero(stage="3") }', '"3"', 'zero stage must be 1, 2 or 3, not "3"'),
    (
        "axis batch { zero(3) }",
        "3",
        "strategy 'zero' takes keyword arguments only, like name=value",
    ),
    (
        "axis batch { batch(inputs=3) }",
        "3",
        'batch inputs is a path glob or a list of them, like inputs="batch/*" '
        'or inputs=["batch/x", "batch/y"]',
    ),
    ("axis batch { zero(stage=1, stage=2) }", "stage", "argument 'stage' is given twice", 1),
    (
        "axis batch { batch zero batch }",
        "batch",
        "'batch' is already in the block of axis 'batch' (line 4)",
        2,
    ),
    (
        "axis batch { batch zero megatron }",
        "megatron",
        "batch tiles the data inputs on axis 'batch' and megatron keeps them whole there; put "
        "data parallelism and megatron on different mesh axes",
    ),
    (
        "axis batch { batch }\naxis batch { zero }",
        "batch",
        "a second block for axis 'batch' (the first is at line 4); put all of its strategies in "
        "one block",
        2,
    ),
    (
        'device "tpu-v3"',
        '"tpu-v3"',
        "unknown device 'tpu-v3'; did you mean 'tpu-v4'? (known devices: "
        "tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, a100-80g, h100, h200, b200, cpu)",
    ),
    ("objective speed", "speed", "unknown objective 'speed' (choose time, memory or comm)"),
    (
        "objective tiem",
        "tiem",
        "unknown objective 'tiem'; did you mean 'time'? (choose time, memory or comm)",
    ),
    (
        "search mtcs(seconds=1)",
        "mtcs",
        "unknown search 'mtcs'; did you mean 'mcts'? (the search is mcts)",
    ),
    (
        "search mcts(secs=1)",
        "secs",
        "search has no argument 'secs'; did you mean 'seconds'? (it takes seconds, episodes, "
        "seed, rollout, patience, uct_c or proxy)",
    ),
    ("search mcts(seconds=0)", "0", "seconds must be a positive number, not 0"),
    ("search mcts(episodes=1.5)", "1.5", "episodes must be a positive integer, not 1.5"),
    (
        'search mcts(rollout="gredy")',
        '"gredy"',
        "rollout must be 'greedy' or 'random', not \"gredy\"; did you mean 'greedy'?",
    ),
    (
        "search mcts(rollout=greedy)",
        "greedy",
        "'greedy' is not a value: write a number, a \"string\", true, false or none; "
        'to pass it as a string, write "greedy"',
    ),
    (
        "search mcts(prune=true)",
        "prune",
        "prune is a statement of its own: prune cpsat, or prune none",
    ),
    (
        "prune cpsta",
        "cpsta",
        "unknown pruner 'cpsta'; did you mean 'cpsat'? (write prune cpsat, or prune none)",
    ),
    ("memory <= 32G", "32G", "memory takes a size, like 32GiB; '32G' is a count"),
    ("memory <= 32Gib", "Gib", "unknown unit 'Gib' in '32Gib'; did you mean 'GiB'?"),
    ("memory <= 32gb", "gb", "unknown unit 'gb' in '32gb'; did you mean 'GB'?"),
    ("memory <= 0", "0", "memory must be a positive size, not '0'"),
    (
        "memory <= 1.5",
        "1.5",
        "memory must be a whole number of bytes, not '1.5'; write a size like 1.5GiB",
    ),
    (
        'tile "params/embed" dim -1 on model',
        "-1",
        "a tile dim is a dimension index 0, 1, ..., not '-1'",
    ),
    ('tile "" dim 0 on model', '""', 'an empty path; write an input path like "params/embed"'),
    ("mesh a=2", "mesh", "a second 'mesh' statement; a goal has one (the first is at line 3)"),
    (
        'program "m:f"',
        "program",
        "a second 'program' statement; a goal has one (the first is at line 1)",
    ),
    (
        'device "cpu"\ndevice "h100"',
        "device",
        "a second 'device' statement; a goal has one (the first is at line 4)",
        1,
    ),
    (
        "prune none prune cpsat",
        "prune",
        "a second 'prune' statement; a goal has one (the first is at line 4)",
        1,
    ),
    (
        "device { hbm 1GB flops 1T }",
        "device",
        "the device block gives no 'hbm_bandwidth'; give them, or start from a catalog device: "
        'device "tpu-v4" { link model 100G/s }',
    ),
    (
        "device { hbm 1GB flops 1T hbm_bandwidth 1T/s link batch 1G/s }",
        "device",
        "the device block gives no link bandwidth for mesh axis 'model'; add `link model 50G/s`, "
        "or `link 50G/s` for every axis",
    ),
    (
        'device "cpu" { hbm_bandwith 1T/s }',
        "hbm_bandwith",
        "unknown device field 'hbm_bandwith'; did you mean 'hbm_bandwidth'? (a device block "
        "takes: hbm, flops, hbm_bandwidth, link, network_bandwidth, latency, node_size)",
    ),
    (
        'device "cpu" { link modle 1G/s }',
        "modle",
        "link axis 'modle' is not a mesh axis (the mesh has 'batch' and 'model'); "
        "did you mean 'model'?",
    ),
    (
        'device "cpu" { hbm model 1GB }',
        "model",
        "'hbm' takes a value only; a mesh axis name is for 'link'",
    ),
    ('device "cpu" { hbm 1T/s }', "1T/s", "'hbm' takes a size, like 32GiB; '1T/s' is a rate"),
    ('device "cpu" { link model 1GB }', "1GB", "'link' takes a rate, like 50G/s; '1GB' is a size"),
    (
        'device "cpu" { flops 1TB }',
        "1TB",
        "'flops' takes a count or a rate, like 275T; '1TB' is a size",
    ),
    ('device "cpu" { node_size 2.5 }', "2.5", "node_size must be a positive integer, not '2.5'"),
    (
        'device "cpu" { link model 1G/s link model 2G/s }',
        "model",
        "a second 'link model' in the device block",
        1,
    ),
]


@pytest.mark.parametrize("case", PARSE_ERRORS, ids=[c[0][:40] for c in PARSE_ERRORS])
def test_parse_errors(case):
    tail, token, message = case[:3]
    nth = case[3] if len(case) > 3 else 0
    text = TINY + tail
    err = parse_error(text)
    assert err.message == message
    assert (err.line, err.column) == in_tail(tail, token, nth), str(err)


def test_error_text_in_full():
    text = TINY + "axis model {\n    megatorn\n}\n"
    err = parse_error(text, "gpt.partir")
    assert str(err) == (
        "gpt.partir:5:5: error: unknown strategy 'megatorn'; did you mean 'megatron'?\n"
        "    megatorn\n"
        "    ^"
    )
    assert isinstance(err, ValueError)
    assert (err.filename, err.line, err.column) == ("gpt.partir", 5, 5)
    assert err.message == "unknown strategy 'megatorn'; did you mean 'megatron'?"


@pytest.mark.parametrize(
    "mesh, token, message",
    [
        ("mesh a=0", "0", "the size of mesh axis 'a' must be a positive integer, not '0'"),
        ("mesh a=-2", "-2", "the size of mesh axis 'a' must be a positive integer, not '-2'"),
        ("mesh a=2.5", "2.5", "the size of mesh axis 'a' must be a positive integer, not '2.5'"),
        ("mesh a=8K", "8K", "the size of mesh axis 'a' must be a positive integer, not '8K'"),
        ("mesh a=2, b=2, a=4", "a=4", "mesh axis 'a' is given twice (first at column 6)"),
    ],
)
def test_mesh_errors(mesh, token, message):
    text = f'program "m:f"\ninputs "m:g"\n{mesh}\n'
    err = parse_error(text)
    assert err.message == message
    assert (err.line, err.column) == at(text, token)


def test_missing_statements():
    err = parse_error('# no program here\ninputs "m:g"\nmesh a=2\n')
    assert err.message == (
        "the goal has no 'program' statement; add one like: program \"module:function\""
    )
    assert (err.line, err.column) == (1, 1)
    err = parse_error('program "m:f" inputs "m:g"')
    assert err.message == "the goal has no 'mesh' statement; add one like: mesh batch=8, model=8"
    err = parse_error("")
    assert "no 'program' statement" in err.message


@pytest.mark.parametrize(
    "target, message",
    [
        (
            "partir.models.gpt",
            'program names a function as "module:function" or '
            '"file.py:function", not "partir.models.gpt"',
        ),
        ("m:", 'program names a function as "module:function" or "file.py:function", not "m:"'),
        (
            "a b:f",
            'program names a function as "module:function" or "file.py:function", not "a b:f"',
        ),
    ],
)
def test_entry_point_form(target, message):
    text = f'program "{target}"\ninputs "m:g"\nmesh a=2\n'
    err = parse_error(text)
    assert err.message == message and (err.line, err.column) == (1, 9)


def test_memory_in_bytes_may_be_written_with_an_exponent():
    assert parse('program "m:f" inputs "m:g" mesh a=2 memory <= 1e9').memory_limit == 10**9


def test_notes_not_warnings():
    spec = parse(
        'program "m:f" inputs "m:g"\nmesh batch=2, model=4\naxis batch { batch }\n'
        "memory <= 64GiB\n",
        "n.partir",
    )
    assert spec.notes == [
        "n.partir:2:15: note: mesh axis 'model' has no axis block; nothing is sharded on it "
        "(it stays replicated). Add `axis model { ... }` to use it.",
        "n.partir:4:1: note: the memory limit (64 GiB) is larger than the HBM of device 'cpu' "
        "(16 GiB); plans are held to the limit as written, which the device cannot hold",
    ]
    spec = parse('program "m:f" inputs "m:g" mesh a=2 device "tpu-v4" memory <= 32GiB')
    assert not any("HBM" in n for n in spec.notes)
    # a mesh axis used only by a manual statement has no note
    spec = parse('program "m:f" inputs "m:g" mesh a=2 tile "x" dim 0 on a')
    assert spec.notes == []
    goal = load_goal_text(TINY + "axis batch { batch }", base_dir=GOALS)
    assert len(goal.notes) == 1 and "mesh axis 'model' has no axis block" in goal.notes[0]
    # a device but no memory statement: its HBM is not a limit, and the note says so
    spec = parse(
        'program "m:f" inputs "m:g" mesh a=2 tile "x" dim 0 on a\ndevice "h100"', "h.partir"
    )
    assert spec.notes == [
        "h.partir:2:1: note: no memory statement: plans are not held to a memory limit, not "
        "even the HBM of device 'h100' (80 GB); add `memory <= 80GB` to hold them to it"
    ]


# ---------------------------------------------------------------------- syntax errors

SYNTAX_ERRORS = [
    ('progam "x"', "progam", "unknown statement 'progam'; did you mean 'program'?"),
    ("axisbatch { batch }", "axisbatch", "unknown statement 'axisbatch'; did you mean 'axis'?"),
    (
        "memory 32 GiB",
        "GiB",
        "unknown statement 'GiB'; a unit goes right after its number, with no space: 32GiB",
    ),
    (
        "zzz 3",
        "zzz",
        "unknown statement 'zzz'; a statement starts with one of: program, inputs, mesh, "
        "device, memory, objective, axis, tile, replicate, search, prune, constraints",
    ),
    (
        "axis batch {\n    batch\n",
        None,
        "unexpected end of file; expected '(', '}' or a name to close the block opened at line 4",
    ),
    (
        'axis batch { batch\ntile "p" dim 0 on model',
        '"p"',
        "unexpected string \"p\"; expected '(', '}' or a name (is the block opened at line 4 "
        "closed?)",
    ),
    (
        "axis batch { zero(stage=3 }",
        "}",
        "unexpected '}'; expected ')' or ',' (arguments are written name=value, separated "
        'by commas: f(a=1, b="x"))',
    ),
    (
        'tile "params/embed" dim 0 model',
        "model",
        "unexpected name 'model'; expected 'on' (tile is written: tile \"PATH\" dim N on AXIS)",
    ),
    (
        "tile params dim 0 on model",
        "params",
        'unexpected name \'params\'; expected a "string" (tile is written: tile "PATH" dim N '
        "on AXIS)",
    ),
    (
        'replicate "p" model',
        "model",
        "unexpected name 'model'; expected 'on' (replicate is written: replicate \"PATH\" on AXIS)",
    ),
    (
        "memory < 32GiB",
        "<",
        "unexpected character '<'; expected '<=' or a number (memory is written: memory <= 32GiB)",
    ),
    (
        'objective "time"',
        '"time"',
        'unexpected string "time"; expected a name (objective is written: objective time (or '
        "memory, or comm))",
    ),
    (
        'tile "params/embed dim 0 on model',
        '"params',
        "unterminated string: close it with '\"' on the same line",
    ),
    ("axis batch { batch } }", "}", "unexpected '}'; expected a statement", 1),
    (
        "axis batch { batch ; }",
        ";",
        "unexpected character ';'; expected '(', '}' or a name (an axis block is written: "
        "axis NAME { strategy  strategy(name=value) ... })",
    ),
    (
        "search mcts(seconds=60",
        None,
        "unexpected end of file; expected ')' or ',' (arguments are written name=value, "
        'separated by commas: f(a=1, b="x"))',
    ),
]


@pytest.mark.parametrize("case", SYNTAX_ERRORS, ids=[c[0][:40] for c in SYNTAX_ERRORS])
def test_syntax_errors(case):
    tail, token, message = case[:3]
    nth = case[3] if len(case) > 3 else 0
    text = TINY + tail
    err = parse_error(text)
    assert err.message == message
    if token is None:  # end of file: just after the last token
        last = text.rstrip()
        assert (err.line, err.column) == (last.count("\n") + 1, len(last.split("\n")[-1]) + 1)
    else:
        assert (err.line, err.column) == in_tail(tail, token, nth), str(err)


def test_missing_comma_in_mesh():
    text = 'program "m:f"\ninputs "m:g"\nmesh batch=8 model=8\n'
    err = parse_error(text)
    assert err.message == "expected ',' before mesh axis 'model'"
    assert (err.line, err.column) == (3, 14)


def test_syntax_error_in_the_first_statement():
    err = parse_error('tile "p" dim 0 b\nprogram "m:f"')
    assert err.message == (
        "unexpected name 'b'; expected 'on' (tile is written: tile \"PATH\" dim N on AXIS)"
    )
    assert (err.line, err.column) == (1, 16)


# ---------------------------------------------------------------- compile-time errors

COMPILE_ERRORS = [
    (
        'tile "params/embd" dim 0 on model',
        '"params/embd"',
        "no input matches 'params/embd'; did you mean 'params/embed'?",
    ),
    (
        'tile "weights/**" dim 0 on model',
        '"weights/**"',
        "no input matches 'weights/**' (inputs look like 'params/embed', "
        "'params/layers/0/mlp/w_in', 'params/layers/0/mlp/w_out')",
    ),
    (
        'tile "params/**/scale" dim 1 on model',
        "1",
        "dim 1 is out of range for 'params/layers/0/norm/scale' of shape (32,) (rank 1)",
    ),
    (
        'tile "params/embed" dim 0 on batch',
        "batch",
        "mesh axis 'batch' (size 4) does not divide dim 0 of 'params/embed' (size 63, shape "
        "(63, 32))",
    ),
    (
        'replicate "params/*/scale" on model',
        '"params/*/scale"',
        "no input matches 'params/*/scale'; did you mean 'params/layers/1/norm/scale'?",
    ),
    (
        'axis batch { batch(inputs=["data/tokens", "data/x"]) }',
        "[",
        "no input matches 'data/x' (inputs look like 'params/embed', "
        "'params/layers/0/mlp/w_in', 'params/layers/0/mlp/w_out')",
    ),
]


@pytest.mark.parametrize("case", COMPILE_ERRORS, ids=[c[0][:40] for c in COMPILE_ERRORS])
def test_compile_errors(case):
    tail, token, message = case
    text = TINY.replace("vocab=64", "vocab=63") + tail
    err = load_error(text)
    assert err.message == message
    assert (err.line, err.column) == in_tail(tail, token), str(err)


@pytest.mark.parametrize(
    "tail, message",
    [
        (
            'tile "params/embed" dim 0 on model\ntile "params/embed" dim 1 on model',
            f"'params/embed' is already tiled on 'model' along dim 0 (line {TINY_LINES + 1}); a mesh "
            "axis tiles one dim of an input",
        ),
        (
            'replicate "params/embed" on model\ntile "params/**" dim 1 on model',
            f"'params/embed' is both tiled and replicated on 'model' (the replicate statement is at "
            f"line {TINY_LINES + 1}); keep one of them",
        ),
    ],
)
def test_manual_statements_that_contradict_each_other(tail, message):
    err = load_error(TINY + tail)
    assert err.message == message
    assert (err.line, err.column) == in_tail(tail, "model", nth=1)


ENTRY_ERRORS = [
    (
        'program "partir_no_such_module:f"',
        "partir_no_such_module",
        "cannot import 'partir_no_such_module:f': ModuleNotFoundError: No module named "
        "'partir_no_such_module'",
    ),
    (
        'program "broken_model.py:train_step"',
        "broken_model",
        "cannot import 'broken_model.py:train_step': ModuleNotFoundError: No module named "
        "'partir_no_such_dependency'",
    ),
    (
        'program "missing.py:f"',
        "missing",
        f"cannot import 'missing.py:f': there is no file {os.path.join(GOALS, 'missing.py')}",
    ),
    (
        'program "tiny_model.py:train_stp"',
        "tiny_model",
        "'tiny_model.py' has no attribute 'train_stp'; did you mean 'train_step'?",
    ),
    (
        'program "tiny_model.py:not_a_function"',
        "tiny_model",
        "'tiny_model.py:not_a_function' is not callable: it is a int",
    ),
    (
        'program "partir.models.gpt:train_step.nope"',
        "partir.models.gpt",
        "'partir.models.gpt:train_step' has no attribute 'nope'",
    ),
    (
        'program "os.path:join"',
        "os.path",
        "'os.path:join' is a function of Python's standard library, which defines no model; "
        "name a function of your own code (a goal file runs the functions it names, as a "
        "Python script would)",
    ),
    (
        'inputs "tiny_model.py:jax.numpy.zeros"',
        "tiny_model",
        "tiny_model.py:jax.numpy.zeros() raised TypeError: zeros() missing 1 required "
        "positional argument: 'shape'",
    ),
    (
        'inputs "tiny_model.py:jax.tree_util.tree_map"',
        "tiny_model",
        "tiny_model.py:jax.tree_util.tree_map() raised TypeError: tree_map() missing 2 "
        "required positional arguments: 'f' and 'tree'",
    ),
    (
        'inputs "tiny_model.py:example_args"(layers=0)',
        "tiny_model",
        "tiny_model.py:example_args(layers=0) raised ValueError: layers must be >= 1, got 0",
    ),
    (
        'inputs "tiny_model.py:example_args"(depth=3)',
        "tiny_model",
        "tiny_model.py:example_args(depth=3) raised TypeError: example_args() got an unexpected "
        "keyword argument 'depth'",
    ),
    (
        'inputs "tiny_model.py:returns_dict"',
        "tiny_model",
        "tiny_model.py:returns_dict() returned a dict; it must return the program's arguments "
        "as a tuple, like (params, opt_state, batch)",
    ),
    (
        'program "tiny_model.py:loss_fn"',
        "tiny_model",
        "'tiny_model.py:loss_fn' cannot be called with the 3 arguments that "
        "'tiny_model.py:example_args' returns: too many positional arguments",
    ),
]


@pytest.mark.parametrize("case", ENTRY_ERRORS, ids=[c[0][:40] for c in ENTRY_ERRORS])
def test_entry_point_errors(case):
    replacement, token, message = case
    keyword = replacement.split()[0]
    lines = TINY.splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith(keyword))
    lines[n] = replacement
    text = "\n".join(lines) + "\n"
    err = load_error(text)
    assert err.message == message
    assert (err.line, err.column) == (n + 1, replacement.index('"') + 1), str(err)
    assert "Traceback" not in str(err)


@pytest.mark.parametrize(
    "path",
    sorted(glob.glob(os.path.join(HERE, "..", "examples", "*.partir"))),
    ids=os.path.basename,
)
def test_every_example_goal_loads(path):
    goal = load_goal(path)
    assert goal.schedule and goal.mesh and goal.memory_limit


def test_load_goal_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.partir"
    path.write_text("program 'x'\n")
    with pytest.raises(GoalError) as e:
        load_goal(path)
    assert str(e.value).startswith(f"{path}:1:9: error: unexpected character")
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(GoalError, match="not UTF-8"):
        load_goal(path)


# ------------------------------------------------------------------------------ fuzzing


def assert_parses_or_goal_error(text: str) -> None:
    try:
        parse(text, "fuzz.partir")
    except GoalError as e:
        check_form(e, text, "fuzz.partir")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200))
def test_fuzz_garbage(text):
    assert_parses_or_goal_error(text)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            list('{}()[]=,<"#\n \tabmesh0123456789GiB/s.-_:*')
            + [
                "program ",
                "inputs ",
                "mesh ",
                "axis ",
                "tile ",
                "dim ",
                "on ",
                "device ",
                "memory ",
                "search ",
                "prune ",
                "objective ",
                "replicate ",
                '"m:f"',
                "batch",
            ]
        ),
        max_size=60,
    ).map("".join)
)
def test_fuzz_token_soup(text):
    assert_parses_or_goal_error(text)


TOKEN_RE = re.compile(r'"[^"\n]*"|[A-Za-z_][A-Za-z0-9_]*|[0-9][0-9A-Za-z./]*|\S')


@st.composite
def mutated_example(draw):
    text = DESIGN_EXAMPLE
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "swap"]))
        if op == "swap":
            toks = list(TOKEN_RE.finditer(text))
            i = draw(st.integers(0, len(toks) - 1))
            j = draw(st.integers(0, len(toks) - 1))
            a, b = sorted([toks[i], toks[j]], key=lambda m: m.start())
            if a.start() != b.start():
                text = (
                    text[: a.start()]
                    + b.group()
                    + text[a.end() : b.start()]
                    + a.group()
                    + text[b.end() :]
                )
            continue
        i = draw(st.integers(0, len(text) - 1))
        if op == "delete":
            text = text[:i] + text[i + 1 :]
        elif op == "duplicate":
            text = text[:i] + text[i] + text[i:]
        else:
            text = text[:i] + draw(st.characters(codec="ascii")) + text[i:]
    return text


@settings(max_examples=300, deadline=None)
@given(mutated_example())
def test_fuzz_mutations_of_the_design_example(text):
    assert_parses_or_goal_error(text)


@pytest.mark.parametrize("text", ["32GiB", "1.5TB", "500MB", "1e9", "4096"])
def test_python_and_goal_files_read_sizes_alike(text):
    from partir.goal import parse_bytes

    assert parse_bytes(text) == int(read(text).value)


@pytest.mark.parametrize(
    ("text", "why"),
    [("1.5 TB", "did you mean 'TB'"), ("2us", "is a time, not a size"), ("32gib", "'GiB'")],
)
def test_python_sizes_refused_as_goal_files_refuse_them(text, why):
    from partir.goal import parse_bytes

    with pytest.raises(ValueError, match=why):
        parse_bytes(text)
