"""Bad goal files: valid goal files with one mistake each, by kind (`BAD_GOAL_KINDS`)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from partir.dsl.parser import STATEMENTS
from partir.strategies import CATALOG
from partir.testing.strategies.goal_files import PROGRAMS, GoalFile, Style, goal_files, styles

# the goal language's words: its statements' keywords and the words inside them
_KEYWORDS = (*STATEMENTS, "dim", "on")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


@st.composite
def _typo(draw, word: str, avoid: Sequence[str]) -> str:
    """`word` with one slip of the finger, never one of `avoid` (nor `word`)."""
    i = draw(st.integers(0, len(word) - 1))
    how = draw(st.sampled_from(("swap", "drop", "double", "replace", "insert")))
    c = draw(st.sampled_from(_LETTERS))
    if how == "swap" and i + 1 < len(word):
        out = word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    elif how == "drop" and len(word) > 1:
        out = word[:i] + word[i + 1 :]
    elif how == "double":
        out = word[: i + 1] + word[i:]
    elif how == "replace":
        out = word[:i] + c + word[i + 1 :]
    else:
        out = word[:i] + c + word[i:]
    if out == word or out in avoid or not out or not (out[0].isalpha() or out[0] == "_"):
        out = word + "q"
    return out


def _kind_keyword(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    key = draw(st.sampled_from(sorted(statements)))
    text = statements[key]
    word = text.split(None, 1)[0] if not text.startswith(("tile", "replicate")) else None
    if word is None:
        choices = ["tile", "dim", "on"] if text.startswith("tile") else ["replicate", "on"]
        word = draw(st.sampled_from(choices))
    bad = draw(_typo(word, _KEYWORDS))
    if word in ("dim", "on"):
        # the word after the path: replace its last occurrence before the axis name
        head, sep, tail = text.rpartition(f"{style.space}{word}{style.space}")
        text = head + style.space + bad + style.space + tail if sep else text
    else:
        text = bad + text[len(word) :]
    statements[key] = text
    return gf.render(style, statements)


def _kind_unit(draw, gf: GoalFile, style: Style) -> str:
    where = draw(st.sampled_from(("memory", "link", "field")))
    if where == "memory":
        text = draw(
            st.sampled_from(
                ("32Gib", "32GHz", "32gb", "2us", "50G/s", "275T", "32 GiB", "1.5XB", "8b")
            )
        )
        gf.memory = (text, 0)
        return gf.render(style)
    statements = gf.statements(style)
    axis = draw(st.sampled_from(sorted(gf.mesh)))
    device = f'"{gf.device}" ' if gf.device else '"cpu" '
    if where == "link":
        bad = draw(st.sampled_from(("20GiB", "20Gbps", "20", "2us", "20G")))
        if bad == "20":  # a plain number is bytes/s: fine; make it an unknown unit instead
            bad = "20gbit/s"
        field = f"link {axis} {bad}"
    else:
        field = draw(
            st.sampled_from(
                ("hbm 32G/s", "hbm 2ms", "flops 32GiB", "hbm_bandwidth 1.2TiB", "latency 2GB")
            )
        )
    statements["device"] = f"device {device}{{ {field} }}"
    return gf.render(style, statements)


def _kind_brace(draw, gf: GoalFile, style: Style) -> str:
    if not gf.blocks and not gf.links:
        gf.blocks.append((next(iter(gf.mesh)), [("batch", {})]))
    statements = gf.statements(style)
    keys = [k for k, t in statements.items() if "{" in t or "(" in t]
    key = draw(st.sampled_from(sorted(keys)))
    text = statements[key]
    marks = [m for m in "{}()" if m in text]
    mark = draw(st.sampled_from(marks))
    i = text.index(mark) if mark in "{(" else text.rindex(mark)
    statements[key] = text[:i] + text[i + 1 :]
    return gf.render(style, statements)


def _unknown_axis(draw, gf: GoalFile) -> str:
    near = [draw(_typo(a, list(gf.mesh) + list(_KEYWORDS))) for a in gf.mesh]
    name = draw(st.sampled_from(near + ["modle", "batchh", "zz", "pipeline"]))
    return name if name not in gf.mesh else name + "q"


def _kind_axis(draw, gf: GoalFile, style: Style) -> str:
    bad = _unknown_axis(draw, gf)
    where = draw(st.sampled_from(("block", "tile", "replicate", "link")))
    if where == "block":
        if gf.blocks:
            i = draw(st.integers(0, len(gf.blocks) - 1))
            gf.blocks[i] = (bad, gf.blocks[i][1])
        else:
            gf.blocks.append((bad, [("batch", {})]))
    elif where == "link":
        gf.device = gf.device or "cpu"
        gf.links[bad] = ("20G/s", 20e9)
    elif where == "tile":
        gf.manual.append(("tile", "params/embed", 0, bad))
    else:
        gf.manual.append(("replicate", "params/embed", bad))
    return gf.render(style)


def _kind_dim(draw, gf: GoalFile, style: Style) -> str:
    shapes = gf.shapes()
    path = draw(st.sampled_from(sorted(shapes)))
    dim = draw(st.sampled_from((len(shapes[path]), len(shapes[path]) + 1, 9, -1)))
    gf.manual.append(("tile", path, dim, draw(st.sampled_from(sorted(gf.mesh)))))
    return gf.render(style)


def _kind_strategy(draw, gf: GoalFile, style: Style) -> str:
    if not gf.blocks:
        gf.blocks.append((next(iter(gf.mesh)), []))
    i = draw(st.integers(0, len(gf.blocks) - 1))
    axis, strategies = gf.blocks[i]
    strategies = list(strategies)
    how = draw(st.sampled_from(("name", "args", "twice")))
    if how == "name" or (how == "twice" and not strategies):
        good = draw(st.sampled_from(sorted(CATALOG)))
        strategies.append((draw(_typo(good, [*CATALOG, "tile", "replicate"])), {}))
    elif how == "args":
        strategies.append(
            draw(
                st.sampled_from(
                    (
                        ("zero", {"stage": "4"}),
                        ("zero", {"stage": "0"}),
                        ("zero", {"stages": "2"}),
                        ("zero", {"stage": '"two"'}),
                        ("batch", {"inputs": "3"}),
                        ("batch", {"inputs": "[]"}),
                        ("batch", {"inputs": '"nothing/*"'}),
                        ("megatron", {"k": "1"}),
                        ("auto", {"axis": '"x"'}),
                    )
                )
            )
        )
    else:
        strategies.append(strategies[0])
    gf.blocks[i] = (axis, strategies)
    return gf.render(style)


def _kind_mesh(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    axes = list(gf.mesh)
    how = draw(st.sampled_from(("size", "twice", "comma", "empty")))
    if how == "size":
        bad = draw(st.sampled_from(("0", "-2", "2.5", "1e3", "2x", "two", "2GiB")))
        k = draw(st.integers(0, len(axes) - 1))
        parts = [f"{a}={bad if j == k else n}" for j, (a, n) in enumerate(gf.mesh.items())]
        statements["mesh"] = "mesh " + ", ".join(parts)
    elif how == "twice":
        statements["mesh"] += f", {axes[0]}=2"
    elif how == "comma":
        statements["mesh"] = "mesh " + ", ".join(f"{a}={n}" for a, n in gf.mesh.items()) + " zq=2"
    else:
        statements["mesh"] = "mesh"
    return gf.render(style, statements)


def _kind_duplicate(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    singles = [k for k in statements if ":" not in k]
    key = draw(st.sampled_from(sorted(singles)))
    if gf.blocks and draw(st.booleans()):
        key = "axis:0"
    statements[key + ":again"] = statements[key]
    gf.order = gf.order + [key + ":again"]
    return gf.render(style, statements)


def _kind_missing(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    del statements[draw(st.sampled_from(("program", "inputs", "mesh")))]
    return gf.render(style, statements)


def _kind_value(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    key, text = draw(
        st.sampled_from(
            (
                ("objective", "objective speed"),
                ("objective", "objective tim"),
                ("prune", "prune cpsta"),
                ("prune", "prune yes"),
                ("search", "search mtcs(seed=1)"),
                ("search", "search mcts(episdoes=20)"),
                ("search", "search mcts(episodes=0)"),
                ("search", "search mcts(seed=1.5)"),
                ("search", 'search mcts(rollout="best")'),
                ("search", "search mcts(uct_c=-1)"),
                ("search", "search mcts(seconds=-5)"),
                ("search", "search mcts(prune=true)"),
                ("search", "search mcts(seed=1, seed=2)"),
                ("search", "search mcts(20)"),
                ("device", 'device "tpu-v9"'),
                ("device", 'device "cpu" { hmb 32GiB }'),
                ("device", "device { hbm 32GiB }"),
                ("device", 'device "cpu" { node_size 2.5 }'),
                ("memory", "memory <= 0"),
                ("memory", "memory <= -1GiB"),
                ("inputs", f'inputs "{PROGRAMS}:example_args"(batch=yes)'),
            )
        )
    )
    statements[key] = text
    return gf.render(style, statements)


def _kind_string(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    key = draw(st.sampled_from(("program", "inputs")))
    how = draw(st.sampled_from(("unterminated", "target")))
    text = statements[key]
    if how == "unterminated":
        i = text.index('"', text.index('"') + 1)
        statements[key] = text[:i] + text[i + 1 :]
    else:
        target = draw(
            st.sampled_from(
                (PROGRAMS, f"{PROGRAMS}:", f":{gf.program}", f"{PROGRAMS}:{gf.program}:x", "a b:c")
            )
        )
        start = text.index('"')
        end = text.index('"', start + 1)
        statements[key] = text[: start + 1] + target + text[end:]
    return gf.render(style, statements)


def _kind_path(draw, gf: GoalFile, style: Style) -> str:
    path = draw(
        st.sampled_from(
            ("params/embd", "params/layers/9/mlp/w_in", "", "/", "nothing/**", "param/embed")
        )
    )
    axis = draw(st.sampled_from(sorted(gf.mesh)))
    gf.manual.append(("tile", path, 0, axis) if draw(st.booleans()) else ("replicate", path, axis))
    return gf.render(style)


def _kind_import(draw, gf: GoalFile, style: Style) -> str:
    statements = gf.statements(style)
    key, text = draw(
        st.sampled_from(
            (
                ("program", f'program "{PROGRAMS}:train_stp"'),
                ("program", f'program "{PROGRAMS}:OPTIMIZER"'),
                ("program", 'program "partir.testing._no_such_module:train_step"'),
                ("program", 'program "no_such_file.py:train_step"'),
                ("inputs", f'inputs "{PROGRAMS}:example_args"(batch=0)'),
                ("inputs", f'inputs "{PROGRAMS}:example_args"(batchsize=8)'),
                ("inputs", f'inputs "{PROGRAMS}:loss_fn"'),
            )
        )
    )
    if key == "program" and "train_stp" not in text and draw(st.booleans()):
        # a program that cannot take what the inputs function returns
        other = "forward" if gf.program == "train_step" else "train_step"
        text = f'program "{PROGRAMS}:{other}"'
    statements[key] = text
    return gf.render(style, statements)


def _kind_divide(draw, gf: GoalFile, style: Style) -> str:
    axis = draw(st.sampled_from(sorted(gf.mesh)))
    gf.mesh[axis] = draw(st.sampled_from((3, 5, 7)))  # every dim is a power of 2
    shapes = gf.shapes()
    path = draw(st.sampled_from(sorted(p for p, s in shapes.items() if s)))
    gf.manual.append(("tile", path, draw(st.integers(0, len(shapes[path]) - 1)), axis))
    return gf.render(style)


_MUTATIONS = {
    "keyword": _kind_keyword,
    "unit": _kind_unit,
    "brace": _kind_brace,
    "axis": _kind_axis,
    "dim": _kind_dim,
    "strategy": _kind_strategy,
    "mesh": _kind_mesh,
    "duplicate": _kind_duplicate,
    "missing": _kind_missing,
    "value": _kind_value,
    "string": _kind_string,
    "path": _kind_path,
    "import": _kind_import,
    "divide": _kind_divide,
}
BAD_GOAL_KINDS = tuple(_MUTATIONS)


def bad_goal_texts(kinds: Sequence[str] | None = None) -> st.SearchStrategy[str]:
    """Goal files with one mistake each, made from a valid `goal_texts()` file: a typo in a
    keyword, a wrong or unknown unit, a missing brace or parenthesis, an unknown mesh
    axis, a tile dim out of range, a bad strategy name or argument, a bad mesh, a
    duplicated or missing statement, a bad value, a bad string, a path that matches no
    input, an entry point that cannot be imported or called, an axis that does not
    divide. `kinds` picks some of `BAD_GOAL_KINDS`. Every one of them must make
    `partir.load_goal_text` raise `GoalError` (and `partir check` exit 2)."""
    chosen = tuple(BAD_GOAL_KINDS if kinds is None else kinds)
    unknown = set(chosen) - set(_MUTATIONS)
    if unknown or not chosen:
        raise ValueError(f"unknown kinds {sorted(unknown)}; choose from {BAD_GOAL_KINDS}")

    @st.composite
    def draw_bad(draw) -> str:
        gf = draw(goal_files())
        style = draw(styles())
        kind = draw(st.sampled_from(chosen))
        return _MUTATIONS[kind](draw, gf, style)

    return draw_bad()
