"""Transformer LM whose MLPs are top-k routed mixtures of experts (GShard / Switch style).

Each sequence is a routing group. Router softmax -> `lax.top_k` -> position in expert by a
cumsum over one-hots (all first choices before second choices) -> capacity mask -> dispatch and
combine tensors [batch, seq, experts, capacity] -> einsums to and from expert inputs
[experts, batch, capacity, d_model]. Tokens over capacity are dropped (the residual carries
them). A Switch load-balancing loss is added to the cross-entropy.

`top_k` and `capacity_factor` are not array shapes, so they reach `train_step` as a static,
leafless `Routing` node in the batch (`batch["routing"]`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from partir.models import gpt
from partir.models._common import (
    Key,
    Params,
    PyTree,
    apply_updates,
    build_example_args,
    count_params,
    layer_norm,
    layer_norm_spec,
    materialize,
    normal,
    resolve_size,
    zeros,
)

_GPT_TINY = gpt.PRESETS["tiny"]
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {**_GPT_TINY, "experts": 8, "top_k": 2, "capacity_factor": 1.0},
    "small": {
        **gpt.PRESETS["small"],
        "layers": 4,
        "experts": 8,
        "top_k": 2,
        "capacity_factor": 1.25,
    },
    "base": {
        "layers": 12,
        "d_model": 1024,
        "heads": 16,
        "seq": 1024,
        "batch": 64,
        "vocab": 32000,
        "experts": 16,
        "top_k": 2,
        "capacity_factor": 1.25,
    },
}
OPTIONAL: dict[str, Any] = {"d_ff": None, "tied": False}

AUX_LOSS_WEIGHT = 0.01


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Routing:
    """Static routing hyperparameters (a pytree node without leaves)."""

    top_k: int
    capacity_factor: float


def capacity(group_size: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert per group: ceil(top_k * group_size * capacity_factor / experts)."""
    return max(1, math.ceil(top_k * group_size * capacity_factor / experts))


# ----------------------------------------------------------------------------- init


def moe_spec(*, d_model: int, d_ff: int, experts: int, out_std: float) -> Params:
    return {
        "router": normal((d_model, experts), gpt.INIT_STD),
        "w_in": normal((experts, d_model, d_ff), gpt.INIT_STD),
        "b_in": zeros((experts, d_ff)),
        "w_out": normal((experts, d_ff, d_model), out_std),
    }


def layer_spec(*, d_model: int, heads: int, d_ff: int, experts: int, layers: int) -> Params:
    std = gpt.out_std(layers)
    return {
        "ln1": layer_norm_spec(d_model),
        "attn": gpt.attention_spec(d_model=d_model, heads=heads, out_std=std),
        "ln2": layer_norm_spec(d_model),
        "moe": moe_spec(d_model=d_model, d_ff=d_ff, experts=experts, out_std=std),
    }


def init(
    key: Key,
    *,
    layers: int,
    d_model: int,
    heads: int,
    seq: int,
    vocab: int,
    experts: int,
    d_ff: int | None = None,
    tied: bool = False,
    top_k: int | None = None,
    capacity_factor: float | None = None,
    batch: int | None = None,
) -> Params:
    del top_k, capacity_factor, batch
    d_ff = 4 * d_model if d_ff is None else d_ff
    spec = gpt.embeddings_spec(vocab=vocab, seq=seq, d_model=d_model, tied=tied)
    spec["layers"] = [
        layer_spec(d_model=d_model, heads=heads, d_ff=d_ff, experts=experts, layers=layers)
        for _ in range(layers)
    ]
    return materialize(key, spec)


def optimizer(**size: Any) -> optax.GradientTransformation:
    del size
    return optax.adamw(1e-3)


def batch_shapes(*, top_k: int, capacity_factor: float, **size: Any) -> dict:
    routing = Routing(top_k=top_k, capacity_factor=float(capacity_factor))
    return {**gpt.batch_shapes(**size), "routing": routing}


def make_batch(
    rng: np.random.Generator, *, top_k: int, capacity_factor: float, **size: Any
) -> dict:
    routing = Routing(top_k=top_k, capacity_factor=float(capacity_factor))
    return {**gpt.make_batch(rng, **size), "routing": routing}


def example_args(
    abstract: bool = True, preset: str | None = "tiny", **size: Any
) -> tuple[Params, PyTree, dict]:
    cfg = resolve_size(PRESETS, preset, size, OPTIONAL)
    if cfg["top_k"] > cfg["experts"]:
        raise ValueError(f"top_k {cfg['top_k']} exceeds experts {cfg['experts']}")
    return build_example_args(init, optimizer, batch_shapes, make_batch, cfg, abstract)


def param_count(preset: str | None = None, **size: Any) -> int:
    return count_params(init, PRESETS, preset, size, OPTIONAL)


# ----------------------------------------------------------------------------- routing


def route(
    router_logits: jax.Array, routing: Routing, num_slots: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Top-k routing with capacity, per group.

    router_logits: [groups, group_size, experts]. Returns (dispatch, combine, aux_loss):
    dispatch is a 0/1 float [groups, group_size, experts, num_slots] with at most one slot per
    (token, expert) and at most one token per slot; combine is dispatch weighted by the gates.
    """
    groups, size, experts = router_logits.shape
    k = routing.top_k
    probs = jax.nn.softmax(router_logits, axis=-1)
    gates, expert_idx = jax.lax.top_k(probs, k)  # [g, s, k]
    if k > 1:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)

    # Choice-major order: every token's first choice claims slots before any second choice.
    choice = jax.nn.one_hot(expert_idx, experts, dtype=jnp.int32)  # [g, s, k, e]
    choice_major = jnp.transpose(choice, (0, 2, 1, 3)).reshape(groups, k * size, experts)
    position = jnp.cumsum(choice_major, axis=1) - 1
    position = jnp.transpose(position.reshape(groups, k, size, experts), (0, 2, 1, 3))
    position = jnp.sum(position * choice, axis=-1)  # [g, s, k] slot within chosen expert
    kept = position < num_slots

    # One-hot over slots; a dropped choice (position >= num_slots) is all zeros.
    slot = jax.nn.one_hot(jnp.where(kept, position, num_slots), num_slots, dtype=jnp.float32)
    choice_f = choice.astype(jnp.float32)
    dispatch = jnp.einsum("gske,gskc->gsec", choice_f, slot)
    combine = jnp.einsum("gske,gskc->gsec", choice_f * gates[..., None], slot)

    # Switch aux loss: experts * sum_e (fraction of first choices to e) * (mean prob of e).
    first_fraction = jnp.mean(choice[:, :, 0, :].astype(jnp.float32), axis=1)
    mean_prob = jnp.mean(probs, axis=1)
    aux = experts * jnp.mean(jnp.sum(first_fraction * mean_prob, axis=-1))
    return dispatch, combine, aux


def moe_mlp(p: Params, x: jax.Array, routing: Routing) -> tuple[jax.Array, jax.Array]:
    """[batch, seq, d_model] -> (same shape, aux loss); experts stay their own dim."""
    experts = p["router"].shape[-1]
    num_slots = capacity(x.shape[1], experts, routing.top_k, routing.capacity_factor)
    router_logits = jnp.einsum("bsd,de->bse", x, p["router"])
    dispatch, combine, aux = route(router_logits, routing, num_slots)
    expert_in = jnp.einsum("bsec,bsd->ebcd", dispatch, x)
    h = jax.nn.gelu(jnp.einsum("ebcd,edf->ebcf", expert_in, p["w_in"]) + p["b_in"][:, None, None])
    expert_out = jnp.einsum("ebcf,efd->ebcd", h, p["w_out"])
    return jnp.einsum("bsec,ebcd->bsd", combine, expert_out), aux


def block(p: Params, x: jax.Array, routing: Routing) -> tuple[jax.Array, jax.Array]:
    x = x + gpt.attention(p["attn"], layer_norm(p["ln1"], x))
    y, aux = moe_mlp(p["moe"], layer_norm(p["ln2"], x), routing)
    return x + y, aux


def loss_fn(params: Params, batch: dict) -> jax.Array:
    routing = batch["routing"]
    x = gpt.embed_tokens(params, batch["tokens"])
    aux_total = jnp.zeros((), jnp.float32)
    for p in params["layers"]:
        x, aux = block(p, x, routing)
        aux_total = aux_total + aux
    ce = gpt.cross_entropy(gpt.logits(params, x), batch["targets"])
    return ce + AUX_LOSS_WEIGHT * aux_total / len(params["layers"])


def train_step(params: Params, opt_state: PyTree, batch: dict) -> tuple[Params, PyTree, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt_state = apply_updates(optimizer(), grads, opt_state, params)
    return params, opt_state, {"loss": loss}
