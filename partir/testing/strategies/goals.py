"""Goals: `partir.Goal`s with a random schedule over their mesh axes."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from hypothesis import strategies as st

from partir import strategies as S
from partir.goal import Goal, Search
from partir.strategies.base import conflict
from partir.testing.strategies.meshes import meshes as _default_meshes
from partir.testing.strategies.programs import Forward
from partir.testing.strategies.programs import programs as _default_programs
from partir.testing.strategies.specs import input_shapes

SEARCHED = ("batch", "megatron", "zero", "auto", "fsdp")


def compatible(names: list[str]) -> bool:
    """Whether strategies of these names may share an axis (strategies.base.conflict)."""
    return conflict([strategy_named(name, "axis") for name in names]) is None


def strategy_named(name: str, axis: str, stage: int = 3) -> S.Strategy:
    if name == "zero":
        return S.zero(axis, stage=stage)
    makers: dict[str, Callable[[str], S.Strategy]] = {
        "batch": S.batch,
        "megatron": S.megatron,
        "auto": S.auto,
        "fsdp": S.fsdp,
        "expert": S.expert,
    }
    return makers[name](axis)


class Manual:
    """Tile and replicate statements that agree with each other and with the schedule's
    data parallelism. An input is tiled or kept whole on an axis, never both, and each axis
    at most once; the axes of a dim multiply to a divisor of it. Data inputs keep their
    batch dim for batch and fsdp, and are kept whole on no axis that batches them: either
    could leave batch nothing to tile, an error (see strategies.compile)."""

    def __init__(
        self,
        mesh: Mapping[str, int],
        shapes: Mapping[str, Sequence[int]],
        data: Collection[str],
        batch_axes: Collection[str],
    ) -> None:
        self.mesh, self.shapes = mesh, shapes
        self.data, self.batch_axes = set(data), set(batch_axes)
        self.tiled: dict[str, list[list[str]]] = {p: [[] for _ in s] for p, s in shapes.items()}
        self.replicated: dict[str, set[str]] = {p: set() for p in shapes}

    def tile_dims(self, paths: Sequence[str], axis: str) -> list[int]:
        """The dims that every one of `paths` may have tiled on `axis`."""
        rank = min(len(self.shapes[p]) for p in paths)
        return [d for d in range(rank) if all(self._fits(p, d, axis) for p in paths)]

    def _fits(self, path: str, dim: int, axis: str) -> bool:
        dims = self.tiled[path]
        if axis in self.replicated[path] or any(axis in axes for axes in dims):
            return False
        if dim == 0 and path in self.data and self.batch_axes:
            return False
        return (
            self.shapes[path][dim] % (math.prod(self.mesh[a] for a in dims[dim]) * self.mesh[axis])
            == 0
        )

    def can_replicate(self, paths: Sequence[str], axis: str) -> bool:
        """Whether `paths` may be kept whole on `axis`."""
        if axis in self.batch_axes and self.data.intersection(paths):
            return False
        return not any(axis in axes for p in paths for axes in self.tiled[p])

    def tile(self, paths: Sequence[str], dim: int, axis: str) -> None:
        for p in paths:
            self.tiled[p][dim].append(axis)

    def replicate(self, paths: Sequence[str], axis: str) -> None:
        for p in paths:
            self.replicated[p].add(axis)


@st.composite
def schedules(
    draw,
    mesh: Mapping[str, int],
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch_sizes: Collection[int] | None = None,
    data: Collection[str] = (),
) -> list[S.Strategy]:
    """A schedule over some of the mesh axes, in random order, 1-2 strategies on each
    (batch, megatron, zero(stage), auto, fsdp); with `shapes` ({path: shape}), sometimes
    manual `tile` / `replicate` statements that are valid for those inputs and agree with
    each other (see `Manual`). With `batch_sizes` (the data inputs' leading dims), batch and
    fsdp only go on axes that can split one of them (after the batch axes before): elsewhere
    they are an error. `data`: the paths of the data inputs, which the manual statements
    leave to batch and fsdp (their batch dim, and whole on no axis that batches)."""
    axes = draw(st.permutations(list(mesh)))[: draw(st.integers(0, len(mesh)))]
    schedule: list[S.Strategy] = []
    split = 1  # how many ways the batch axes so far split the data
    batch_axes = []
    for axis in axes:
        names = draw(
            st.lists(st.sampled_from(SEARCHED), min_size=1, max_size=2, unique=True).filter(
                compatible
            )
        )
        if batch_sizes is not None:
            if any(b % (split * mesh[axis]) == 0 for b in batch_sizes):
                split *= mesh[axis] if {"batch", "fsdp"} & set(names) else 1
            else:
                names = [n for n in names if n not in ("batch", "fsdp")]
        if {"batch", "fsdp"} & set(names):
            batch_axes.append(axis)
        for name in names:
            stage = draw(st.sampled_from((3, 1, 2))) if name == "zero" else 3
            schedule.append(strategy_named(name, axis, stage))
    if shapes:
        manual = Manual(mesh, shapes, data, batch_axes)
        for _ in range(draw(st.integers(0, 2))):
            path = draw(st.sampled_from(sorted(shapes)))
            axis = draw(st.sampled_from(sorted(mesh)))
            fits = manual.tile_dims([path], axis)
            if fits and draw(st.booleans()):
                dim = draw(st.sampled_from(fits))
                manual.tile([path], dim, axis)
                schedule.append(S.tile(path, dim, axis))
            elif manual.can_replicate([path], axis):
                manual.replicate([path], axis)
                schedule.append(S.replicate(path, axis))
    return schedule


@st.composite
def goals(
    draw,
    programs: st.SearchStrategy | None = None,
    meshes: st.SearchStrategy | None = None,
    *,
    train_step: bool | None = None,
    search: Search | None = None,
    device: str = "cpu",
    memory_limit: int | str | None = None,
    manual: bool = True,
) -> Goal:
    """A `partir.Goal`: a program of `programs` (default `programs(train_step)`), a mesh of
    `meshes` (default `meshes()`), a random `schedules()` over its axes (with manual
    tile/replicate when `manual`), and `search` (default `Search(episodes=20, seed=...)`,
    a random seed). Generated forward programs name their data inputs (`data/**`) so that
    `batch` leaves their weights alone."""
    fn, args = draw(programs if programs is not None else _default_programs(train_step))
    mesh = draw(meshes if meshes is not None else _default_meshes())
    every = input_shapes((fn, args))
    data = "data/" if isinstance(fn, Forward) else "batch/"  # see programs()
    batch_sizes = {s[0] for p, s in every.items() if p.startswith(data) and s}
    data_paths = [p for p in every if p.startswith(data)]
    schedule = draw(schedules(mesh, every if manual else None, batch_sizes, data_paths))
    if search is None:
        search = Search(episodes=20, seed=draw(st.integers(0, 2**16)))
    data_inputs = ["data/**"] if isinstance(fn, Forward) else None
    return Goal(
        fn,
        args,
        mesh,
        device=device,
        memory_limit=memory_limit,
        schedule=schedule,
        search=search,
        data_inputs=data_inputs,
    )
