"""Goal files: valid goal files, each beside the `partir.Goal` it means, built in Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from partir import strategies as S
from partir.goal import Goal, Search
from partir.ir.devices import CATALOG as DEVICES
from partir.ir.specs import glob_match
from partir.testing import _programs
from partir.testing.strategies.goals import SEARCHED, Manual, compatible, strategy_named
from partir.testing.strategies.meshes import meshes
from partir.testing.strategies.specs import input_shapes

PROGRAMS = "partir.testing._programs"
# sizes and how goal files write them: (text, bytes)
_MEMORY = (
    ("1GiB", 2**30),
    ("512MiB", 2**29),
    ("2GB", 2 * 10**9),
    ("1.5GiB", 3 * 2**29),
    ("1073741824", 2**30),
    ("64KiB", 2**16),
    ("1TiB", 2**40),
    ("800MB", 8 * 10**8),
)
_RATES = (
    ("20G/s", 20e9),
    ("50GB/s", 50e9),
    ("1.5T/s", 1.5e12),
    ("400MB/s", 4e8),
    ("100GiB/s", 100 * 2.0**30),
    ("25000000000", 25e9),
)
# axis names in goal files may be statement keywords or strategy names
_FILE_AXES = ("batch", "model", "data", "x", "y2", "expert", "tile", "on", "dim", "mesh")


@dataclasses.dataclass
class Style:
    space: str = " "  # between tokens
    indent: str = "    "
    inline_blocks: bool = False
    trailing_comma: bool = False
    comments: bool = False
    blank_lines: bool = False
    kw_space: bool = False  # `k = v`


@dataclasses.dataclass
class GoalFile:
    """A goal file as its parts; `render` writes it, `goal` builds the Goal it means."""

    program: str  # "train_step" or "forward"
    sizes: dict[str, int]
    mesh: dict[str, int]
    device: str | None = None
    links: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    memory: tuple[str, int] | None = None
    memory_le: bool = True
    objective: str | None = None
    blocks: list[tuple[str, list[tuple[str, dict[str, str]]]]] = dataclasses.field(
        default_factory=list
    )
    manual: list[tuple] = dataclasses.field(
        default_factory=list
    )  # ("tile", p, d, a) / ("replicate", p, a)
    search: list[tuple[str, str, Any]] | None = None  # (key, text, value)
    prune: str | None = None
    order: list[str] = dataclasses.field(default_factory=list)  # statement keys

    @property
    def inputs(self) -> str:
        return "example_args" if self.program == "train_step" else "forward_args"

    def args(self) -> tuple:
        return getattr(_programs, self.inputs)(**self.sizes)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return input_shapes((getattr(_programs, self.program), self.args()))

    def statements(self, style: Style) -> dict[str, str]:
        """{key: text}: every statement this file has, rendered."""
        sp = style.space
        eq = " = " if style.kw_space else "="

        def call(kwargs: Sequence[tuple[str, str]]) -> str:
            inner = ", ".join(f"{k}{eq}{v}" for k, v in kwargs)
            if style.trailing_comma and kwargs:
                inner += ","
            return f"({inner})"

        out = {
            "program": f'program{sp}"{PROGRAMS}:{self.program}"',
            "inputs": f'inputs{sp}"{PROGRAMS}:{self.inputs}"'
            + (call([(k, str(v)) for k, v in self.sizes.items()]) if self.sizes else ""),
            "mesh": f"mesh{sp}" + ", ".join(f"{a}{eq}{n}" for a, n in self.mesh.items()),
        }
        if self.device is not None or self.links:
            text = "device"
            if self.device is not None:
                text += f'{sp}"{self.device}"'
            if self.links:
                fields = [f"link {a} {rate}" for a, (rate, _) in self.links.items()]
                text += sp + self._block(fields, style)
            out["device"] = text
        if self.memory is not None:
            out["memory"] = f"memory{sp}" + ("<= " if self.memory_le else "") + self.memory[0]
        if self.objective is not None:
            out["objective"] = f"objective{sp}{self.objective}"
        for i, (axis, strategies) in enumerate(self.blocks):
            items = [name + (call(list(kw.items())) if kw else "") for name, kw in strategies]
            out[f"axis:{i}"] = f"axis{sp}{axis}{sp}" + self._block(items, style)
        for i, m in enumerate(self.manual):
            if m[0] == "tile":
                out[f"manual:{i}"] = f'tile{sp}"{m[1]}"{sp}dim{sp}{m[2]}{sp}on{sp}{m[3]}'
            else:
                out[f"manual:{i}"] = f'replicate{sp}"{m[1]}"{sp}on{sp}{m[2]}'
        if self.search is not None:
            out["search"] = f"search{sp}mcts" + (
                call([(k, t) for k, t, _ in self.search]) if self.search else ""
            )
        if self.prune is not None:
            out["prune"] = f"prune{sp}{self.prune}"
        return out

    @staticmethod
    def _block(items: Sequence[str], style: Style) -> str:
        if style.inline_blocks or not items:
            return "{ " + "  ".join(items) + (" }" if items else "}")
        return "{\n" + "".join(f"{style.indent}{i}\n" for i in items) + "}"

    def render(self, style: Style, statements: Mapping[str, str] | None = None) -> str:
        statements = dict(statements if statements is not None else self.statements(style))
        lines = ["# a goal file written by partir.testing.goal_texts"] if style.comments else []
        keys = [k for k in self.order if k in statements]
        keys += [k for k in statements if k not in keys]
        for k in keys:
            text = statements[k]
            if style.comments and "\n" not in text:
                text += f"   # {k.split(':')[0]}"
            lines.append(text)
            if style.blank_lines:
                lines.append("")
        return "\n".join(lines) + "\n"

    def goal(self) -> Goal:
        device: Any = DEVICES[self.device or "cpu"]
        if self.links:
            device = device.with_links({a: v for a, (_, v) in self.links.items()})
        schedule: list[S.Strategy] = []
        for axis, strategies in self.blocks:
            for name, kw in strategies:
                if name == "zero":
                    schedule.append(S.zero(axis, stage=int(kw.get("stage", "3"))))
                elif name == "batch" and "inputs" in kw:
                    schedule.append(S.batch(axis, inputs=[kw["inputs"].strip('"')]))
                else:
                    schedule.append(strategy_named(name, axis))
        for t in self.manual:
            schedule.append(S.tile(t[1], t[2], t[3]) if t[0] == "tile" else S.replicate(t[1], t[2]))
        search = Search(**{k: v for k, _, v in self.search or ()}, prune=self.prune_value)
        return Goal(
            getattr(_programs, self.program),
            self.args(),
            self.mesh,
            device=device,
            memory_limit=self.memory[1] if self.memory else None,
            objective=self.objective or "time",
            schedule=schedule,
            search=search,
            filename="<text>",
        )

    @property
    def prune_value(self) -> str | None:
        return None if self.prune == "none" else "cpsat"


@st.composite
def styles(draw) -> Style:
    return Style(
        space=draw(st.sampled_from((" ", "  ", "\t"))),
        indent=draw(st.sampled_from(("    ", "\t", " "))),
        inline_blocks=draw(st.booleans()),
        trailing_comma=draw(st.booleans()),
        comments=draw(st.booleans()),
        blank_lines=draw(st.booleans()),
        kw_space=draw(st.booleans()),
    )


@st.composite
def goal_files(draw) -> GoalFile:
    program = draw(st.sampled_from(("train_step", "forward")))
    sizes: dict[str, int] = {}
    for key, choices in (
        ("batch", (8, 4, 16)),
        ("width", (16, 8, 32)),
        ("layers", (2, 1, 3)),
        ("vocab", (32, 16)),
        ("seq", (4, 2, 8)),
    ):
        if draw(st.booleans()):
            sizes[key] = draw(st.sampled_from(choices))
    mesh = draw(meshes(max_axes=3, max_devices=64, names=_FILE_AXES))
    gf = GoalFile(program, sizes, mesh)
    if draw(st.booleans()):
        gf.device = draw(st.sampled_from(sorted(DEVICES)))
        if draw(st.booleans()):
            for axis in draw(st.lists(st.sampled_from(sorted(mesh)), max_size=2, unique=True)):
                gf.links[axis] = draw(st.sampled_from(_RATES))
    if draw(st.booleans()):
        gf.memory = draw(st.sampled_from(_MEMORY))
        gf.memory_le = draw(st.booleans())
    if draw(st.booleans()):
        gf.objective = draw(st.sampled_from(("time", "memory", "comm")))
    shapes = gf.shapes()
    data = [p for p in shapes if p.startswith("batch/")]  # what batch(inputs="batch/*") names
    split = 1  # how many ways the batch axes so far split the batch
    batch_axes = []
    for axis in draw(st.permutations(sorted(mesh)))[: draw(st.integers(0, len(mesh)))]:
        names = draw(
            st.lists(st.sampled_from(SEARCHED), max_size=3, unique=True).filter(compatible)
        )  # not expert: the drawn programs have no MoE weights, and an expert axis that
        # tiles nothing is an error
        if {"batch", "fsdp"} & set(names):
            if shapes[data[0]][0] % (split * mesh[axis]):  # it would tile nothing: an error
                names = [n for n in names if n not in ("batch", "fsdp")]
            else:
                split *= mesh[axis]
                batch_axes.append(axis)
        strategies = []
        for name in names:
            kw: dict[str, str] = {}
            if name == "zero" and draw(st.booleans()):
                kw["stage"] = str(draw(st.sampled_from((1, 2, 3))))
            if name == "batch" and draw(st.booleans()):
                kw["inputs"] = '"batch/*"'
            strategies.append((name, kw))
        gf.blocks.append((axis, strategies))
    manual = Manual(mesh, shapes, data, batch_axes)
    for _ in range(draw(st.integers(0, 3))):
        path = draw(
            st.sampled_from(sorted(shapes) + ["params/**/scale", "params/layers/*/mlp/w_in"])
        )
        matched = [p for p in shapes if _glob(path, p)]
        axis = draw(st.sampled_from(sorted(mesh)))
        dims = manual.tile_dims(matched, axis)
        if dims and draw(st.booleans()):
            dim = draw(st.sampled_from(dims))
            manual.tile(matched, dim, axis)
            gf.manual.append(("tile", path, dim, axis))
        elif manual.can_replicate(matched, axis):
            manual.replicate(matched, axis)
            gf.manual.append(("replicate", path, axis))
    if draw(st.booleans()):
        gf.search = []
        options = [
            ("episodes", st.sampled_from((("20", 20), ("1K", 1000), ("5", 5)))),
            ("seed", st.integers(0, 99).map(lambda n: (str(n), n))),
            ("seconds", st.sampled_from((("5", 5.0), ("2.5", 2.5), ("500ms", 0.5)))),
            ("patience", st.sampled_from((("50", 50), ("200", 200)))),
            ("rollout", st.sampled_from((('"random"', "random"), ('"greedy"', "greedy")))),
            ("uct_c", st.sampled_from((("1.4", 1.4), ("2", 2.0), ("0", 0.0)))),
        ]
        for key, values in options:
            if draw(st.booleans()):
                text, value = draw(values)
                gf.search.append((key, text, value))
    if draw(st.booleans()):
        gf.prune = draw(st.sampled_from(("cpsat", "none")))
    keys = list(gf.statements(Style()))
    shuffled = draw(st.permutations(keys)) if draw(st.booleans()) else keys
    # the axis blocks and the manual statements keep their relative order
    for prefix in ("axis:", "manual:"):
        ordered = iter([k for k in keys if k.startswith(prefix)])
        shuffled = [next(ordered) if k.startswith(prefix) else k for k in shuffled]
    gf.order = shuffled
    return gf


def _glob(pattern: str, path: str) -> bool:
    return pattern == path or glob_match(pattern, path)


@st.composite
def _goal_texts(draw) -> tuple[str, Goal]:
    gf = draw(goal_files())
    return gf.render(draw(styles())), gf.goal()


def goal_texts() -> st.SearchStrategy[tuple[str, Goal]]:
    """`(text, goal)`: a random valid goal file for the model of `partir.testing._programs`
    and the `partir.Goal` it means, built in Python, not by parsing: its mesh (in order),
    device (a catalog device, maybe with per-axis links), memory limit (in assorted
    units), objective, schedule (axis blocks in file order, then tile/replicate
    statements), and search. Statements come in random order, with random spacing,
    comments and blank lines; axis names may be keywords (`tile`, `on`, `mesh`, ...)."""
    return _goal_texts()
