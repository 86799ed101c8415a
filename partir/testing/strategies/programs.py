"""Programs: small random JAX functions made of primitives partir has sharding rules for,
as forward passes or Adam train steps; a function's repr lists its steps."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from hypothesis import strategies as st

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
        shape: Shape
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
    out: dict[str, Any] = {}
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
