"""`Plan`: a sharding for every value of a goal's program, its cost, and how to run it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from jax.sharding import PartitionSpec

from partir.goal import Goal
from partir.ir.cost import Cost
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

FORMAT = "partir-plan/1"


class Plan:
    """Shardings of every value of `goal`'s program (from a propagated `State`)."""

    def __init__(
        self,
        goal: Goal | None,
        state: State | None,
        cost: Cost,
        *,
        in_shardings: Mapping[str, Sharding] | None = None,
        out_shardings: Mapping[str, Sharding] | None = None,
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
        self.mesh = dict(mesh if mesh is not None else goal.mesh)
        self.device = device or (goal.device.name if goal else "")
        if in_shardings is None:
            prog, prop = goal.program, goal.propagator
            in_shardings = {p: prop.sharding(state, v) for p, v in prog.inputs.items()}
            out_shardings = {}
            for p, v in prog.outputs.items():
                src = prog.carried.get(p)
                out_shardings[p] = in_shardings[src] if src else prop.sharding(state, v)
        self.in_shardings = dict(in_shardings)
        self.out_shardings = dict(out_shardings or {})

    @property
    def specs(self) -> dict[str, PartitionSpec]:
        return {p: to_spec(s) for p, s in self.in_shardings.items()}

    @property
    def out_specs(self) -> dict[str, PartitionSpec]:
        return {p: to_spec(s) for p, s in self.out_shardings.items()}

    def value_sharding(self, vid: int) -> Sharding:
        return self.goal.propagator.sharding(self.state, vid)

    def jit(self, mesh=None, *, donate: bool = False, constrain: bool = True):
        """A `jax.jit` of the goal's program with this plan's shardings (see solver.jit)."""
        from partir.solver.jit import plan_jit

        return plan_jit(self, mesh, donate=donate, constrain=constrain)

    def to_rules(self) -> list[tuple[str, PartitionSpec]]:
        """An ordered partition-rule list, as hand-written Flax/T5X rules read: a parameter
        and its optimizer moments that agree become one `**/<tail>` rule, repeated layers
        that agree one `*` pattern, and a final `**` keeps the rest whole."""
        from partir.solver.actions import layer_pattern

        params = {p.split("/", 1)[1] for p in self.in_shardings if p.startswith("params/")}

        def tail(path: str) -> str | None:
            parts = path.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[i:]) in params:
                    return "/".join(parts[i:])
            return None

        groups: dict[str, list[tuple[str, Sharding]]] = {}
        for path, sharding in self.in_shardings.items():
            t = tail(path)
            key = "**/" + layer_pattern(t) if t else layer_pattern(path)
            groups.setdefault(key, []).append((path, sharding))
        rules: list[tuple[str, PartitionSpec]] = []
        for key, members in groups.items():
            if len({s for _, s in members}) == 1:
                if any(members[0][1]):
                    rules.append((key, to_spec(members[0][1])))
                continue
            by_layer: dict[str, list[tuple[str, Sharding]]] = {}
            for path, s in members:  # the layers disagree: one rule per layer if its
                t = tail(path)  # parameter and moments agree, else one per path
                by_layer.setdefault("**/" + t if t else path, []).append((path, s))
            for pattern, ms in by_layer.items():
                if len({s for _, s in ms}) == 1:
                    if any(ms[0][1]):
                        rules.append((pattern, to_spec(ms[0][1])))
                else:
                    rules += [(p, to_spec(s)) for p, s in ms if any(s)]
        rules.append(("**", PartitionSpec()))
        return rules

    def rules_source(self, filename: str = "rules.py") -> str:
        """`to_rules()` as a Python module (or JSON, for a `.json` filename)."""
        rules = self.to_rules()
        if filename.endswith(".json"):
            return json.dumps([[p, list(spec)] for p, spec in rules], indent=1) + "\n"
        lines = [
            '"""Partition rules found by partir: the first pattern that matches a path wins."""',
            "",
            "from jax.sharding import PartitionSpec as P",
            "",
            "RULES = [",
        ]
        for pattern, spec in rules:
            entries = ", ".join(repr(e) for e in spec)
            lines.append(f"    ({pattern!r}, P({entries})),")
        lines.append("]")
        return "\n".join(lines) + "\n"

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
                "specs": {p: spec_to_json(s) for p, s in self.in_shardings.items()},
                "out_specs": {p: spec_to_json(s) for p, s in self.out_shardings.items()},
                "cost": self.cost.to_dict(),
                "baselines": {k: c.to_dict() for k, c in self.baselines.items()},
                "search": self.search,
                "goal": self.goal.filename if self.goal else None,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, goal: Goal | None = None) -> Plan:
        """Read a `partir-plan/1` file; with `goal`, the plan is re-propagated on it."""
        d = json.loads(text)
        if d.get("format") != FORMAT:
            raise PlanError(f"not a {FORMAT} file (format is {d.get('format')!r})")
        specs = {p: spec_from_json(e) for p, e in d["specs"].items()}
        if goal is not None and "decisions" in d:
            return replay(goal, d)
        if goal is not None:
            plan = make_plan(goal, {p: to_spec(s) for p, s in specs.items()})
            plan.search = d.get("search", {})
            return plan
        return cls(
            None,
            None,
            Cost.from_dict(d["cost"]),
            in_shardings=specs,
            out_shardings={p: spec_from_json(e) for p, e in d["out_specs"].items()},
            baselines={k: Cost.from_dict(c) for k, c in d.get("baselines", {}).items()},
            search=d.get("search", {}),
            mesh=d["mesh"],
            device=d.get("device", ""),
        )

    def __repr__(self) -> str:
        sharded = sum(1 for s in self.in_shardings.values() if any(s))
        return (
            f"Plan({sharded}/{len(self.in_shardings)} inputs sharded, "
            f"step {self.cost.step_time_s:.3g} s, peak {self.cost.peak_memory_bytes} B)"
        )


def replay(goal: Goal, d: Mapping[str, Any]) -> Plan:
    """A searched plan from its file: the recorded propagation calls, replayed in order,
    give back the very state the search reached (input specs alone may not)."""
    prog, prop = goal.program, goal.propagator
    state = prop.empty()
    calls = []
    for call in d["decisions"]:
        decisions = []
        for path, dim, axis, priority, position in call:
            if path not in prog.inputs:
                raise PlanError(f"the plan file names input {path!r}, which the program lacks")
            decisions.append(Decision(priority, prog.inputs[path], dim, axis, position))
        state, _ = prop.apply_all(state, decisions)
        calls.append(decisions)
    plan = Plan(goal, state, goal.cost_model.cost(state), search=d.get("search", {}))
    plan.decisions = calls
    plan.baselines = {k: Cost.from_dict(c) for k, c in d.get("baselines", {}).items()}
    return plan


def input_decisions(
    goal: Goal, specs: Mapping[str, Any], priority: int = 0, *, strict: bool = True
) -> list[Decision]:
    """Decisions that tile the inputs as `specs` ({path or glob: PartitionSpec}) says.

    Data inputs (those that are not carried state) get `priority`, state `priority + 1`:
    the batch is laid out before the parameters, as "batch first" in Shardy's order."""
    prog = goal.program
    state_paths = set(prog.carried.values())
    resolved = resolve(specs, prog.inputs, strict=strict)
    decisions = []
    for path, spec in resolved.items():
        vid = prog.inputs[path]
        shape = prog.values[vid].shape
        sharding = to_sharding(spec if isinstance(spec, PartitionSpec) else PartitionSpec(*spec),
                               len(shape))  # fmt: skip
        check_sharding(path, shape, sharding, goal.mesh)
        prio = priority + (1 if path in state_paths else 0)
        decisions += [
            Decision(prio, vid, d, a, position=k)
            for d, axes in enumerate(sharding)
            for k, a in enumerate(axes)
        ]
    return decisions


Specs = Mapping[str, Any] | Sequence[Mapping[str, Any]]


def make_plan(goal: Goal, specs: Specs, *, strict: bool = True) -> Plan:
    """The plan that shards the inputs as `specs` says (unmatched inputs replicated) and
    lets propagation decide everything inside the program.

    `specs` is one {path or glob: PartitionSpec} dict, or a list of them applied in order
    (a schedule: `[batch_rules, megatron_rules, zero_rules]`); for a path that several
    dicts match, the later dicts add their axes to the earlier ones' dims. With `strict`,
    a rule that matches no input is an error (rule lists written for a model family, like
    the expert plans, pass `strict=False`)."""
    prog, prop = goal.program, goal.propagator
    stages = [specs] if isinstance(specs, Mapping) else list(specs)
    decisions = []
    for k, stage in enumerate(stages):
        decisions += input_decisions(goal, stage, priority=2 * k, strict=strict)
    state, rejected = prop.apply_all(prop.empty(frozen=prog.inputs.values()), decisions)
    if rejected:
        d = rejected[0]
        raise PlanError(
            f"{prog.input_paths[d.value]}: cannot tile dim {d.dim} on {d.axis!r} "
            f"(the axis is already used on this input, or the dim size does not divide)"
        )
    return Plan(goal, state, goal.cost_model.cost(state))


def evaluate(goal: Goal, specs: Mapping[str, Any]) -> Cost:
    """The cost of sharding the inputs as `specs` says; the same as `plan(...).cost`."""
    return make_plan(goal, specs).cost
