"""From a checked `GoalSpec` to a `Goal`: import the two entry points, build the args, and
check the manual tile/replicate paths against the inputs (by their pytree paths, no trace)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from partir.dsl.checker import parse
from partir.dsl.errors import GoalError, Pos, not_utf8
from partir.dsl.goal_spec import EntryPoint, GoalSpec, ManualSpec
from partir.goal import Goal
from partir.ir.messages import did_you_mean, first_line
from partir.ir.program import arg_names, path_str
from partir.ir.specs import glob_match
from partir.strategies import Batch, Replicate, Tile


def load_goal(path: str | os.PathLike) -> Goal:
    """Read, check and compile a goal file; `file.py:function` names are relative to it.

    Raises `GoalError` for anything wrong in the file, `OSError` if it cannot be read."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")  # editors on Windows may begin it with a BOM
    except UnicodeDecodeError as e:
        raise not_utf8(path, data, e) from None
    return load_goal_text(text, filename=path, base_dir=os.path.dirname(os.path.abspath(path)))


def load_goal_text(text: str, filename: str = "<text>", base_dir: str | None = None) -> Goal:
    """Compile a goal file's text. `base_dir` is where `file.py:function` names are looked
    up; by default the folder of `filename`, or the working directory for "<text>"."""
    if base_dir is None and not filename.startswith("<"):
        base_dir = os.path.dirname(os.path.abspath(filename))
    return compile_spec(parse(text, filename), base_dir)


def compile_spec(spec: GoalSpec, base_dir: str | None = None) -> Goal:
    base = os.path.abspath(base_dir or os.getcwd())
    modules: dict[str, Any] = {}
    program = _resolve(spec, spec.program, base, modules)
    make_inputs = _resolve(spec, spec.inputs, base, modules)
    args = _call_inputs(spec, make_inputs)
    _check_signature(spec, program, args)
    shapes = input_shapes(spec, program, args)
    _check_manual(spec, shapes)
    _check_batch_inputs(spec, shapes)
    try:
        goal = Goal(
            program,
            args,
            spec.mesh,
            device=spec.device or "cpu",
            memory_limit=spec.memory_limit,
            objective=spec.objective,
            schedule=spec.schedule,
            search=spec.search,
            honour_constraints=spec.honour_constraints,
            filename=spec.filename,
            notes=spec.notes,
            devices=spec.devices,
            # tracing happens later: its errors are reported at the program statement
            statement_error=lambda key, message: spec.error(_statement_pos(spec, key), message),
        )
    except GoalError:
        raise
    except ValueError as e:  # the spec checks should have caught it; still say where
        raise spec.error(spec.positions.get("program", Pos()), first_line(e)) from None
    return goal


def _statement_pos(spec: GoalSpec, key: Any) -> Pos:
    """Where the goal file writes `key`: "program", "inputs", or a strategy of its schedule."""
    if key in ("program", "inputs"):
        return getattr(spec, key).pos
    for block in spec.axes:
        for s in block.strategies:
            if s.strategy == key:
                return s.pos
    for m in spec.manual:
        if m.strategy == key:
            return m.path_pos
    return Pos()


# ------------------------------------------------------------------------------ imports


def _load_file(path: str) -> Any:
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"_partir_goal_{stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)  # so the file can import its neighbours while it loads
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _standard(module: str | None) -> bool:
    """Whether `module` is Python's own (standard library, builtins): no model lives there."""
    top = (module or "").split(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


def _resolve(spec: GoalSpec, ep: EntryPoint, base: str, modules: dict[str, Any]) -> Callable:
    module_name, function = ep.module, ep.function
    refused = (
        f"'{ep.target}' is a function of Python's standard library, which defines no model; "
        "name a function of your own code (a goal file runs the functions it names, as a "
        "Python script would)"
    )
    if not module_name.endswith(".py") and _standard(module_name):
        raise spec.error(ep.pos, refused)
    try:
        if module_name.endswith(".py"):
            path = os.path.abspath(os.path.join(base, module_name))
            if not os.path.isfile(path):
                raise spec.error(ep.pos, f"cannot import '{ep.target}': there is no file {path}")
            if path not in modules:
                modules[path] = _load_file(path)
            obj = modules[path]
        else:
            obj = importlib.import_module(module_name)
    except GoalError:
        raise
    except SystemExit as e:
        raise spec.error(
            ep.pos, f"cannot import '{ep.target}': importing it called sys.exit({e.code!r})"
        ) from None
    except Exception as e:  # ImportError, SyntaxError, or whatever the module raised
        raise spec.error(ep.pos, f"cannot import '{ep.target}': {first_line(e)}") from None
    where = module_name
    for part in function.split("."):
        try:
            found = hasattr(obj, part)
            if found:
                obj = getattr(obj, part)
        except Exception as e:
            raise spec.error(ep.pos, f"cannot get '{ep.target}': {first_line(e)}") from None
        if not found:
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise spec.error(
                ep.pos, f"'{where}' has no attribute '{part}'{did_you_mean(part, names)}"
            )
        where = f"{where}:{part}" if where == module_name else f"{where}.{part}"
    if not callable(obj):
        raise spec.error(ep.pos, f"'{ep.target}' is not callable: it is a {type(obj).__name__}")
    if (inspect.isroutine(obj) or inspect.isclass(obj)) and _standard(
        getattr(obj, "__module__", None)
    ):  # `mymodule:os.system`
        raise spec.error(ep.pos, refused)
    return obj


def _call_inputs(spec: GoalSpec, make_inputs: Callable) -> tuple:
    ep = spec.inputs
    try:
        result = make_inputs(*ep.args, **ep.kwargs)
    except SystemExit as e:
        raise spec.error(ep.pos, f"{ep.call_text()} called sys.exit({e.code!r})") from None
    except Exception as e:
        raise spec.error(ep.pos, f"{ep.call_text()} raised {first_line(e)}") from None
    if isinstance(result, list):
        result = tuple(result)
    if not isinstance(result, tuple):
        raise spec.error(
            ep.pos,
            f"{ep.call_text()} returned a {type(result).__name__}; it must return the "
            "program's arguments as a tuple, like (params, opt_state, batch)",
        )
    return result


def _check_signature(spec: GoalSpec, program: Callable, args: tuple) -> None:
    try:
        signature = inspect.signature(program)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args)
    except TypeError as e:
        raise spec.error(
            spec.program.pos,
            f"'{spec.program.target}' cannot be called with the {len(args)} arguments that "
            f"'{spec.inputs.target}' returns: {e}",
        ) from None


def input_shapes(spec: GoalSpec, program: Callable, args: tuple) -> dict[str, tuple[int, ...]]:
    """{input path: shape}, named as the traced program names them, without tracing."""
    names = arg_names(program, len(args))
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        for name, arg in zip(names, args):
            leaves, _ = jax.tree_util.tree_flatten_with_path(arg)
            for keypath, leaf in leaves:
                if not _array_like(leaf):
                    raise spec.error(
                        spec.inputs.pos,
                        f"{spec.inputs.call_text()} returned a {type(leaf).__name__} at "
                        f"'{path_str(name, keypath)}'; the program's arguments hold arrays "
                        "(or jax.ShapeDtypeStruct, or numbers) only",
                    )
                shape = getattr(leaf, "shape", None)
                shapes[path_str(name, keypath)] = tuple(
                    int(d) for d in (shape if shape is not None else np.shape(leaf))
                )
    except GoalError:
        raise
    except Exception as e:
        raise spec.error(
            spec.inputs.pos, f"cannot read the inputs' shapes: {first_line(e)}"
        ) from None
    return shapes


def _array_like(leaf: Any) -> bool:
    if isinstance(leaf, bool | int | float | complex | np.generic):
        return True
    return hasattr(leaf, "shape") and hasattr(leaf, "dtype")


# ------------------------------------------------------------------------------ paths


def _matching(pattern: str, paths: Any) -> list[str]:
    return [p for p in paths if p == pattern or glob_match(pattern, p)]


def _no_match(pattern: str, shapes: dict[str, tuple[int, ...]]) -> str:
    hint = did_you_mean(pattern, shapes)
    if not hint:
        sample = ", ".join(f"'{p}'" for p in list(shapes)[:3])
        hint = f" (inputs look like {sample})" if sample else " (the program has no inputs)"
    return f"no input matches '{pattern}'{hint}"


def _check_manual(spec: GoalSpec, shapes: dict[str, tuple[int, ...]]) -> None:
    seen: dict[tuple[str, str], ManualSpec] = {}  # (input, axis) -> the first statement on it
    for m in spec.manual:
        s = m.strategy
        matched = _matching(s.path, shapes)
        if not matched:
            raise spec.error(m.path_pos, _no_match(s.path, shapes))
        for path in matched:
            first = seen.setdefault((path, s.axis), m)
            _check_manual_pair(spec, path, first, m)
        if not isinstance(s, Tile):
            continue
        size = spec.mesh[s.axis]
        for path in matched:
            shape = shapes[path]
            if s.dim >= len(shape):
                raise spec.error(
                    m.dim_pos or m.path_pos,
                    f"dim {s.dim} is out of range for '{path}' of shape {shape} "
                    f"(rank {len(shape)})",
                )
        for path in matched:
            shape = shapes[path]
            if size is not None and shape[s.dim] % size:  # None: a size the search chooses
                raise spec.error(
                    m.axis_pos,
                    f"mesh axis '{s.axis}' (size {size}) does not divide dim {s.dim} of "
                    f"'{path}' (size {shape[s.dim]}, shape {shape})",
                )


def _check_manual_pair(spec: GoalSpec, path: str, first: ManualSpec, m: ManualSpec) -> None:
    """`m` against the first tile/replicate statement on the same input and axis."""
    a, b = first.strategy, m.strategy
    if first is m or (isinstance(a, Tile) and isinstance(b, Tile) and a.dim == b.dim):
        return
    line = first.path_pos.line
    if isinstance(a, Tile) and isinstance(b, Tile):
        why = (
            f"'{path}' is already tiled on '{b.axis}' along dim {a.dim} (line {line}); "
            "a mesh axis tiles one dim of an input"
        )
    elif isinstance(b, Replicate) and isinstance(a, Replicate):
        return
    else:
        other = "tile" if isinstance(a, Tile) else "replicate"
        why = (
            f"'{path}' is both tiled and replicated on '{b.axis}' (the {other} statement "
            f"is at line {line}); keep one of them"
        )
    raise spec.error(m.axis_pos, why)


def _check_batch_inputs(spec: GoalSpec, shapes: dict[str, tuple[int, ...]]) -> None:
    for block in spec.axes:
        for s in block.strategies:
            if isinstance(s.strategy, Batch) and s.strategy.inputs is not None:
                for pattern in s.strategy.inputs:
                    if not _matching(pattern, shapes):
                        raise spec.error(s.arg_pos.get("inputs", s.pos), _no_match(pattern, shapes))
