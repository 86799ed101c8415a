"""Hypothesis strategies for property-based suites of partir and of partir's users.

    from hypothesis import given
    from partir.testing import check_plan, meshes, programs, specs

    @given(st.data())
    def test_plans_are_valid(data):
        fn, args = data.draw(programs())
        mesh = data.draw(meshes())
        goal = partir.Goal(fn, args, mesh)
        check_plan(goal, partir.plan(goal, data.draw(specs(goal))))

- `meshes()`: {axis: size} with 1-3 axes whose sizes multiply to at most 8.
- `programs()`: `(fn, args)`: small random JAX functions made of primitives partir has
  sharding rules for, args as `ShapeDtypeStruct` pytrees whose dims are small powers of 2;
  `programs(train_step=True)` gives Adam train steps `(params, opt_state, batch) ->
  (params, opt_state, {"loss": ...})`.
- `specs(goal)` / `specs((fn, args), mesh)`: random valid input shardings {path: P(...)}.
- `goals()`: `partir.Goal`s with a random schedule over the mesh axes and a small budget.
- `goal_texts()`: `(text, goal)`: valid goal files and the Goal each one means.
- `bad_goal_texts()`: goal files with one mistake each (a typo in a keyword, a wrong unit,
  a missing brace, an unknown axis, a dim out of range, a bad strategy, ...).

Everything shrinks towards small, readable examples: a generated function's repr is the
list of its steps (`Forward(dense x[8,16]: dense(8) -> act(tanh) -> out y)`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from hypothesis import strategies as st
from jax.sharding import PartitionSpec

from partir import strategies as S
from partir.goal import Goal, Search
from partir.ir.devices import CATALOG as DEVICES
from partir.ir.program import Program, arg_names, path_str
from partir.strategies.base import conflict

__all__ = [
    "AXIS_NAMES",
    "BAD_GOAL_KINDS",
    "Forward",
    "GeneratedProgram",
    "Step",
    "TrainStep",
    "bad_goal_texts",
    "goal_texts",
    "goals",
    "input_shapes",
    "meshes",
    "programs",
    "schedules",
    "shardings",
    "specs",
]

AXIS_NAMES = ("x", "y", "z", "data", "model", "expert")
MESH_SIZES = (2, 1, 4, 8)  # shrinks towards 2: the smallest axis that shards anything

# ------------------------------------------------------------------------------ meshes


def meshes(
    max_axes: int = 3,
    max_devices: int = 8,
    *,
    min_axes: int = 1,
    names: Sequence[str] = AXIS_NAMES,
    sizes: Sequence[int] = MESH_SIZES,
) -> st.SearchStrategy[dict[str, int]]:
    """{axis name: size}: `min_axes` to `max_axes` axes with distinct names from `names`,
    sizes from `sizes` (1, 2, 4, 8), whose product is at most `max_devices` (fewer than
    `max_axes` axes when the sizes leave no room for more)."""
    if not 1 <= min_axes <= max_axes <= len(names):
        raise ValueError(f"need 1 <= min_axes <= max_axes <= {len(names)} (the names)")
    if max_devices < 1 or not sizes or min(sizes) < 1 or min(sizes) ** min_axes > max_devices:
        raise ValueError(
            f"{min_axes} axes of sizes {tuple(sizes)} do not fit max_devices={max_devices}"
        )

    @st.composite
    def draw_mesh(draw) -> dict[str, int]:
        n = draw(st.integers(min_axes, max_axes))
        order = draw(st.permutations(list(names)))
        mesh, budget, smallest = {}, max_devices, min(sizes)
        for k, name in enumerate(order[:n]):
            needed = smallest ** max(0, min_axes - k - 1)  # room for the axes still owed
            fits = [s for s in sizes if s * needed <= budget]
            if not fits:
                break
            size = draw(st.sampled_from(fits))
            mesh[name] = size
            budget //= size
        return mesh

    return draw_mesh()


# ------------------------------------------------------------------------------ programs

_ACTIVATIONS = {
    "tanh": jnp.tanh,
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
    "gelu": jax.nn.gelu,
    "sin": jnp.sin,
    "square": jnp.square,
    "neg": jnp.negative,
    "gauss": lambda x: jnp.exp(-x * x),
}
_NORMS = ("center", "rms")
_WIDTHS = (8, 16, 4, 32, 2)
_MAX_DIM = 64
_ADAM = optax.adam(1e-3)

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Step:
    """One layer of a generated program, acting on the running activation `h`:

    dense(n) h @ w · mlp(n) h + tanh(h @ w_in) @ w_out · bias h + b · scale h * s ·
    act(f) f(h) · norm(center|rms) · attend softmax(h h^T) h over the middle dim ·
    sum(axis) · broadcast(k) h[:, None] to k copies · split(f) last dim into (f, d/f) ·
    merge the last two dims · swap the last two dims · transpose (rank 2) ·
    take(k) jnp.take(h, idx, axis=-1) with an int index input · concat [h, tanh(h)]."""

    kind: str
    size: int = 0
    fn: str = ""

    def __str__(self) -> str:
        arg = self.fn or (str(self.size) if self.size else "")
        return f"{self.kind}({arg})" if arg else self.kind


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a generated program computes; its `args` follow from it."""

    start: str  # "dense" x[B,D] | "seq" x[B,T,D] | "embed" table[tokens[B]] | "embed_seq"
    batch: int
    width: int
    seq: int = 0
    vocab: int = 0
    steps: tuple[Step, ...] = ()
    outputs: tuple[str, ...] = ("y",)  # forward: "y" (h), "sum" (a scalar), "max" (last dim)
    target: bool = False  # train step: the loss regresses h onto an input batch/y

    def layout(self) -> tuple[dict, dict, Shape]:
        """(param shapes, data shapes, final activation shape); int data is named idx*
        or tokens, everything else is float32."""
        params: dict[str, Any] = {}
        data: dict[str, Shape] = {}
        b, d, t = self.batch, self.width, self.seq
        if self.start == "dense":
            data["x"], shape = (b, d), (b, d)
        elif self.start == "seq":
            data["x"], shape = (b, t, d), (b, t, d)
        elif self.start == "embed":
            data["tokens"], params["embed"], shape = (b,), (self.vocab, d), (b, d)
        else:
            data["tokens"], params["embed"], shape = (b, t), (self.vocab, d), (b, t, d)
        for i, step in enumerate(self.steps):
            shape, p, x = _step_shapes(step, shape)
            if p:
                params[f"l{i}"] = p
            data.update({f"{k}{i}": v for k, v in x.items()})
        if self.target:
            data["y"] = shape
        return params, data, shape


def _step_shapes(step: Step, shape: Shape) -> tuple[Shape, dict[str, Shape], dict[str, Shape]]:
    """The activation's shape after `step`, and the params and data inputs it adds."""
    d, k, n = shape[-1], step.kind, step.size
    if k == "dense":
        return shape[:-1] + (n,), {"w": (d, n)}, {}
    if k == "mlp":
        return shape, {"w_in": (d, n), "w_out": (n, d)}, {}
    if k == "bias":
        return shape, {"b": (d,)}, {}
    if k == "scale":
        return shape, {"scale": (d,)}, {}
    if k in ("act", "norm", "attend"):
        return shape, {}, {}
    if k == "sum":
        return shape[:n] + shape[n + 1 :], {}, {}
    if k == "broadcast":
        return (shape[0], n) + shape[1:], {}, {}
    if k == "split":
        return shape[:-1] + (n, d // n), {}, {}
    if k == "merge":
        return shape[:-2] + (shape[-2] * d,), {}, {}
    if k == "swap":
        return shape[:-2] + (d, shape[-2]), {}, {}
    if k == "transpose":
        return (shape[1], shape[0]), {}, {}
    if k == "take":
        return shape[:-1] + (n,), {}, {"idx": (n,)}
    if k == "concat":
        return shape[:-1] + (2 * d,), {}, {}
    raise ValueError(f"unknown step {step}")


def _step_options(shape: Shape) -> list[str]:
    """The step kinds that keep every dim a power of 2 in [2, 64] and the rank in {2, 3}."""
    d, rank = shape[-1], len(shape)
    out = ["dense", "act", "bias", "mlp", "norm", "scale", "take"]
    if rank == 3:
        out += ["attend", "sum", "swap"]
        if shape[-2] * d <= _MAX_DIM:
            out.append("merge")
    if rank == 2:
        out += ["broadcast", "transpose"]
        if d % 4 == 0:
            out.append("split")
    if 2 * d <= _MAX_DIM:
        out.append("concat")
    return out


def _apply_step(step: Step, h: jax.Array, p: Mapping[str, jax.Array], idx: Any) -> jax.Array:
    k = step.kind
    if k == "dense":
        return h @ p["w"]
    if k == "mlp":
        return h + jnp.tanh(h @ p["w_in"]) @ p["w_out"]
    if k == "bias":
        return h + p["b"]
    if k == "scale":
        return h * p["scale"]
    if k == "act":
        return _ACTIVATIONS[step.fn](h)
    if k == "norm":
        if step.fn == "center":
            return h - jnp.mean(h, axis=-1, keepdims=True)
        return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)
    if k == "attend":
        scores = jnp.einsum("btd,bsd->bts", h, h) / math.sqrt(h.shape[-1])
        return jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores, axis=-1), h)
    if k == "sum":
        return jnp.sum(h, axis=step.size)
    if k == "broadcast":
        return jnp.broadcast_to(h[:, None, :], (h.shape[0], step.size, h.shape[1]))
    if k == "split":
        return h.reshape(h.shape[:-1] + (step.size, h.shape[-1] // step.size))
    if k == "merge":
        return h.reshape(h.shape[:-2] + (h.shape[-2] * h.shape[-1],))
    if k == "swap":
        return jnp.swapaxes(h, -1, -2)
    if k == "transpose":
        return h.T
    if k == "take":
        return jnp.take(h, idx, axis=-1)
    if k == "concat":
        return jnp.concatenate([h, jnp.tanh(h)], axis=-1)
    raise ValueError(f"unknown step {step}")


def _sds(shapes: Mapping[str, Any], ints: Sequence[str] = ()) -> dict:
    out = {}
    for name, shape in shapes.items():
        if isinstance(shape, Mapping):
            out[name] = _sds(shape)
        else:
            int_input = name in ints or name.startswith("idx") or name == "tokens"
            out[name] = jax.ShapeDtypeStruct(shape, jnp.int32 if int_input else jnp.float32)
    return out


class GeneratedProgram:
    """A random program of `programs()`: callable, and its repr says what it computes."""

    data_name = "data"

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    def example_args(self) -> tuple:
        raise NotImplementedError

    def _net(self, params: Mapping, data: Mapping) -> jax.Array:
        r = self.recipe
        h = params["embed"][data["tokens"]] if r.start.startswith("embed") else data["x"]
        for i, step in enumerate(r.steps):
            h = _apply_step(step, h, params.get(f"l{i}", {}), data.get(f"idx{i}"))
        return h

    def __repr__(self) -> str:
        r = self.recipe
        params, data, _ = r.layout()
        first = "tokens" if r.start.startswith("embed") else "x"
        head = f"{r.start} {first}{list(data[first])}"
        if r.start.startswith("embed"):
            head += f" embed{list(params['embed'])}"
        steps = " -> ".join(str(s) for s in r.steps) or "identity"
        if isinstance(self, TrainStep):
            tail = "loss mse(h, y)" if r.target else "loss mean(h^2)"
        else:
            tail = "out " + ",".join(r.outputs)
        return f"{type(self).__name__}({head}: {steps} -> {tail})"


class Forward(GeneratedProgram):
    """`fn(params, data) -> {"y": h, ...}`."""

    def example_args(self) -> tuple:
        params, data, _ = self.recipe.layout()
        return _sds(params), _sds(data)

    def __call__(self, params, data):
        h = self._net(params, data)
        out = {"y": h}
        if "sum" in self.recipe.outputs:
            out["sum"] = jnp.sum(h)
        if "max" in self.recipe.outputs:
            out["max"] = jnp.max(h, axis=-1)
        return out


class TrainStep(GeneratedProgram):
    """`fn(params, opt_state, batch) -> (params, opt_state, {"loss": loss})`, with Adam."""

    data_name = "batch"

    def example_args(self) -> tuple:
        params, data, _ = self.recipe.layout()
        p = _sds(params)
        return p, jax.eval_shape(_ADAM.init, p), _sds(data)

    def loss(self, params, batch):
        h = self._net(params, batch)
        if self.recipe.target:
            return jnp.mean(jnp.square(h - batch["y"]))
        return jnp.mean(jnp.square(h))

    def __call__(self, params, opt_state, batch):
        loss, grads = jax.value_and_grad(self.loss)(params, batch)
        updates, opt_state = _ADAM.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}


@st.composite
def _recipes(draw, train_step: bool | None, max_steps: int) -> GeneratedProgram:
    train = draw(st.booleans()) if train_step is None else bool(train_step)
    start = draw(st.sampled_from(("dense", "seq", "embed", "embed_seq")))
    batch = draw(st.sampled_from((8, 4, 16, 2)))
    width = draw(st.sampled_from((16, 8, 4, 32)))
    seq = draw(st.sampled_from((4, 2, 8))) if start in ("seq", "embed_seq") else 0
    vocab = draw(st.sampled_from((16, 8, 32))) if start.startswith("embed") else 0
    shape: Shape = (batch, seq, width) if seq else (batch, width)
    steps: list[Step] = []
    has_params = start.startswith("embed")
    for _ in range(draw(st.integers(0, max_steps))):
        kind = draw(st.sampled_from(_step_options(shape)))
        d = shape[-1]
        if kind in ("dense", "mlp"):
            step = Step(kind, draw(st.sampled_from(_WIDTHS)))
        elif kind == "act":
            step = Step(kind, fn=draw(st.sampled_from(sorted(_ACTIVATIONS))))
        elif kind == "norm":
            step = Step(kind, fn=draw(st.sampled_from(_NORMS)))
        elif kind == "sum":
            step = Step(kind, draw(st.sampled_from((1, 2))))
        elif kind == "broadcast":
            step = Step(kind, draw(st.sampled_from((2, 4))))
        elif kind == "split":
            step = Step(kind, draw(st.sampled_from([f for f in (2, 4) if d % (2 * f) == 0])))
        elif kind == "take":
            step = Step(kind, draw(st.sampled_from((4, 2, 8))))
        else:
            step = Step(kind)
        shape, p, _ = _step_shapes(step, shape)
        has_params |= bool(p)
        steps.append(step)
    if train and not has_params:  # a train step needs something to train
        steps.append(Step("dense", shape[-1]))
    outputs: tuple[str, ...] = ("y",)
    if not train:
        outputs += tuple(o for o in ("sum", "max") if draw(st.booleans()))
    target = draw(st.booleans()) if train else False
    recipe = Recipe(start, batch, width, seq, vocab, tuple(steps), outputs, target)
    return TrainStep(recipe) if train else Forward(recipe)


def programs(
    train_step: bool | None = None, *, max_steps: int = 6
) -> st.SearchStrategy[tuple[Any, tuple]]:
    """`(fn, args)`: a random JAX function and `ShapeDtypeStruct` args for it.

    The function starts from a data input `x` (rank 2 or 3) or an embedding lookup of int
    `tokens`, and applies up to `max_steps` random `Step`s: matmuls and einsums,
    elementwise ops, reductions, broadcasts, reshapes, transposes, gathers, concatenations.
    Every dim is a power of 2 between 2 and 64, so mesh axes of size 2, 4, 8 often divide.

    `train_step=False`: `fn(params, data) -> {"y": ..., "sum"?: ..., "max"?: ...}`;
    `train_step=True`: `fn(params, opt_state, batch) -> (params, opt_state, {"loss": ...})`,
    `jax.value_and_grad` of a loss built from the same steps and an `optax.adam` update;
    `None`: either. `fn.recipe` says what it computes; `repr(fn)` too."""
    return _recipes(train_step, max_steps).map(lambda fn: (fn, fn.example_args()))


# ------------------------------------------------------------------------------ specs


def input_shapes(program_or_goal: Any) -> dict[str, tuple[int, ...]]:
    """{input path: shape} of a `Goal`, a traced `Program`, or an `(fn, args)` pair,
    named as partir names them (`params/l0/w`); a Goal or pair is not traced for this."""
    obj = program_or_goal
    if isinstance(obj, Program):
        return {p: obj.values[v].shape for p, v in obj.inputs.items()}
    if isinstance(obj, Goal):
        if "program" in obj.__dict__:  # already traced
            return input_shapes(obj.program)
        fn, args = obj.fn, obj.args
    else:
        fn, args = obj
    args = tuple(args)
    names = arg_names(fn, len(args))
    out: dict[str, tuple[int, ...]] = {}
    for name, arg in zip(names, args):
        leaves, _ = jax.tree_util.tree_flatten_with_path(arg)
        for keypath, leaf in leaves:
            out[path_str(name, keypath)] = tuple(int(d) for d in jnp.shape(leaf))
    return out


def shardings(
    shape: Sequence[int], mesh: Mapping[str, int]
) -> st.SearchStrategy[tuple[tuple[str, ...], ...]]:
    """A partir sharding of `shape` (per dim, a tuple of mesh axes, major first): each
    axis at most once, the sizes of a dim's axes dividing it. Shrinks to replicated."""
    shape = tuple(shape)

    @st.composite
    def draw_sharding(draw) -> tuple[tuple[str, ...], ...]:
        dims: list[list[str]] = [[] for _ in shape]
        if not shape:
            return ()
        for axis in draw(st.permutations(list(mesh))):
            fits = [d for d in range(len(shape))
                    if shape[d] % (math.prod(mesh[a] for a in dims[d]) * mesh[axis]) == 0]  # fmt: skip
            dim = draw(st.sampled_from([None, *fits]))
            if dim is not None:
                dims[dim].append(axis)
        return tuple(tuple(d) for d in dims)

    return draw_sharding()


def _as_spec(sharding: Sequence[Sequence[str]], trim: bool) -> PartitionSpec:
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in sharding]
    while trim and entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def specs(
    program_or_goal: Any, mesh: Mapping[str, int] | None = None
) -> st.SearchStrategy[dict[str, PartitionSpec]]:
    """Random valid input shardings `{path: PartitionSpec}` for a `Goal` (on its mesh
    unless `mesh` is given), a traced `Program` or an `(fn, args)` pair: mesh axes at most
    once per value, their sizes dividing the dims. Paths left out are replicated; trailing
    `None`s are sometimes left out too, as people write specs."""
    if mesh is None:
        if not isinstance(program_or_goal, Goal):
            raise TypeError("specs(program, mesh): give the mesh, or pass a Goal")
        mesh = program_or_goal.mesh
    mesh = dict(mesh)
    shapes = input_shapes(program_or_goal)

    @st.composite
    def draw_specs(draw) -> dict[str, PartitionSpec]:
        out = {}
        for path, shape in shapes.items():
            sharding = draw(shardings(shape, mesh))
            if any(sharding) or draw(st.booleans()):
                out[path] = _as_spec(sharding, trim=draw(st.booleans()))
        return out

    return draw_specs()


# ------------------------------------------------------------------------------ goals

_SEARCHED = ("batch", "megatron", "zero", "auto", "fsdp")


def _compatible(names: list[str]) -> bool:
    """Whether strategies of these names may share an axis (strategies.base.conflict)."""
    return conflict([_strategy(name, "axis") for name in names]) is None


def _strategy(name: str, axis: str, stage: int = 3) -> S.Strategy:
    if name == "zero":
        return S.zero(axis, stage=stage)
    return {"batch": S.batch, "megatron": S.megatron, "auto": S.auto, "fsdp": S.fsdp,
            "expert": S.expert}[name](axis)  # fmt: skip


@st.composite
def schedules(
    draw,
    mesh: Mapping[str, int],
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch_sizes: Collection[int] | None = None,
) -> list[S.Strategy]:
    """A schedule over some of the mesh axes, in random order, 1-2 strategies on each
    (batch, megatron, zero(stage), auto, fsdp); with `shapes` ({path: shape}), sometimes
    manual `tile` / `replicate` statements that are valid for those inputs. With
    `batch_sizes` (the data inputs' leading dims), batch and fsdp only go on axes that can
    split one of them (after the batch axes before): elsewhere they are an error."""
    axes = draw(st.permutations(list(mesh)))[: draw(st.integers(0, len(mesh)))]
    schedule: list[S.Strategy] = []
    split = 1  # how many ways the batch axes so far split the data
    for axis in axes:
        names = draw(
            st.lists(st.sampled_from(_SEARCHED), min_size=1, max_size=2, unique=True).filter(
                _compatible
            )
        )
        if batch_sizes is not None:
            if any(b % (split * mesh[axis]) == 0 for b in batch_sizes):
                split *= mesh[axis] if {"batch", "fsdp"} & set(names) else 1
            else:
                names = [n for n in names if n not in ("batch", "fsdp")]
        for name in names:
            stage = draw(st.sampled_from((3, 1, 2))) if name == "zero" else 3
            schedule.append(_strategy(name, axis, stage))
    if shapes:
        paths = sorted(shapes)
        manual: dict[str, list[list[str]]] = {}
        replicated: set[tuple[str, str]] = set()
        for _ in range(draw(st.integers(0, 2))):
            path = draw(st.sampled_from(paths))
            axis = draw(st.sampled_from(sorted(mesh)))
            shape = shapes[path]
            dims = manual.setdefault(path, [[] for _ in shape])
            used = {a for d in dims for a in d} | {a for p, a in replicated if p == path}
            fits = [d for d in range(len(shape)) if axis not in used
                    and shape[d] % (math.prod(mesh[a] for a in dims[d]) * mesh[axis]) == 0]  # fmt: skip
            if fits and draw(st.booleans()):
                dim = draw(st.sampled_from(fits))
                dims[dim].append(axis)
                schedule.append(S.tile(path, dim, axis))
            elif axis not in used:
                replicated.add((path, axis))
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
    schedule = draw(schedules(mesh, every if manual else None, batch_sizes))
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


_default_programs, _default_meshes = programs, meshes

# ------------------------------------------------------------------------------ goal files

_PROGRAMS = "partir.testing._programs"
# sizes and how goal files write them: (text, bytes)
_MEMORY = (("1GiB", 2**30), ("512MiB", 2**29), ("2GB", 2 * 10**9), ("1.5GiB", 3 * 2**29),
           ("1073741824", 2**30), ("64KiB", 2**16), ("1TiB", 2**40), ("800MB", 8 * 10**8))  # fmt: skip
_RATES = (("20G/s", 20e9), ("50GB/s", 50e9), ("1.5T/s", 1.5e12), ("400MB/s", 4e8),
          ("100GiB/s", 100 * 2.0**30), ("25000000000", 25e9))  # fmt: skip
# axis names in goal files may be statement keywords or strategy names
_FILE_AXES = ("batch", "model", "data", "x", "y2", "expert", "tile", "on", "dim", "mesh")


@dataclasses.dataclass
class _Style:
    space: str = " "  # between tokens
    indent: str = "    "
    inline_blocks: bool = False
    trailing_comma: bool = False
    comments: bool = False
    blank_lines: bool = False
    kw_space: bool = False  # `k = v`


@dataclasses.dataclass
class _GoalFile:
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
        from partir.testing import _programs as m

        return getattr(m, self.inputs)(**self.sizes)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        from partir.testing import _programs as m

        return input_shapes((getattr(m, self.program), self.args()))

    def statements(self, style: _Style) -> dict[str, str]:
        """{key: text}: every statement this file has, rendered."""
        sp = style.space
        eq = " = " if style.kw_space else "="

        def call(kwargs: Sequence[tuple[str, str]]) -> str:
            inner = ", ".join(f"{k}{eq}{v}" for k, v in kwargs)
            if style.trailing_comma and kwargs:
                inner += ","
            return f"({inner})"

        out = {
            "program": f'program{sp}"{_PROGRAMS}:{self.program}"',
            "inputs": f'inputs{sp}"{_PROGRAMS}:{self.inputs}"'
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
    def _block(items: Sequence[str], style: _Style) -> str:
        if style.inline_blocks or not items:
            return "{ " + "  ".join(items) + (" }" if items else "}")
        return "{\n" + "".join(f"{style.indent}{i}\n" for i in items) + "}"

    def render(self, style: _Style, statements: Mapping[str, str] | None = None) -> str:
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
        from partir.testing import _programs as m

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
                    schedule.append(_strategy(name, axis))
        for t in self.manual:
            schedule.append(S.tile(t[1], t[2], t[3]) if t[0] == "tile" else S.replicate(t[1], t[2]))
        search = Search(**{k: v for k, _, v in self.search or ()}, prune=self.prune_value)
        return Goal(
            getattr(m, self.program),
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
def _styles(draw) -> _Style:
    return _Style(
        space=draw(st.sampled_from((" ", "  ", "\t"))),
        indent=draw(st.sampled_from(("    ", "\t", " "))),
        inline_blocks=draw(st.booleans()),
        trailing_comma=draw(st.booleans()),
        comments=draw(st.booleans()),
        blank_lines=draw(st.booleans()),
        kw_space=draw(st.booleans()),
    )


@st.composite
def _goal_files(draw) -> _GoalFile:
    program = draw(st.sampled_from(("train_step", "forward")))
    sizes: dict[str, int] = {}
    for key, choices in (("batch", (8, 4, 16)), ("width", (16, 8, 32)), ("layers", (2, 1, 3)),
                         ("vocab", (32, 16)), ("seq", (4, 2, 8))):  # fmt: skip
        if draw(st.booleans()):
            sizes[key] = draw(st.sampled_from(choices))
    mesh = draw(meshes(max_axes=3, max_devices=64, names=_FILE_AXES))
    gf = _GoalFile(program, sizes, mesh)
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
    for axis in draw(st.permutations(sorted(mesh)))[: draw(st.integers(0, len(mesh)))]:
        names = draw(
            st.lists(st.sampled_from((*_SEARCHED, "expert")), max_size=3, unique=True).filter(
                _compatible
            )
        )
        strategies = []
        for name in names:
            kw: dict[str, str] = {}
            if name == "zero" and draw(st.booleans()):
                kw["stage"] = str(draw(st.sampled_from((1, 2, 3))))
            if name == "batch" and draw(st.booleans()):
                kw["inputs"] = '"batch/*"'
            strategies.append((name, kw))
        gf.blocks.append((axis, strategies))
    shapes = gf.shapes()
    for _ in range(draw(st.integers(0, 3))):
        path = draw(
            st.sampled_from(sorted(shapes) + ["params/**/scale", "params/layers/*/mlp/w_in"])
        )
        matched = [shapes[p] for p in shapes if _glob(path, p)]
        axis = draw(st.sampled_from(sorted(mesh)))
        rank = min(len(s) for s in matched)
        dims = [d for d in range(rank) if all(s[d] % mesh[axis] == 0 for s in matched)]
        if dims and draw(st.booleans()):
            gf.manual.append(("tile", path, draw(st.sampled_from(dims)), axis))
        else:
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
    keys = list(gf.statements(_Style()))
    shuffled = draw(st.permutations(keys)) if draw(st.booleans()) else keys
    # the axis blocks and the manual statements keep their relative order
    for prefix in ("axis:", "manual:"):
        ordered = iter([k for k in keys if k.startswith(prefix)])
        shuffled = [next(ordered) if k.startswith(prefix) else k for k in shuffled]
    gf.order = shuffled
    return gf


def _glob(pattern: str, path: str) -> bool:
    from partir.ir.specs import glob_match

    return pattern == path or glob_match(pattern, path)


@st.composite
def _goal_texts(draw) -> tuple[str, Goal]:
    gf = draw(_goal_files())
    return gf.render(draw(_styles())), gf.goal()


def goal_texts() -> st.SearchStrategy[tuple[str, Goal]]:
    """`(text, goal)`: a random valid goal file for the model of `partir.testing._programs`
    and the `partir.Goal` it means, built in Python, not by parsing: its mesh (in order),
    device (a catalog device, maybe with per-axis links), memory limit (in assorted
    units), objective, schedule (axis blocks in file order, then tile/replicate
    statements), and search. Statements come in random order, with random spacing,
    comments and blank lines; axis names may be keywords (`tile`, `on`, `mesh`, ...)."""
    return _goal_texts()


# ------------------------------------------------------------------------------ bad goal files

_KEYWORDS = ("program", "inputs", "mesh", "device", "memory", "objective", "axis", "tile",
             "replicate", "search", "prune", "dim", "on")  # fmt: skip
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


def _kind_keyword(draw, gf: _GoalFile, style: _Style) -> str:
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


def _kind_unit(draw, gf: _GoalFile, style: _Style) -> str:
    where = draw(st.sampled_from(("memory", "link", "field")))
    if where == "memory":
        text = draw(st.sampled_from(("32Gib", "32GHz", "32gb", "2us", "50G/s", "275T",
                                     "32 GiB", "1.5XB", "8b")))  # fmt: skip
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
        field = draw(st.sampled_from(("hbm 32G/s", "hbm 2ms", "flops 32GiB",
                                      "hbm_bandwidth 1.2TiB", "latency 2GB")))  # fmt: skip
    statements["device"] = f"device {device}{{ {field} }}"
    return gf.render(style, statements)


def _kind_brace(draw, gf: _GoalFile, style: _Style) -> str:
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


def _unknown_axis(draw, gf: _GoalFile) -> str:
    near = [draw(_typo(a, list(gf.mesh) + list(_KEYWORDS))) for a in gf.mesh]
    name = draw(st.sampled_from(near + ["modle", "batchh", "zz", "pipeline"]))
    return name if name not in gf.mesh else name + "q"


def _kind_axis(draw, gf: _GoalFile, style: _Style) -> str:
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


def _kind_dim(draw, gf: _GoalFile, style: _Style) -> str:
    shapes = gf.shapes()
    path = draw(st.sampled_from(sorted(shapes)))
    dim = draw(st.sampled_from((len(shapes[path]), len(shapes[path]) + 1, 9, -1)))
    gf.manual.append(("tile", path, dim, draw(st.sampled_from(sorted(gf.mesh)))))
    return gf.render(style)


def _kind_strategy(draw, gf: _GoalFile, style: _Style) -> str:
    from partir.strategies import CATALOG

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
            )  # fmt: skip
        )
    else:
        strategies.append(strategies[0])
    gf.blocks[i] = (axis, strategies)
    return gf.render(style)


def _kind_mesh(draw, gf: _GoalFile, style: _Style) -> str:
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


def _kind_duplicate(draw, gf: _GoalFile, style: _Style) -> str:
    statements = gf.statements(style)
    singles = [k for k in statements if ":" not in k]
    key = draw(st.sampled_from(sorted(singles)))
    if gf.blocks and draw(st.booleans()):
        key = "axis:0"
    statements[key + ":again"] = statements[key]
    gf.order = gf.order + [key + ":again"]
    return gf.render(style, statements)


def _kind_missing(draw, gf: _GoalFile, style: _Style) -> str:
    statements = gf.statements(style)
    del statements[draw(st.sampled_from(("program", "inputs", "mesh")))]
    return gf.render(style, statements)


def _kind_value(draw, gf: _GoalFile, style: _Style) -> str:
    statements = gf.statements(style)
    key, text = draw(st.sampled_from((
        ("objective", "objective speed"), ("objective", "objective tim"),
        ("prune", "prune cpsta"), ("prune", "prune yes"),
        ("search", "search mtcs(seed=1)"), ("search", "search mcts(episdoes=20)"),
        ("search", "search mcts(episodes=0)"), ("search", "search mcts(seed=1.5)"),
        ("search", 'search mcts(rollout="best")'), ("search", "search mcts(uct_c=-1)"),
        ("search", "search mcts(seconds=-5)"), ("search", "search mcts(prune=true)"),
        ("search", "search mcts(seed=1, seed=2)"), ("search", "search mcts(20)"),
        ("device", 'device "tpu-v9"'), ("device", 'device "cpu" { hmb 32GiB }'),
        ("device", "device { hbm 32GiB }"), ("device", 'device "cpu" { node_size 2.5 }'),
        ("memory", "memory <= 0"), ("memory", "memory <= -1GiB"),
        ("inputs", f'inputs "{_PROGRAMS}:example_args"(batch=yes)'),
    )))  # fmt: skip
    statements[key] = text
    return gf.render(style, statements)


def _kind_string(draw, gf: _GoalFile, style: _Style) -> str:
    statements = gf.statements(style)
    key = draw(st.sampled_from(("program", "inputs")))
    how = draw(st.sampled_from(("unterminated", "target")))
    text = statements[key]
    if how == "unterminated":
        i = text.index('"', text.index('"') + 1)
        statements[key] = text[:i] + text[i + 1 :]
    else:
        target = draw(st.sampled_from((_PROGRAMS, f"{_PROGRAMS}:", f":{gf.program}",
                                       f"{_PROGRAMS}:{gf.program}:x", "a b:c")))  # fmt: skip
        start = text.index('"')
        end = text.index('"', start + 1)
        statements[key] = text[: start + 1] + target + text[end:]
    return gf.render(style, statements)


def _kind_path(draw, gf: _GoalFile, style: _Style) -> str:
    path = draw(st.sampled_from(("params/embd", "params/layers/9/mlp/w_in", "", "/",
                                 "nothing/**", "param/embed")))  # fmt: skip
    axis = draw(st.sampled_from(sorted(gf.mesh)))
    gf.manual.append(("tile", path, 0, axis) if draw(st.booleans()) else ("replicate", path, axis))
    return gf.render(style)


def _kind_import(draw, gf: _GoalFile, style: _Style) -> str:
    statements = gf.statements(style)
    key, text = draw(st.sampled_from((
        ("program", f'program "{_PROGRAMS}:train_stp"'),
        ("program", f'program "{_PROGRAMS}:OPTIMIZER"'),
        ("program", 'program "partir.testing._no_such_module:train_step"'),
        ("program", 'program "no_such_file.py:train_step"'),
        ("inputs", f'inputs "{_PROGRAMS}:example_args"(batch=0)'),
        ("inputs", f'inputs "{_PROGRAMS}:example_args"(batchsize=8)'),
        ("inputs", f'inputs "{_PROGRAMS}:loss_fn"'),
    )))  # fmt: skip
    if key == "program" and "train_stp" not in text and draw(st.booleans()):
        # a program that cannot take what the inputs function returns
        other = "forward" if gf.program == "train_step" else "train_step"
        text = f'program "{_PROGRAMS}:{other}"'
    statements[key] = text
    return gf.render(style, statements)


def _kind_divide(draw, gf: _GoalFile, style: _Style) -> str:
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
        gf = draw(_goal_files())
        style = draw(_styles())
        kind = draw(st.sampled_from(chosen))
        return _MUTATIONS[kind](draw, gf, style)

    return draw_bad()
