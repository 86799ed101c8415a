"""`Plan`: a sharding for every value of a goal's program, its cost, and how to run it."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jax.sharding import PartitionSpec

from partir.goal import Goal
from partir.ir.cost import Cost
from partir.ir.gc_pause import paused_gc
from partir.ir.groups import relayouts
from partir.ir.messages import did_you_mean, first_bad_byte
from partir.ir.propagate import Decision, Sharding, State
from partir.ir.specs import (
    PlanError,
    check_sharding,
    resolve,
    spec_from_json,
    spec_to_json,
    to_sharding,
    to_spec,
)
from partir.solver.partition_rules import RULES_HELPERS, partition_rules

FORMAT = "partir-plan/1"


class Plan:
    """Shardings of every value of `goal`'s program (from a propagated `State`)."""

    def __init__(
        self,
        goal: Goal | None,
        state: State | None,
        cost: Cost,
        *,
        input_tilings: Mapping[str, Sharding] | None = None,
        output_tilings: Mapping[str, Sharding] | None = None,
        baselines: Mapping[str, Cost] | None = None,
        search: Mapping[str, Any] | None = None,
        mesh: Mapping[str, int] | None = None,
        device: str | None = None,
    ) -> None:
        self.goal = goal
        self.state = state
        self.cost = cost
        # the propagation calls that made `state` (a searched plan), for exact replay
        self.decisions: list[list[Decision]] | None = None
        self.baselines = dict(baselines or {})
        self.search = dict(search or {})
        if mesh is None:
            if goal is None:
                raise ValueError("a Plan without a goal needs its mesh")
            mesh = goal.sizes
        self.mesh = dict(mesh)
        self.device = device or (goal.device.name if goal else "")
        if input_tilings is None:
            if goal is None or state is None:
                raise ValueError("a Plan needs its input_tilings, or a goal and a state")
            prog, prop = goal.program, goal.propagator
            input_tilings = {p: prop.sharding(state, v) for p, v in prog.inputs.items()}
            output_tilings = {}
            for p, v in prog.outputs.items():
                src = prog.carried.get(p)
                output_tilings[p] = input_tilings[src] if src else prop.sharding(state, v)
        # per input / output path, partir's tiling: for each dim, the mesh axes cutting it
        # (`specs` gives them as PartitionSpecs, `shardings()` as jax NamedShardings)
        self.input_tilings = dict(input_tilings)
        self.output_tilings = dict(output_tilings or {})

    @property
    def specs(self) -> dict[str, PartitionSpec]:
        return {p: to_spec(s) for p, s in self.input_tilings.items()}

    @property
    def out_specs(self) -> dict[str, PartitionSpec]:
        return {p: to_spec(s) for p, s in self.output_tilings.items()}

    def value_sharding(self, vid: int) -> Sharding:
        if self.goal is None or self.state is None:
            raise ValueError("this plan has no goal (it was read from JSON alone); pass goal=")
        return self.goal.propagator.sharding(self.state, vid)

    def jit(self, mesh=None, *, donate: bool = False, constrain: bool = True):
        """A `jax.jit` of the goal's program with this plan's shardings (see solver.jit),
        on `mesh`, else the goal's `jax.sharding.Mesh`, else a mesh of jax.devices()."""
        from partir.solver.jit import plan_jit
        from partir.solver.spec_tree import plan_mesh

        if self.goal is None:
            raise ValueError("this plan has no goal (it was read from JSON alone); pass goal=")
        return plan_jit(self, plan_mesh(self, mesh), donate=donate, constrain=constrain)

    def shardings(self, mesh=None):
        """`(in_shardings, out_shardings)`: pytrees of `NamedSharding` shaped like the
        program's args and outputs, for `jax.jit(fn, in_shardings=..., out_shardings=...)`
        (on `mesh`, else the goal's Mesh, else a mesh of jax.devices())."""
        from partir.solver.spec_tree import named_shardings

        return named_shardings(self, mesh)

    def to_rules(self) -> list[tuple[str, PartitionSpec]]:
        """An ordered partition-rule list, as hand-written Flax/T5X rules read; the first
        pattern that matches a path wins and a final `("**", P())` keeps the rest whole.

        A parameter and the optimizer moments that end with its path (`model/blocks/0/
        attn/query/kernel`, `optimizer/opt_state/0/mu/blocks/0/attn/query/kernel`) share
        one `**/blocks/*/attn/query/kernel` rule when they and the repeated layers agree;
        otherwise the rule narrows (one layer, one argument, one path) just enough.
        Applying the rules in order gives back exactly this plan's input specs."""
        return [(p, to_spec(s)) for p, s in partition_rules(self.input_tilings)]

    def logical_axis_rules(self, logical, *, strict: bool = True) -> list[tuple[str, Any]]:
        """This plan as MaxText/T5X `logical_axis_rules`, for args whose dims carry the
        logical names in `logical` (an args-shaped pytree of PartitionSpecs of names, as
        `nn.get_partition_spec` gives); see `partir.solver.logical_rules`."""
        from partir.solver.logical_rules import logical_axis_rules

        return logical_axis_rules(self, logical, strict=strict)

    def partitioned(self, tree, argument: int = 0):
        """Argument `argument`'s pytree (e.g. the params) boxed in Flax's `nn.Partitioned`
        with this plan's mesh axes (needs flax)."""
        from partir.solver.logical_rules import partitioned

        return partitioned(self, tree, argument)

    def nnx_sharding(self, state, argument: int = 0):
        """Argument `argument` as Flax NNX state (an `nnx.State`, or a Module's) with each
        Variable's sharding metadata set to this plan's mesh axes, so that
        `nnx.get_partition_spec` gives the plan's specs (needs flax)."""
        from partir.solver.nnx_export import nnx_sharding

        return nnx_sharding(self, state, argument)

    def rules_source(self, filename: str = "rules.py") -> str:
        """`to_rules()` as a Python module (or JSON, for a `.json` filename): `RULES`, plus
        `spec_for(path)` and `tree_specs(tree, prefix)` that apply them without partir."""
        rules = self.to_rules()
        if filename.endswith(".json"):
            return (
                json.dumps([[p, spec_to_json(to_sharding(s, len(s)))] for p, s in rules], indent=1)
                + "\n"
            )
        lines = [
            '"""Partition rules found by partir: the first pattern that matches a path wins.',
            "",
            "A path is the pytree key path joined with '/' (dict keys, sequence indices,",
            "attribute names), under the name of the argument: `model/blocks/0/attn/query/",
            "kernel`. In a pattern `*` matches one path element (or part of one) and `**` any",
            'number of them."""',
            "",
            "import fnmatch",
            "",
            "import jax",
            "from jax.sharding import PartitionSpec as P",
            "",
            "RULES = [",
        ]
        for pattern, spec in rules:
            entries = ", ".join(repr(e) for e in spec)
            lines.append(f"    ({pattern!r}, P({entries})),")
        lines += ["]", "", "", RULES_HELPERS]
        return "\n".join(lines)

    # -- the plan file --------------------------------------------------------------
    def to_json(self) -> str:
        record = {}
        if self.decisions is not None and self.goal is not None:
            paths = self.goal.program.input_paths
            record["decisions"] = [
                [[paths[d.value], d.dim, d.axis, d.priority, d.position] for d in call]
                for call in self.decisions
            ]
        return json.dumps(
            {
                **record,
                "format": FORMAT,
                "mesh": self.mesh,
                "device": self.device,
                "specs": {p: spec_to_json(s) for p, s in self.input_tilings.items()},
                "out_specs": {p: spec_to_json(s) for p, s in self.output_tilings.items()},
                "cost": self.cost.to_dict(),
                "baselines": {k: c.to_dict() for k, c in self.baselines.items()},
                "search": self.search,
                "goal": self.goal.filename if self.goal else None,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, goal: Goal | None = None) -> Plan:
        """Read a `partir-plan/1` file; with `goal`, the plan is re-propagated on it (a plan
        for another mesh is refused)."""
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, RecursionError, ValueError) as e:
            raise PlanError(f"not a {FORMAT} file: it is not JSON ({e})") from None
        return cls.from_record(d, goal)

    @classmethod
    def from_record(cls, d: Any, goal: Goal | None = None) -> Plan:
        """`from_json` of the parsed JSON."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            found = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise _at(PlanError(f"not a {FORMAT} file (format is {found!r})"), "format")
        goal = _split_as_planned(goal, d.get("mesh"))
        if goal is not None and d.get("mesh") != goal.mesh:
            raise _at(
                PlanError(
                    f"the plan is for mesh {d.get('mesh')}, the goal's mesh is {goal.mesh}; "
                    "solve the goal again for its mesh"
                ),
                "mesh",
            )
        try:
            return cls._from_record(d, goal)
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as e:
            raise PlanError(
                f"the {FORMAT} file is damaged: {type(e).__name__}: {e} (write it again with "
                "partir solve --out)"
            ) from None

    @classmethod
    def _from_record(cls, d: dict, goal: Goal | None) -> Plan:
        if goal is not None and "decisions" in d:
            return replay(goal, d)
        if goal is not None:
            specs = _file_specs(goal, d["specs"])
            plan = make_plan(goal, {p: to_spec(s) for p, s in specs.items()})
            plan.search = d.get("search", {})
            return plan
        return cls(
            None,
            None,
            Cost.from_dict(d["cost"]),
            input_tilings={p: spec_from_json(e) for p, e in d["specs"].items()},
            output_tilings={p: spec_from_json(e) for p, e in d["out_specs"].items()},
            baselines={k: Cost.from_dict(c) for k, c in d.get("baselines", {}).items()},
            search=d.get("search", {}),
            mesh=d["mesh"],
            device=d.get("device", ""),
        )

    def __repr__(self) -> str:
        sharded = sum(1 for s in self.input_tilings.values() if any(s))
        return (
            f"Plan({sharded}/{len(self.input_tilings)} inputs sharded, "
            f"step {self.cost.step_time_s:.3g} s, peak {self.cost.peak_memory_bytes} B)"
        )


def _split_as_planned(goal: Goal | None, mesh: Any) -> Goal | None:
    """`goal` with its axes split as the plan file's `mesh` splits them (see subaxes)."""
    from partir.solver import subaxes

    if goal is None or not isinstance(mesh, dict) or not subaxes.is_split(mesh):
        return goal
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in mesh.values()):
        return goal
    if subaxes.is_split(goal.sizes) or subaxes.parent_sizes(mesh) != goal.mesh:
        return goal
    return subaxes.split_goal(goal, mesh)


def replay(goal: Goal, d: Mapping[str, Any]) -> Plan:
    """A plan from its file. The specs the file shows are the plan; the recorded
    propagation calls, replayed in order, give back the very state the search reached
    (input specs alone may not), and are used when they give those specs. When they do
    not (the specs were edited, or the decisions), the plan is made from the specs."""
    prog, prop = goal.program, goal.propagator
    specs = _file_specs(goal, d["specs"])
    calls = _file_decisions(goal, d["decisions"])
    state = prop.empty()
    for decisions in calls:
        # a rejected decision changes nothing: the specs check below sees the outcome
        state = prop.apply_all(state, decisions)[0]
    plan = Plan(goal, state, goal.cost_model.cost(state), search=d.get("search", {}))
    want = {p: specs.get(p, ((),) * len(prog.values[v].shape)) for p, v in prog.inputs.items()}
    if plan.input_tilings == want:
        plan.decisions = calls
    else:
        plan = make_plan(goal, {p: to_spec(s) for p, s in specs.items()})
        plan.search = dict(d.get("search", {}))
    plan.baselines = {k: Cost.from_dict(c) for k, c in d.get("baselines", {}).items()}
    return plan


def _file_specs(goal: Goal, entries: Mapping[str, Any]) -> dict[str, Sharding]:
    """A plan file's `specs`, checked against the goal: inputs the program has, mesh axes
    once per input and dividing their dims, none that a replicate statement keeps off."""
    if not isinstance(entries, Mapping):
        raise _at(
            PlanError(f"the plan file's specs are a {type(entries).__name__}, not an object"),
            "specs",
        )
    specs = {}
    for path, entry in entries.items():
        with _where("specs", path):
            specs[path] = _file_spec(goal, path, entry)
    return specs


def _file_spec(goal: Goal, path: str, entry: Any) -> Sharding:
    prog, prop = goal.program, goal.propagator
    if path not in prog.inputs:
        raise PlanError(
            f"the plan file gives a spec for {path!r}, which the program lacks"
            f"{did_you_mean(path, prog.inputs)}; solve the goal again"
        )
    names = lambda e: isinstance(e, list) and all(isinstance(a, str) for a in e)  # noqa: E731
    if not isinstance(entry, list) or not all(
        e is None or isinstance(e, str) or names(e) for e in entry
    ):
        raise PlanError(
            f"the plan file's spec for {path!r} is {entry!r}; a spec is a list of null, "
            'an axis name, or a list of axis names: ["batch", null]'
        )
    vid = prog.inputs[path]
    shape = prog.values[vid].shape
    sharding = to_sharding(spec_from_json(entry), len(shape))
    check_sharding(path, shape, sharding, goal.sizes)
    for axis in (a for axes in sharding for a in axes):
        if prop.blocks(vid, axis):
            raise PlanError(
                f"the plan tiles {path} on {axis!r}, which a replicate statement of the "
                "goal keeps whole; solve the goal again"
            )
    return sharding


def _file_decisions(goal: Goal, record: Any) -> list[list[Decision]]:
    """A plan file's recorded propagation calls, checked: inputs the program has, dims
    in range, mesh axes, and one dim per input and axis."""
    if not isinstance(record, list) or not all(isinstance(c, list) for c in record):
        raise PlanError("the plan file's decisions are not a list of lists of decisions")
    calls: list[list[Decision]] = []
    dims: dict[tuple[str, str], int] = {}
    seen: dict[str, int] = {}  # how often each path came before: its n-th mention
    for call in record:
        decisions = []
        for entry in call:
            path = entry[0] if isinstance(entry, list) and entry else None
            mentions = []
            if isinstance(path, str):
                seen[path] = seen.get(path, 0) + 1
                mentions = [path] * seen[path]
            with _where("decisions", *mentions):
                decisions.append(_file_decision(goal, entry, dims))
        calls.append(decisions)
    return calls


def _file_decision(goal: Goal, entry: Any, dims: dict) -> Decision:
    """One recorded decision, checked; `dims` ({(path, axis): dim}) across the record."""
    prog = goal.program
    if not isinstance(entry, list) or len(entry) != 5:
        raise PlanError(
            f"the plan file has a decision {entry!r}; a decision is "
            "[path, dim, axis, priority, position]"
        )
    path, dim, axis, priority, position = entry
    if not isinstance(path, str) or path not in prog.inputs:
        raise PlanError(f"the plan file names input {path!r}, which the program lacks")
    rank = len(prog.values[prog.inputs[path]].shape)
    dim_ok = isinstance(dim, int) and not isinstance(dim, bool) and 0 <= dim < rank
    if not dim_ok or not isinstance(axis, str) or axis not in goal.mesh:
        raise PlanError(
            f"the plan file tiles {path!r} (rank {rank}) along dim {dim!r} on axis "
            f"{axis!r}; the goal's mesh axes are {list(goal.mesh)}"
        )
    if not all(_small_int(x) for x in (priority, position)):
        raise PlanError(
            f"the plan file's decision {entry!r} has a priority or position that is not a "
            "small whole number"
        )
    first = dims.setdefault((path, axis), dim)
    if first != dim:
        raise PlanError(
            f"the plan file tiles {path!r} on axis {axis!r} along dims {first} and {dim}; a "
            "mesh axis tiles one dim of an input"
        )
    return Decision(priority, prog.inputs[path], dim, axis, position)


def _small_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) < 2**31


# -- where in a plan file an error is ------------------------------------------------


def _at(err: PlanError, *keys: Any) -> PlanError:
    """`err`, marked with the JSON keys (or string values) that lead to its place."""
    if not getattr(err, "keys", None):
        err.keys = tuple(str(k) for k in keys if k is not None)
    return err


class _where:
    """Mark a PlanError raised inside with `keys` (see `_at`)."""

    def __init__(self, *keys: Any) -> None:
        self.keys = keys

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, err, tb) -> Literal[False]:
        if isinstance(err, PlanError):
            _at(err, *self.keys)
        return False


class PlanFileError(PlanError):
    """A plan file that cannot be used; `str()` is `FILE:LINE:COL: error: MESSAGE`."""

    def __init__(self, message: str, filename: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message, self.filename, self.line, self.column = message, filename, line, column

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.column}: error: {self.message}"


def _locate(text: str, keys: Sequence[str]) -> tuple[int, int]:
    """(line, column) of the last of `keys` as a JSON string, each found after the one
    before (`specs`, then the path in it; a path twice: its second mention); the start of
    the file if one is missing."""
    pos = found = 0
    for key in keys:
        k = text.find(json.dumps(key), pos)
        if k < 0:
            break
        found, pos = k, k + 1
    line = text.count("\n", 0, found) + 1
    return line, found - (text.rfind("\n", 0, found) + 1) + 1


MAX_DEPTH = 100  # a plan file nests 4 deep; JSON's parser recurses once per level
MAX_DIGITS = 100


def _too_deep_or_long(text: str) -> tuple[str, int]:
    """(why, offset) of what the JSON parser met with RecursionError or ValueError:
    nesting beyond MAX_DEPTH, or a number of over MAX_DIGITS digits."""
    long = re.search(rf"[0-9]{{{MAX_DIGITS + 1},}}", text)
    end = long.start() if long is not None else len(text)
    depth, in_string, escaped = 0, False, False
    for i, c in enumerate(text[:end]):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return f"it nests deeper than {MAX_DEPTH} levels", i
        elif c in "]}":
            depth -= 1
    if long is not None:
        return f"a number of {len(long.group())} digits", long.start()
    return "it cannot be read", 0


def read_plan_file(path: str, goal: Goal | None = None) -> Plan:
    """`Plan.from_json` of a file, its errors as `PlanFileError`s that say where: bytes
    that are not UTF-8, JSON syntax, nesting or numbers beyond reason, and every entry
    that does not fit the goal (at its key)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bad = first_bad_byte(data, e)
        raise PlanFileError(bad.message, path, bad.line, bad.column) from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanFileError(
            f"not a {FORMAT} file: it is not JSON ({e.msg})", path, e.lineno, e.colno
        ) from None
    except (RecursionError, ValueError):  # nesting, or more digits than int() reads
        why, at = _too_deep_or_long(text)
        line, column = text.count("\n", 0, at) + 1, at - (text.rfind("\n", 0, at) + 1) + 1
        raise PlanFileError(f"not a {FORMAT} file: {why}", path, line, column) from None
    try:
        return Plan.from_record(d, goal)
    except PlanError as e:
        line, column = _locate(text, getattr(e, "keys", ()))
        raise PlanFileError(str(e), path, line, column) from None


def input_decisions(
    goal: Goal, specs: Mapping[str, Any], priority: int = 0, *, strict: bool = True
) -> list[Decision]:
    """Decisions that tile the inputs as `specs` ({path or glob: PartitionSpec}) says.

    Data inputs (those that are not carried state) get `priority`, state `priority + 1`:
    the batch is laid out before the parameters, as the search lays it out (its batch
    axes first), so a plan and its input shardings propagated afresh agree."""
    prog = goal.program
    state_paths = set(prog.carried.values())
    resolved = resolve(specs, prog.inputs, strict=strict)
    decisions = []
    for path, spec in resolved.items():
        vid = prog.inputs[path]
        shape = prog.values[vid].shape
        sharding = to_sharding(
            spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec), len(shape)
        )
        check_sharding(path, shape, sharding, goal.sizes)
        decisions += [
            Decision(priority + (1 if path in state_paths else 0), vid, d, a, position=k)
            for d, axes in enumerate(sharding)
            for k, a in enumerate(axes)
        ]
    return decisions


Specs = Mapping[str, Any] | Sequence[Mapping[str, Any]]


def make_plan(goal: Goal, specs: Specs | Any, *, strict: bool = True) -> Plan:
    """The plan that shards the inputs as `specs` says (unmatched inputs replicated) and
    lets propagation decide everything inside the program.

    `specs` is an args-shaped pytree of `PartitionSpec` / `NamedSharding` / None (None:
    replicated), or a prefix of one, as `jax.jit`'s in_shardings; or one
    {path or glob: PartitionSpec} dict, or a list of them applied in order
    (a schedule: `[batch_rules, megatron_rules, zero_rules]`); for a path that several
    dicts match, the later dicts add their axes to the earlier ones' dims. With `strict`,
    a rule that matches no input is an error (rule lists written for a model family, like
    the expert plans, pass `strict=False`), and so is tiling an input on an axis that a
    `replicate` statement of the goal keeps it whole on (without `strict`, those tilings
    are left out: an expert plan then honours the goal's replicate statements)."""
    from partir.solver.spec_tree import looks_like_tree, rules_of_tree

    prog, prop = goal.program, goal.propagator
    if looks_like_tree(specs, goal.args):
        specs = rules_of_tree(goal, specs)
    stages = [specs] if isinstance(specs, Mapping) else list(specs)
    decisions = []
    for k, stage in enumerate(stages):
        decisions += input_decisions(goal, stage, priority=2 * k, strict=strict)
    if not strict:
        decisions = [d for d in decisions if not prop.blocks(d.value, d.axis)]
    with paused_gc():
        state, rejected = propagate_inputs(goal, decisions)
    if rejected:
        d = rejected[0]
        why = (
            "a replicate statement of the goal keeps it whole on that axis"
            if prop.blocks(d.value, d.axis)
            else "the axis is already used on this input, or the dim size does not divide"
        )
        raise PlanError(
            f"{prog.input_paths[d.value]}: cannot tile dim {d.dim} on {d.axis!r} ({why})"
        )
    with paused_gc():
        return Plan(goal, state, goal.cost_model.cost(state))


def propagate_inputs(goal: Goal, decisions: list[Decision]) -> tuple[State, list[Decision]]:
    """The state that input decisions give from scratch, and those of them it rejected:
    they propagate with the user's constraints (`Propagator.seeded`) and reach the inputs'
    layout copies at once (`_relaid`)."""
    prop = goal.propagator
    inputs = goal.program.inputs.values()
    state, rejected = prop.seeded(inputs, decisions + _relaid(goal, decisions))
    return state, [d for d in rejected if d.value in goal.program.input_paths]


def _relaid(goal: Goal, decisions: list[Decision]) -> list[Decision]:
    """The decisions on the state's inputs, carried to the values that are those inputs laid
    out anew (`ir.groups.relayouts`: a scanned layer's slice of a weight stack, its bf16
    cast) at the same priority: XLA keeps a parameter's sharding through its layout copies
    and into the loops that read it. Without them, the user's activation constraints, nearer
    to a layer's weight inside the loop than the stack's own sharding, priced every weight
    resharded at every layer (MaxText's plan)."""
    prog = goal.program
    state = {prog.inputs[p] for p in prog.carried.values()}
    copies: dict[int, list] = {}
    out = []
    for d in decisions:
        if d.value not in state:
            continue
        if d.value not in copies:
            copies[d.value] = relayouts(prog, d.value)
        for w, dims in copies[d.value]:
            if dims[d.dim] is not None:
                out.append(dataclasses.replace(d, value=w, dim=dims[d.dim]))
    return out


def evaluate(goal: Goal, specs: Specs | Any) -> Cost:
    """The cost of sharding the inputs as `specs` says (any form `make_plan` takes); the
    same as `plan(...).cost`."""
    return make_plan(goal, specs).cost
