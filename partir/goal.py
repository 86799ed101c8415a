"""`Goal`: what the user wants planned — program, args, mesh, device, limit, schedule."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from partir.dsl.errors import GoalError, StatementPlanError
from partir.ir import units
from partir.ir.constraints import constraint_decisions
from partir.ir.cost import CostModel
from partir.ir.devices import Device, get_device
from partir.ir.gc_pause import paused_gc
from partir.ir.groups import state_layouts
from partir.ir.messages import did_you_mean
from partir.ir.program import Program, TraceError, trace
from partir.ir.propagate import Propagator
from partir.ir.specs import PlanError, glob_match
from partir.ir.units import UnitError


def parse_bytes(x: int | float | str | None) -> int | None:
    """A memory limit: a number of bytes, or a size written as goal files write it
    (`32GiB`, `1.5TB`, `500MB`; `partir.ir.units`)."""
    if x is None:
        return None
    if isinstance(x, bool):
        raise ValueError(f"a memory limit is a positive number of bytes, not {x!r}")
    if isinstance(x, int | float):
        value = x
    else:
        try:
            q = units.read(x.strip())
        except UnitError as e:
            raise ValueError(
                f"cannot read {x!r} as a size ({e}); write it like 32GiB or 500MB"
            ) from None
        if q.kind not in ("size", "number"):
            raise ValueError(f"{x!r} is {q.describe()}, not a size; write it like 32GiB or 500MB")
        value = q.value
    if not 0 < value <= 1e300:  # also nan and inf
        raise ValueError(f"a memory limit is a positive number of bytes, not {x!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Search:
    """Search budget and options. With no `episodes` or `seconds`, the search stops by
    itself once it converges; `seconds` caps it. The axes share both budgets, an axis
    leaving what it did not use to the later ones. When the shallow copies of a deep model
    mispredict their plan (see solver/shallow_copies), the whole program is searched within what is
    left of `seconds`, with `episodes` of its own; `plan.search["episodes"]` counts both."""

    seconds: float | None = None
    episodes: int | None = None
    seed: int = 0
    prune: str | None = "cpsat"
    rollout: Literal["random", "greedy"] = "random"
    patience: int | None = 200
    uct_c: float = 1.4
    proxy: bool = True  # search a deep model on its 1- and 2-layer copies (solver/shallow_copies)

    def __post_init__(self) -> None:
        if self.seconds is not None and not 0 < self.seconds < float("inf"):
            raise ValueError(
                f"seconds must be a positive number, not {self.seconds!r} (None: no time cap)"
            )
        if self.episodes is not None and (
            isinstance(self.episodes, bool)
            or not isinstance(self.episodes, int)
            or self.episodes < 1
        ):
            raise ValueError(
                f"episodes must be a whole number >= 1, not {self.episodes!r} (None: until "
                "the search converges)"
            )
        if not _whole(self.seed):
            raise ValueError(f"seed must be a whole number, not {self.seed!r}")
        if self.patience is not None and not (_whole(self.patience) and self.patience >= 1):
            raise ValueError(
                f"patience must be a whole number >= 1, not {self.patience!r} (None: search "
                "until `seconds` or `episodes`)"
            )
        if not (
            isinstance(self.uct_c, int | float)
            and not isinstance(self.uct_c, bool)
            and 0 <= self.uct_c < float("inf")
        ):
            raise ValueError(f"uct_c must be a finite number >= 0, not {self.uct_c!r}")
        if not isinstance(self.proxy, bool):
            raise ValueError(f"proxy must be True or False, not {self.proxy!r}")
        if self.prune not in (None, "cpsat"):
            raise ValueError(f"prune must be 'cpsat' or None, not {self.prune!r}")
        if self.rollout not in ("random", "greedy"):
            raise ValueError(f"rollout must be 'random' or 'greedy', not {self.rollout!r}")


_SHARED_TRACES: list[dict] = []


@contextlib.contextmanager
def shared_traces():
    """Within it, goals of one function on args of the same shapes and dtypes share one
    trace (the mesh search solves one program on many meshes, with its shallow copies)."""
    _SHARED_TRACES.append(_SHARED_TRACES[-1] if _SHARED_TRACES else {})
    try:
        yield
    finally:
        _SHARED_TRACES.pop()


def _trace_key(fn: Callable, args: Sequence[Any]) -> tuple | None:
    import jax

    leaves, tree = jax.tree_util.tree_flatten(tuple(args))
    sig = tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x)))) for x in leaves)
    try:
        hash((fn, tree, sig))
    except TypeError:  # an unhashable function object: trace it every time
        return None
    return fn, tree, sig


def read_mesh(mesh: Any) -> tuple[Any, dict[str, int | None]]:
    """(the jax Mesh or None, {axis: size or None}) from a dict or a `jax.sharding.Mesh`."""
    if hasattr(mesh, "axis_names") and hasattr(mesh, "devices") and hasattr(mesh, "shape"):
        return mesh, {str(k): int(v) for k, v in mesh.shape.items()}
    if not isinstance(mesh, Mapping):
        raise TypeError(
            f"mesh must be a dict {{axis: size}} or a jax.sharding.Mesh, not {type(mesh).__name__}"
        )
    out: dict[str, int | None] = {}
    for name, size in mesh.items():
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(
                f"mesh axis {name!r} has size {size!r}; sizes must be whole numbers >= 1 "
                "(or None, with devices=N, for partir to choose)"
            )
        out[str(name)] = size
    return None, out


def check_devices(mesh: Mapping[str, int | None], devices: int | None) -> int | None:
    """`devices` checked against the mesh: needed exactly when some axis has no size."""
    open_ = [a for a, s in mesh.items() if s is None]
    if devices is None:
        if open_:
            raise ValueError(
                f"mesh axes {open_} have no size: pass devices=N, the number of devices "
                "whose factorizations partir tries"
            )
        return None
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be a whole number >= 1, not {devices!r}")
    fixed = 1
    for s in mesh.values():
        fixed *= s or 1
    if devices % fixed or (not open_ and devices != fixed):
        raise ValueError(
            f"the mesh {dict(mesh)} cannot cover devices={devices}: the fixed axes' sizes "
            f"multiply to {fixed}"
        )
    return devices


def check_schedule(
    schedule: Sequence[Any],
    mesh: Mapping[str, int | None],
    error: Callable[[Any, str], Exception],
) -> tuple[Any, ...]:
    """The schedule, checked: strategies only, each on an axis of the mesh, and none that
    contradicts another on its axis (`error(strategy, message)` makes the exception, at the
    strategy's statement when the goal came from a goal file)."""
    from partir.strategies.base import Strategy, conflict

    if isinstance(schedule, str | Strategy) or not isinstance(schedule, Sequence):
        raise ValueError(
            f"schedule must be a list of strategies, not {type(schedule).__name__}: write "
            "schedule=[partir.strategies.batch('data'), ...]"
        )
    for k, s in enumerate(schedule):
        if not isinstance(s, Strategy):
            raise ValueError(
                f"schedule[{k}] is {s!r} ({type(s).__name__}), not a strategy: write "
                "partir.strategies.batch('data') and the like"
            )
        if s.axis not in mesh:
            raise error(
                s,
                f"strategy {s.name} names mesh axis {s.axis!r}, which the mesh {dict(mesh)} "
                f"lacks{did_you_mean(s.axis, mesh)}",
            )
    for axis in mesh:
        on_axis = [s for s in schedule if s.axis == axis]
        for k, s in enumerate(on_axis):
            why = conflict(on_axis[: k + 1])
            if why is not None:
                raise error(s, why)
    return tuple(schedule)


# argument names that hold parameters, not data, in a program that carries no state
PARAMETER_ARGS = frozenset(
    {"params", "parameters", "variables", "weights", "model", "state", "opt_state", "optimizer"}
)


def _arg_heads(prog: Program) -> list[str]:
    return list(dict.fromkeys(p.split("/", 1)[0] for p in prog.inputs))


def _uncarried_data(prog: Program) -> list[str] | None:
    """For a program that carries no state: the arguments that are data (those not named
    like parameters). None when the program carries state, or when no argument is named
    like parameters (every input is then data, as with carried state left out)."""
    if prog.carried:
        return None
    heads = _arg_heads(prog)
    data = [a for a in heads if a not in PARAMETER_ARGS]
    return data if data and len(data) < len(heads) else None


def _whole(x: Any) -> bool:
    """An int (numpy's too), not a bool."""
    import numbers

    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


class Goal:
    """A planning problem, a frozen value: checked when built (mesh, devices, memory limit,
    objective, the schedule's strategies and their conflicts), changed only by `replace`.
    What is derived from it (the traced program, propagator and cost model) is computed
    lazily, once, and cached beside the fields; `replace` keeps the trace when the program
    and its arguments stay the same."""

    _FIELDS = (
        "program",
        "args",
        "mesh",
        "device",
        "memory_limit",
        "objective",
        "schedule",
        "search",
        "data_inputs",
        "donate",
        "honour_constraints",
        "filename",
        "notes",
        "devices",
        "statement_error",
    )

    def __init__(
        self,
        program: Callable,
        args: Sequence[Any],
        mesh: Mapping[str, int | None] | Any,
        device: str | Device = "cpu",
        memory_limit: int | str | None = None,
        objective: str = "time",
        schedule: Sequence[Any] = (),
        search: Search | None = None,
        *,
        data_inputs: Sequence[str] | None = None,
        donate: bool = False,
        honour_constraints: bool = True,
        filename: str | None = None,
        notes: Sequence[str] = (),
        devices: int | None = None,
        statement_error: Callable[[Any, str], Exception] | None = None,
    ) -> None:
        self._given = {
            "program": program,
            "args": args,
            "mesh": mesh,
            "device": device,
            "memory_limit": memory_limit,
            "objective": objective,
            "schedule": schedule,
            "search": search,
            "data_inputs": data_inputs,
            "donate": donate,
            "honour_constraints": honour_constraints,
            "filename": filename,
            "notes": notes,
            "devices": devices,
            "statement_error": statement_error,
        }
        self.fn = program
        self.args = tuple(args)
        # a jax.sharding.Mesh: its axes and sizes, and plan.jit runs on its devices
        self.jax_mesh, self.mesh = read_mesh(mesh)
        self.devices = check_devices(self.mesh, devices)
        self.device = get_device(device) if isinstance(device, str) else device
        # no limit given: the device's HBM, so the search never prefers a plan that cannot run
        self.memory_limit = parse_bytes(memory_limit)
        self.memory_limit_source = (
            "the goal" if memory_limit is not None else (f"the {self.device.name} HBM")
        )
        if self.memory_limit is None:
            self.memory_limit = self.device.hbm
        if objective not in ("time", "memory", "comm"):
            raise ValueError(f"objective must be 'time', 'memory' or 'comm', not {objective!r}")
        self.objective = objective
        self.search = search or Search()
        if not isinstance(self.search, Search):
            raise ValueError(f"search must be a partir.Search, not {type(search).__name__}")
        self._data_inputs = list(data_inputs) if data_inputs is not None else None
        self.donate = donate
        # the user's with_sharding_constraint / reshard calls: decisions of the highest
        # priority (True), or ignored and replaced by partir's sharding in plan.jit (False)
        self.honour_constraints = honour_constraints
        self.filename = filename
        # things a report should tell the user (an unused axis...); tracing may add some
        self._notes = list(notes)
        # from goal files: (statement, message) -> the error at that statement's place; the
        # statement is "program", "inputs" or one of the schedule's strategies
        self.statement_error = statement_error
        self.schedule = check_schedule(schedule, self.mesh, self.strategy_error)
        self._frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a Goal is frozen: make a new one with goal.replace({name}=...)")
        object.__setattr__(self, name, value)

    def replace(self, **changes: Any) -> Goal:
        """A new goal with `changes` to the constructor's arguments (checked as the
        constructor checks them); it shares this goal's trace when `program` and `args`
        stay the same."""
        unknown = set(changes) - set(self._FIELDS)
        if unknown:
            raise TypeError(
                f"Goal.replace() got unknown fields {sorted(unknown)}; fields: "
                + ", ".join(self._FIELDS)
            )
        new = Goal(**{**self._given, **changes})
        same_trace = "program" not in changes and "args" not in changes
        if same_trace and "program" in self.__dict__:
            new.__dict__["program"] = self.__dict__["program"]
            new._notes[:] = self._notes
        return new

    @property
    def notes(self) -> tuple[str, ...]:
        """What a report should tell the user: the given notes and those tracing found."""
        return tuple(self._notes)

    def strategy_error(self, strategy: Any, message: str) -> Exception:
        """A PlanError about one strategy of the schedule, at its statement in the goal file
        (FILE:LINE:COL) when the goal came from one."""
        if self.statement_error is None:
            return PlanError(message)
        e = self.statement_error(strategy, message)
        return StatementPlanError.of(e) if isinstance(e, GoalError) else e

    @property
    def num_devices(self) -> int:
        if self.devices is not None:
            return self.devices
        return math.prod(self.sizes.values())  # devices is None only when every axis has a size

    @property
    def open_axes(self) -> list[str]:
        """The mesh axes whose size the search chooses (`mesh={"data": None}, devices=N`)."""
        return [a for a, s in self.mesh.items() if s is None]

    @functools.cached_property
    def program(self) -> Program:
        key = _trace_key(self.fn, self.args) if _SHARED_TRACES else None
        if key is not None and key in _SHARED_TRACES[-1]:
            return _SHARED_TRACES[-1][key]
        try:
            with paused_gc():
                prog = trace(self.fn, self.args)
        except SystemExit as e:
            name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
            err: Exception | None = TraceError(f"tracing {name} called sys.exit({e.code!r})")
        except TraceError as e:
            err = e
        else:
            err = None
        if err is not None:
            if self.statement_error is None:
                raise err from None
            raise self.statement_error(
                "program", f"{err}; check the program and inputs statements"
            ) from None
        data = _uncarried_data(prog)
        if data is not None and self._data_inputs is None and self._batches_by_default():
            self._notes.append(
                f"note: the program carries no state (no output is the next version of an "
                f"input), so batch takes the inputs of {', '.join(map(repr, data))} as data "
                f"and keeps {', '.join(repr(a) for a in _arg_heads(prog) if a not in data)} "
                "replicated; name the data with batch(inputs=...) to choose otherwise"
            )
        if key is not None:
            _SHARED_TRACES[-1][key] = prog
        return prog

    @property
    def data_inputs(self) -> list[str] | None:
        """Globs of the data inputs the batch strategies tile. None: every input that is
        not carried state; but for a program that carries no state (a forward pass,
        `apply(params, x)`), the arguments named like parameters (`params`, `variables`,
        `model`, ...) are not data."""
        if self._data_inputs is not None:
            return self._data_inputs
        data = _uncarried_data(self.program)
        return None if data is None else [g for a in data for g in (a, f"{a}/**")]

    def _batches_by_default(self) -> bool:
        from partir.strategies import FSDP, Batch

        return any(
            isinstance(s, FSDP) or (isinstance(s, Batch) and s.inputs is None)
            for s in self.schedule
        )

    @property
    def sizes(self) -> dict[str, int]:
        """The mesh as {axis: size}, for a goal whose every axis has a size (see open_axes)."""
        if self.open_axes:
            raise ValueError(
                f"the mesh {self.mesh} has axes of no size yet; partir.solve chooses them "
                "(or give every axis a size)"
            )
        return {a: s for a, s in self.mesh.items() if s is not None}

    @functools.cached_property
    def propagator(self) -> Propagator:
        sizes = self.sizes
        seed = constraint_decisions(self.program, sizes) if self.honour_constraints else []
        with paused_gc():
            # the seed reaches the state's parameters only with the plan's decisions (see
            # Propagator.seeded): reaching them first, MaxText's activation constraints
            # chose every weight's sharding before the search could
            unseeded = state_layouts(self.program) - {d.value for d in seed} if seed else ()
            return Propagator(self.program, sizes, seed, self.replicated(), unseeded)

    def replicated(self) -> dict[int, set[str]]:
        """The axes the schedule's `replicate` statements keep off each input (value id)."""
        from partir.strategies import Replicate

        out: dict[int, set[str]] = {}
        for s in self.schedule:
            if isinstance(s, Replicate):
                for path, vid in self.program.inputs.items():
                    if glob_match(s.path, path):
                        out.setdefault(vid, set()).add(s.axis)
        return out

    @functools.cached_property
    def cost_model(self) -> CostModel:
        with paused_gc():
            return CostModel(
                self.propagator, self.device, memory_limit=self.memory_limit, donate=self.donate
            )

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"Goal({name}, mesh={self.mesh}, device={self.device.name!r})"
