"""`partir.jit`: a drop-in for `jax.jit` that plans the sharding at the first call.

The first call with a new set of input shapes and dtypes traces the function on
`jax.ShapeDtypeStruct`s (nothing allocated), searches a plan for the mesh, and compiles
`plan.jit()` under a `jax.jit` with the plan's in/out shardings and the caller's
`donate_argnums`; later calls with the same shapes go straight to that compiled function.
With `cache_dir`, plans are also kept on disk as `partir-plan/1` files named by a hash of
the program, the mesh and the planning options, so a new process skips the search.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from partir.goal import Goal, Search


def _as_tuple(x: int | Sequence[int] | None) -> tuple[int, ...]:
    if x is None:
        return ()
    return (x,) if isinstance(x, int) else tuple(x)


class Jit:
    """See `jit`. `.plan` is the plan of the latest call's input shapes; `.plans` all of
    them, by shapes; `.searches` counts the plans found by search (not read from disk)."""

    def __init__(
        self,
        fn: Callable,
        *,
        mesh: Any,
        schedule: Sequence[Any] = (),
        device: Any = "cpu",
        memory_limit: int | str | None = None,
        objective: str = "time",
        search: Search | None = None,
        static_argnums: int | Sequence[int] | None = None,
        donate_argnums: int | Sequence[int] | None = None,
        cache_dir: str | os.PathLike | None = None,
        devices: int | None = None,
    ) -> None:
        self.fn = fn
        self.mesh = mesh
        self.options = dict(
            device=device,
            memory_limit=memory_limit,
            objective=objective,
            schedule=list(schedule),
            search=search,
            devices=devices,
        )
        self.static_argnums = _as_tuple(static_argnums)
        self.donate_argnums = _as_tuple(donate_argnums)
        both = set(self.static_argnums) & set(self.donate_argnums)
        if both:
            raise ValueError(f"argument {sorted(both)[0]} is both static and donated")
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.plans: dict[Any, Any] = {}
        self.plan = None
        self.searches = 0
        self._compiled: dict[Any, Callable] = {}
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "fn")
        self.__doc__ = getattr(fn, "__doc__", None)

    def _split(self, args: tuple) -> tuple[tuple, list]:
        n = len(args)
        for i in self.static_argnums:
            if not -n <= i < n:
                raise ValueError(f"static_argnums has {i}, but the call passes {n} arguments")
        static = {i % n for i in self.static_argnums}
        return tuple((i, args[i]) for i in sorted(static)), [
            a for i, a in enumerate(args) if i not in static
        ]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(
                f"partir.jit({self.__name__}) takes positional arguments only; got "
                f"{sorted(kwargs)} by keyword"
            )
        statics, dynamic = self._split(args)
        leaves, tree = jax.tree_util.tree_flatten(dynamic)
        key = (
            tree,
            statics,
            tuple((getattr(x, "shape", ()), getattr(x, "dtype", type(x))) for x in leaves),
        )
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._build(key, statics, dynamic, len(args))
        else:
            self.plan = self.plans[key]
        return compiled(*dynamic)

    # -- the first call with new shapes --------------------------------------------------
    def _program(self, statics: tuple, nargs: int) -> Callable:
        """`fn` with its static arguments bound, named by its own parameter names."""
        fn, at = self.fn, dict(statics)

        def program(*dynamic: Any) -> Any:
            it = iter(dynamic)
            return fn(*[at[i] if i in at else next(it) for i in range(nargs)])

        try:
            params = list(inspect.signature(fn).parameters.values())[:nargs]
            positional = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
            if positional and len(params) == nargs:
                kept = [p for i, p in enumerate(params) if i not in at]
                program.__signature__ = inspect.Signature(kept)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            pass
        program.__qualname__ = getattr(fn, "__qualname__", "program")
        return program

    def _build(self, key: Any, statics: tuple, dynamic: list, nargs: int) -> Callable:
        from partir.ir.program import abstractify
        from partir.solver.spec_tree import plan_mesh

        abstract = jax.tree_util.tree_map(abstractify, tuple(dynamic))
        goal = Goal(self._program(statics, nargs), abstract, mesh=self.mesh, **self.options)
        plan = self._cached(goal) or self._solve(goal)
        mesh = plan_mesh(plan)
        static = {i for i, _ in statics}
        position = [i for i in range(nargs) if i not in static]  # dynamic index -> arg index
        donate = tuple(
            k for k, i in enumerate(position) if i in {d % nargs for d in self.donate_argnums}
        )
        ins, outs = plan.shardings(mesh)
        compiled = jax.jit(
            plan.jit(mesh), in_shardings=ins, out_shardings=outs, donate_argnums=donate
        )
        self.plans[key] = self.plan = plan
        self._compiled[key] = compiled
        return compiled

    def _solve(self, goal: Goal) -> Any:
        from partir import solve

        plan = solve(goal)
        self.searches += 1
        path = self._cache_path(goal)
        if path is not None:
            assert self.cache_dir is not None  # a plan file is only kept under cache_dir
            os.makedirs(self.cache_dir, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(plan.to_json())
            os.replace(tmp, path)
        return plan

    def _cached(self, goal: Goal) -> Any:
        from partir.ir.specs import PlanError
        from partir.solver.plan import Plan

        path = self._cache_path(goal)
        if path is None or not os.path.exists(path):
            return None
        with open(path) as f:
            text = f.read()
        try:
            return Plan.from_json(text, goal)
        except PlanError:  # a damaged or stale file: search again and write it anew
            return None

    def _cache_path(self, goal: Goal) -> str | None:
        """The plan file of this program and these options, under `cache_dir`."""
        if self.cache_dir is None:
            return None
        o = self.options
        parts = [
            str(goal.program.jaxpr),
            repr(goal.mesh),
            repr(goal.device),
            repr(goal.memory_limit),
            o["objective"],
            repr(o["schedule"]),
            repr(goal.search),
        ]
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
        return os.path.join(self.cache_dir, f"{self.__name__}-{digest}.json")


def jit(
    fn: Callable | None = None,
    *,
    mesh: Mapping[str, int | None] | Any,
    schedule: Sequence[Any] = (),
    device: Any = "cpu",
    memory_limit: int | str | None = None,
    objective: str = "time",
    search: Search | None = None,
    static_argnums: int | Sequence[int] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    cache_dir: str | os.PathLike | None = None,
    devices: int | None = None,
) -> Any:
    """A drop-in for `jax.jit` that plans the sharding at the first call.

    `mesh` is a `jax.sharding.Mesh` or {axis: size} (a mesh over `jax.devices()`; sizes
    None with `devices=N` let the search choose the shape); `schedule`, `device`,
    `memory_limit`, `objective` and `search` are `partir.Goal`'s. A plan is searched once
    per set of input shapes and dtypes (and static argument values) and kept; with
    `cache_dir`, on disk too. `static_argnums` and `donate_argnums` work as in `jax.jit`.
    Used bare or as a decorator: `@partir.jit(mesh=...)`."""
    options = dict(
        mesh=mesh,
        schedule=schedule,
        device=device,
        memory_limit=memory_limit,
        objective=objective,
        search=search,
        static_argnums=static_argnums,
        donate_argnums=donate_argnums,
        cache_dir=cache_dir,
        devices=devices,
    )
    if fn is None:
        return lambda f: Jit(f, **options)
    return Jit(fn, **options)
