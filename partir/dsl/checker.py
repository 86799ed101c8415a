"""The checker of goal files: statements in, a `GoalSpec` out (what the file says, every
name and number checked), before anything named in it is imported."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from partir.dsl.errors import GoalError, Pos, Source
from partir.dsl.goal_spec import AxisSpec, EntryPoint, GoalSpec, Literal, ManualSpec, StrategySpec
from partir.dsl.parser import (
    Arg,
    AxisStatement,
    Call,
    ConstraintsStatement,
    DeviceStatement,
    Field,
    InputsStatement,
    ListValue,
    MemoryStatement,
    MeshOver,
    MeshStatement,
    Num,
    ObjectiveStatement,
    ProgramStatement,
    PruneStatement,
    ReplicateStatement,
    SearchStatement,
    Statement,
    Str,
    TileStatement,
    Word,
    parse_statements,
)
from partir.goal import Search
from partir.ir.devices import CATALOG as DEVICES
from partir.ir.devices import Device
from partir.ir.messages import did_you_mean, one_of
from partir.ir.units import Quantity, UnitError, read
from partir.strategies import CATALOG as STRATEGIES
from partir.strategies import replicate, tile
from partir.strategies.base import conflict

OBJECTIVES = ("time", "memory", "comm")
PRUNERS = {"cpsat": "cpsat", "none": None}
CONSTRAINTS = {"honour": True, "honor": True, "ignore": False}
SEARCHES = ("mcts",)
ROLLOUTS = ("greedy", "random")
# statements that may appear once
SINGLE = (
    "program",
    "inputs",
    "mesh",
    "device",
    "memory",
    "objective",
    "search",
    "prune",
    "constraints",
)
REQUIRED = {
    "program": 'program "module:function"',
    "inputs": 'inputs "module:function"(name=value, ...)',
    "mesh": "mesh batch=8, model=8",
}
DEVICE_FIELDS = {  # field -> (kinds it takes, an example)
    "hbm": (("size", "number"), "32GiB"),
    "flops": (("count", "rate", "number"), "275T"),
    "hbm_bandwidth": (("rate", "number"), "1.2T/s"),
    "link": (("rate", "number"), "50G/s"),
    "network_bandwidth": (("rate", "number"), "50G/s"),
    "latency": (("time", "number"), "2us"),
    "node_size": (("number",), "8"),
}
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENT}(\.{_IDENT})*")


def parse(text: str, filename: str = "<text>") -> GoalSpec:
    """Parse and check a goal file's text; raises `GoalError` (FILE:LINE:COL: error: ...)."""
    # old Mac files end lines with CR alone, Windows ones with CR LF: one line each
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    source = Source(filename, text)
    return _Builder(source).build(parse_statements(text, filename))


class _Builder:
    """Walks the statements in file order, checking each, then checks them together."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.seen: dict[str, Pos] = {}
        self.program: EntryPoint | None = None
        self.inputs: EntryPoint | None = None
        self.mesh: dict[str, int | None] = {}
        self.mesh_pos: dict[str, Pos] = {}
        self.devices: int | None = None
        self.device: Device | None = None
        self.device_base: Device | None = None
        self.device_fields: dict[str, tuple[Any, Pos]] = {}
        self.links: dict[str, tuple[float, Pos]] = {}
        self.memory: int | None = None
        self.objective = "time"
        self.axes: list[AxisSpec] = []
        self.manual: list[ManualSpec] = []
        self.search: dict[str, Any] = {}
        self.prune: str | None = "cpsat"
        self.honour_constraints = True
        self.notes: list[str] = []

    def error(self, pos: Pos, message: str) -> GoalError:
        return self.source.error(pos, message)

    # ---------------------------------------------------------------- the whole file

    def build(self, statements: list[Statement]) -> GoalSpec:
        for st in statements:
            if st.keyword in SINGLE and st.keyword in self.seen:
                first = self.seen[st.keyword]
                raise self.error(
                    st.pos,
                    f"a second '{st.keyword}' statement; a goal has one "
                    f"(the first is at line {first.line})",
                )
            self.seen.setdefault(st.keyword, st.pos)
            getattr(self, f"_{st.keyword}")(st)
        for keyword, example in REQUIRED.items():
            if keyword not in self.seen:
                raise self.error(
                    Pos(1, 1), f"the goal has no '{keyword}' statement; add one like: {example}"
                )
        self._check_axes()
        device = self._finish_device()
        self._check_memory(device)
        search = Search(**self.search, prune=self.prune)
        assert self.program is not None and self.inputs is not None
        return GoalSpec(
            filename=self.source.filename,
            program=self.program,
            inputs=self.inputs,
            mesh=dict(self.mesh),
            device=device,
            memory_limit=self.memory,
            objective=self.objective,
            axes=self.axes,
            manual=self.manual,
            search=search,
            honour_constraints=self.honour_constraints,
            notes=self.notes,
            source=self.source,
            devices=self.devices,
            positions=dict(self.seen),
        )

    def _check_axes(self) -> None:
        def check(word_text: str, pos: Pos, what: str) -> None:
            if word_text not in self.mesh:
                raise self.error(
                    pos,
                    f"{what} '{word_text}' is not a mesh axis (the mesh has "
                    f"{one_of((repr(a) for a in self.mesh), 'and') or 'no axes'})"
                    f"{did_you_mean(word_text, self.mesh)}",
                )

        for block in self.axes:
            check(block.name, block.pos, "axis")
        for m in self.manual:
            check(m.strategy.axis, m.axis_pos, "axis")
        for axis, (_, pos) in self.links.items():
            check(axis, pos, "link axis")
        used = {b.name for b in self.axes} | {m.strategy.axis for m in self.manual}
        for axis, pos in self.mesh_pos.items():
            if axis not in used:
                self.notes.append(
                    self.source.note(
                        pos,
                        f"mesh axis '{axis}' has no axis block; nothing is sharded on it "
                        f"(it stays replicated). Add `axis {axis} {{ ... }}` to use it.",
                    )
                )

    def _check_memory(self, device: Device | None) -> None:
        d = device or DEVICES["cpu"]
        if self.memory is None and device is not None:
            self.notes.append(
                self.source.note(
                    self.seen["device"],
                    f"no memory statement: plans are not held to a memory limit, not even "
                    f"the HBM of device '{d.name}' ({_gib(d.hbm)}); add `memory <= "
                    f"{_gib(d.hbm).replace(' ', '')}` to hold them to it",
                )
            )
        if self.memory is not None and self.memory > d.hbm:
            self.notes.append(
                self.source.note(
                    self.seen["memory"],
                    f"the memory limit ({_gib(self.memory)}) is larger than the HBM of "
                    f"device '{d.name}' ({_gib(d.hbm)}); plans are held to the limit as "
                    "written, which the device cannot hold",
                )
            )

    # ---------------------------------------------------------------- values

    def quantity(self, num: Num) -> Quantity:
        try:
            return read(num.text)
        except UnitError as e:
            raise self.error(num.pos.shifted(e.offset), str(e)) from None

    def want(self, num: Num, kinds: tuple[str, ...], what: str, example: str) -> Quantity:
        q = self.quantity(num)
        if q.kind not in kinds:
            raise self.error(
                num.pos,
                f"{what} takes {_kind_words(kinds)}, like {example}; "
                f"'{num.text}' is {q.describe()}",
            )
        return q

    def positive_int(self, num: Num, what: str) -> int:
        q = self.quantity(num)
        if q.kind != "number" or not q.is_int or q.value < 1:
            raise self.error(num.pos, f"{what} must be a positive integer, not '{num.text}'")
        return int(q.value)

    def literal(self, value: Any) -> Literal:
        """A call argument's value: a number (units applied), string, bool, None or list."""
        if isinstance(value, Str):
            return value.text
        if isinstance(value, Num):
            q = self.quantity(value)
            if q.is_int:
                return int(q.value)
            v = float(q.value)
            return int(v) if q.kind == "count" and v.is_integer() else v
        if isinstance(value, ListValue):
            return [self.literal(v) for v in value.items]
        assert isinstance(value, Word)
        words = {"true": True, "false": False, "none": None}
        if value.text in words:
            return words[value.text]
        hint = did_you_mean(value.text, words) or f'; to pass it as a string, write "{value.text}"'
        raise self.error(
            value.pos,
            f"'{value.text}' is not a value: write a number, a \"string\", true, false or "
            f"none{hint}",
        )

    def kwargs(
        self, call: Call | None, what: str, allow_positional: bool = False
    ) -> tuple[list[Literal], dict[str, tuple[Literal, Arg]]]:
        args: list[Literal] = []
        kwargs: dict[str, tuple[Literal, Arg]] = {}
        for arg in call.args if call is not None else ():
            if arg.name is None:
                if not allow_positional:
                    raise self.error(
                        arg.pos, f"{what} takes keyword arguments only, like name=value"
                    )
                if kwargs:
                    raise self.error(arg.pos, "a positional argument after keyword arguments")
                args.append(self.literal(arg.value))
                continue
            name = arg.name.text
            if name in kwargs:
                raise self.error(arg.name.pos, f"argument '{name}' is given twice")
            kwargs[name] = (self.literal(arg.value), arg)
        return args, kwargs

    # ---------------------------------------------------------------- statements

    def entry_point(self, st: ProgramStatement | InputsStatement) -> EntryPoint:
        target = st.target
        module, sep, function = target.text.rpartition(":")
        ok = (
            sep
            and module.strip() == module
            and module
            and (module.endswith(".py") or _DOTTED.fullmatch(module))
            and _DOTTED.fullmatch(function)
        )
        if not ok:
            raise self.error(
                target.pos,
                f'{st.keyword} names a function as "module:function" or '
                f'"file.py:function", not "{target.text}"',
            )
        return EntryPoint(target.text, pos=target.pos)

    def _program(self, st: ProgramStatement) -> None:
        self.program = self.entry_point(st)

    def _inputs(self, st: InputsStatement) -> None:
        ep = self.entry_point(st)
        args, kwargs = self.kwargs(st.call, "inputs", allow_positional=True)
        ep.args = tuple(args)
        ep.kwargs = {k: v for k, (v, _) in kwargs.items()}
        self.inputs = ep

    def _mesh(self, st: MeshStatement) -> None:
        for name, size in st.axes:
            if name.text in self.mesh:
                raise self.error(
                    name.pos,
                    f"mesh axis '{name.text}' is given twice "
                    f"(first at column {self.mesh_pos[name.text].column})",
                )
            if isinstance(size, Word):  # `NAME=?`: the search chooses it
                self.mesh[name.text] = None
            else:
                what = f"the size of mesh axis '{name.text}'"
                self.mesh[name.text] = self.positive_int(size, what)
            self.mesh_pos[name.text] = name.pos
        self._mesh_over(st.over)

    def _mesh_over(self, over: MeshOver | None) -> None:
        """`over N`: needed with a `NAME=?` axis, and N must be a multiple of the rest."""
        open_ = [a for a, s in self.mesh.items() if s is None]
        if over is None:
            if open_:
                written = ", ".join(f"{a}={'?' if s is None else s}" for a, s in self.mesh.items())
                raise self.error(
                    self.mesh_pos[open_[0]],
                    f"mesh axis '{open_[0]}' has size ?, so the mesh needs a device count: "
                    f"write `mesh {written} over N` with N the number of devices",
                )
            return
        n = self.positive_int(over.devices, "the device count after 'over'")
        fixed = math.prod(s for s in self.mesh.values() if s is not None)
        if not open_ and n != fixed:
            raise self.error(
                over.devices.pos,
                f"the mesh's sizes multiply to {fixed}, not {n}; write NAME=? for the axes "
                "whose size partir should choose",
            )
        if n % fixed:
            raise self.error(
                over.devices.pos,
                f"{n} devices cannot be split over the fixed axes, whose sizes multiply to "
                f"{fixed}; choose a multiple of {fixed}",
            )
        self.devices = n

    def _device(self, st: DeviceStatement) -> None:
        if st.name is not None:
            if st.name.text not in DEVICES:
                raise self.error(
                    st.name.pos,
                    f"unknown device '{st.name.text}'{did_you_mean(st.name.text, DEVICES)} "
                    f"(known devices: {', '.join(DEVICES)})",
                )
            self.device_base = DEVICES[st.name.text]
        for f in st.fields:
            self._device_field(f)

    def _device_field(self, f: Field) -> None:
        name = f.name.text
        if name not in DEVICE_FIELDS:
            raise self.error(
                f.name.pos,
                f"unknown device field '{name}'{did_you_mean(name, DEVICE_FIELDS)} "
                f"(a device block takes: {', '.join(DEVICE_FIELDS)})",
            )
        kinds, example = DEVICE_FIELDS[name]
        if f.axis is not None and name != "link":
            raise self.error(
                f.axis.pos, f"'{name}' takes a value only; a mesh axis name is for 'link'"
            )
        if name == "node_size":
            value: Any = self.positive_int(f.value, "node_size")
        else:
            q = self.want(f.value, kinds, f"'{name}'", example)
            value = q.value
            if value <= 0:
                raise self.error(f.value.pos, f"'{name}' must be positive, not '{f.value.text}'")
        if f.axis is not None:
            if f.axis.text in self.links:
                raise self.error(f.axis.pos, f"a second 'link {f.axis.text}' in the device block")
            self.links[f.axis.text] = (float(value), f.axis.pos)
            return
        key = "link_bandwidth" if name == "link" else name
        if key in self.device_fields:
            raise self.error(f.name.pos, f"a second '{name}' in the device block")
        self.device_fields[key] = (value, f.name.pos)

    def _finish_device(self) -> Device | None:
        if "device" not in self.seen:
            return None
        fields = {k: v for k, (v, _) in self.device_fields.items()}
        for k in ("hbm", "node_size"):
            if k in fields:
                fields[k] = int(fields[k])
        for k in ("flops", "hbm_bandwidth", "link_bandwidth", "network_bandwidth", "latency"):
            if k in fields:
                fields[k] = float(fields[k])
        links = {axis: bw for axis, (bw, _) in self.links.items()}
        if self.device_base is not None:
            device = dataclasses.replace(self.device_base, **fields)
            return device.with_links(links) if links else device
        missing = [k for k in ("hbm", "flops", "hbm_bandwidth") if k not in fields]
        if missing:
            raise self.error(
                self.seen["device"],
                f"the device block gives no {one_of(repr(m) for m in missing)}; give "
                'them, or start from a catalog device: device "tpu-v4" { link model 100G/s }',
            )
        if "link_bandwidth" not in fields:
            bare = [a for a in self.mesh if a not in links]
            if bare:
                raise self.error(
                    self.seen["device"],
                    f"the device block gives no link bandwidth for mesh axis '{bare[0]}'; "
                    f"add `link {bare[0]} 50G/s`, or `link 50G/s` for every axis",
                )
            fields["link_bandwidth"] = min(links.values())
        return Device(name="custom", links=links, **fields)

    def _memory(self, st: MemoryStatement) -> None:
        limit = st.limit
        q = self.want(limit, ("size", "number"), "memory", "32GiB")
        if q.value <= 0:
            raise self.error(limit.pos, f"memory must be a positive size, not '{limit.text}'")
        if not q.is_int and not float(q.value).is_integer():
            raise self.error(
                limit.pos,
                f"memory must be a whole number of bytes, not '{limit.text}'; write a "
                "size like 1.5GiB",
            )
        self.memory = int(q.value)

    def _objective(self, st: ObjectiveStatement) -> None:
        word = st.name
        if word.text not in OBJECTIVES:
            raise self.error(
                word.pos,
                f"unknown objective '{word.text}'{did_you_mean(word.text, OBJECTIVES)} "
                f"(choose {one_of(OBJECTIVES)})",
            )
        self.objective = word.text

    def _axis(self, st: AxisStatement) -> None:
        name = st.axis
        for block in self.axes:
            if block.name == name.text:
                raise self.error(
                    name.pos,
                    f"a second block for axis '{name.text}' (the first is at line "
                    f"{block.pos.line}); put all of its strategies in one block",
                )
        block = AxisSpec(name.text, [], name.pos)
        for s in st.strategies:
            spec = self.strategy(s.name, s.call, name.text)
            for other in block.strategies:
                if other.strategy.name == spec.strategy.name:
                    raise self.error(
                        s.name.pos,
                        f"'{s.name.text}' is already in the block of axis '{name.text}' "
                        f"(line {other.pos.line})",
                    )
            block.strategies.append(spec)
            why = conflict([other.strategy for other in block.strategies])
            if why is not None:
                raise self.error(s.name.pos, why)
        if not block.strategies:
            self.notes.append(
                self.source.note(
                    name.pos, f"the block of axis '{name.text}' is empty; nothing is sharded on it"
                )
            )
        self.axes.append(block)

    def strategy(self, name: Word, call: Call | None, axis: str) -> StrategySpec:
        if name.text not in STRATEGIES:
            hint = did_you_mean(name.text, STRATEGIES)
            if name.text in ("tile", "replicate"):
                hint = f"; '{name.text}' is a statement of its own, outside axis blocks"
            elif not hint:
                hint = f" (strategies: {', '.join(STRATEGIES)})"
            raise self.error(name.pos, f"unknown strategy '{name.text}'{hint}")
        cls = STRATEGIES[name.text]
        _, kwargs = self.kwargs(call, f"strategy '{name.text}'")
        out: dict[str, Any] = {}
        for key, (value, arg) in kwargs.items():
            if key not in cls.arguments:
                allowed = cls.arguments
                takes = f"it takes {one_of(allowed)}" if allowed else "it takes no arguments"
                raise self.error(
                    arg.pos,
                    f"strategy '{name.text}' has no argument '{key}'"
                    f"{did_you_mean(key, allowed)} ({takes})",
                )
            try:
                out[key] = cls.check_argument(key, value, show=_show)
            except ValueError as e:
                raise self.error(arg.value.pos, str(e)) from None
        try:
            strategy = cls(axis, **out)
        except (TypeError, ValueError) as e:  # the constructors' own checks
            raise self.error(name.pos, str(e).split("\n")[0]) from None
        return StrategySpec(strategy, name.pos, {k: a.value.pos for k, (_, a) in kwargs.items()})

    def _tile(self, st: TileStatement) -> None:
        path, dim, axis = st.path, st.dim, st.axis
        self._check_path(path)
        q = self.quantity(dim)
        if q.kind != "number" or not q.is_int or q.value < 0:
            raise self.error(
                dim.pos, f"a tile dim is a dimension index 0, 1, ..., not '{dim.text}'"
            )
        self.manual.append(
            ManualSpec(tile(path.text, int(q.value), axis.text), path.pos, dim.pos, axis.pos)
        )

    def _replicate(self, st: ReplicateStatement) -> None:
        path, axis = st.path, st.axis
        self._check_path(path)
        self.manual.append(ManualSpec(replicate(path.text, axis.text), path.pos, None, axis.pos))

    def _check_path(self, path: Str) -> None:
        if not path.text.strip("/"):
            raise self.error(path.pos, 'an empty path; write an input path like "params/embed"')

    def _search(self, st: SearchStatement) -> None:
        method = st.method
        if method.text not in SEARCHES:
            raise self.error(
                method.pos,
                f"unknown search '{method.text}'{did_you_mean(method.text, SEARCHES)} "
                f"(the search is {one_of(SEARCHES)})",
            )
        _, kwargs = self.kwargs(st.call, f"search '{method.text}'")
        fields = [f.name for f in dataclasses.fields(Search) if f.name != "prune"]
        for key, (value, arg) in kwargs.items():
            if key == "prune":
                raise self.error(
                    arg.pos, "prune is a statement of its own: prune cpsat, or prune none"
                )
            if key not in fields:
                raise self.error(
                    arg.pos,
                    f"search has no argument '{key}'{did_you_mean(key, fields)} "
                    f"(it takes {one_of(fields)})",
                )
            self.search[key] = self.search_arg(key, value, arg.value.pos)

    def search_arg(self, key: str, value: Literal, pos: Pos) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key == "seconds":
            if (
                not number
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise self.error(pos, f"seconds must be a positive number, not {_show(value)}")
            return float(value)
        if key in ("episodes", "patience"):
            if not number or not isinstance(value, int) or value < 1:
                raise self.error(pos, f"{key} must be a positive integer, not {_show(value)}")
            return value
        if key == "seed":
            if not number or not isinstance(value, int):
                raise self.error(pos, f"seed must be an integer, not {_show(value)}")
            return value
        if key == "uct_c":
            if not number or not isinstance(value, int | float) or value < 0:
                raise self.error(pos, f"uct_c must be a number >= 0, not {_show(value)}")
            return float(value)
        if key == "proxy":
            if not isinstance(value, bool):
                raise self.error(pos, f"proxy must be true or false, not {_show(value)}")
            return value
        if key == "rollout":
            if value not in ROLLOUTS:
                hint = did_you_mean(value, ROLLOUTS) if isinstance(value, str) else ""
                raise self.error(
                    pos,
                    f"rollout must be {one_of(repr(r) for r in ROLLOUTS)}, not {_show(value)}"
                    f"{hint}",
                )
            return value
        return value  # pragma: no cover - every Search field is handled above

    def _prune(self, st: PruneStatement) -> None:
        word = st.name
        if word.text not in PRUNERS:
            raise self.error(
                word.pos,
                f"unknown pruner '{word.text}'{did_you_mean(word.text, PRUNERS)} "
                "(write prune cpsat, or prune none)",
            )
        self.prune = PRUNERS[word.text]

    def _constraints(self, st: ConstraintsStatement) -> None:
        """What to do with the program's own with_sharding_constraint calls."""
        word = st.mode
        if word.text not in CONSTRAINTS:
            raise self.error(
                word.pos,
                f"unknown choice '{word.text}'{did_you_mean(word.text, CONSTRAINTS)} "
                "(write constraints honour, or constraints ignore)",
            )
        self.honour_constraints = CONSTRAINTS[word.text]


def _kind_words(kinds: tuple[str, ...]) -> str:
    words = {"size": "a size", "count": "a count", "rate": "a rate", "time": "a time"}
    return one_of(words[k] for k in kinds if k != "number")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _gib(n: int) -> str:
    """A byte count in the unit that writes it best: 32 GiB, 80 GB, 41.2 GiB."""
    units = (
        ("TiB", 2**40),
        ("GiB", 2**30),
        ("TB", 10**12),
        ("GB", 10**9),
        ("MiB", 2**20),
        ("MB", 10**6),
        ("KiB", 2**10),
        ("KB", 10**3),
    )
    if n < 2**30:
        for unit, size in units[4:]:
            if n >= size and n % size == 0:
                return f"{n // size} {unit}"
    for unit, size in units[:4]:
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n / 2**30:.1f} GiB"
