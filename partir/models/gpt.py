"""Decoder-only transformer LM (GPT-2 style): pre-LayerNorm, causal multi-head attention, GELU MLP.

`layers` is a list of per-layer dicts, or with `scan=True` one dict whose leaves carry a leading
layer dim and run under `jax.lax.scan`. With `tied=True` there is no `unembed`; logits use
`embed.T`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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
    sds,
    stack,
    zeros,
)

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"layers": 2, "d_model": 32, "heads": 4, "seq": 16, "batch": 8, "vocab": 64},
    "small": {"layers": 12, "d_model": 256, "heads": 8, "seq": 128, "batch": 16, "vocab": 1024},
    "1b": {"layers": 24, "d_model": 2048, "heads": 16, "seq": 1024, "batch": 256, "vocab": 32000},
    "8b": {"layers": 40, "d_model": 4096, "heads": 32, "seq": 2048, "batch": 256, "vocab": 32000},
}
OPTIONAL: dict[str, Any] = {"d_ff": None, "tied": False, "scan": False}

INIT_STD = 0.02


# ----------------------------------------------------------------------------- init


def embeddings_spec(*, vocab: int, seq: int, d_model: int, tied: bool) -> Params:
    """`embed`, `pos_embed`, `ln_f` and (untied) `unembed`."""
    p = {
        "embed": normal((vocab, d_model), INIT_STD),
        "pos_embed": normal((seq, d_model), INIT_STD),
        "ln_f": layer_norm_spec(d_model),
    }
    if not tied:
        p["unembed"] = normal((d_model, vocab), INIT_STD)
    return p


def attention_spec(*, d_model: int, heads: int, out_std: float) -> Params:
    """`q`, `k`, `v` as [d_model, heads, head_dim] and `o` as [heads, head_dim, d_model]."""
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
    head_dim = d_model // heads
    qkv = normal((d_model, heads, head_dim), INIT_STD)
    return {"q": qkv, "k": qkv, "v": qkv, "o": normal((heads, head_dim, d_model), out_std)}


def mlp_spec(*, d_model: int, d_ff: int, out_std: float) -> Params:
    return {
        "w_in": normal((d_model, d_ff), INIT_STD),
        "b_in": zeros((d_ff,)),
        "w_out": normal((d_ff, d_model), out_std),
        "b_out": zeros((d_model,)),
    }


def out_std(layers: int) -> float:
    """GPT-2 scaling of residual-branch output projections."""
    return INIT_STD / math.sqrt(2 * layers)


def layer_spec(*, d_model: int, heads: int, d_ff: int, layers: int) -> Params:
    std = out_std(layers)
    return {
        "ln1": layer_norm_spec(d_model),
        "attn": attention_spec(d_model=d_model, heads=heads, out_std=std),
        "ln2": layer_norm_spec(d_model),
        "mlp": mlp_spec(d_model=d_model, d_ff=d_ff, out_std=std),
    }


def stack_layers(layers: list[Params]) -> Params:
    """Turn a list of per-layer dicts into one dict with a leading layer dim (for `scan`)."""
    return stack(layers)


def init(
    key: Key,
    *,
    layers: int,
    d_model: int,
    heads: int,
    seq: int,
    vocab: int,
    d_ff: int | None = None,
    tied: bool = False,
    scan: bool = False,
    batch: int | None = None,
) -> Params:
    """GPT parameters; `scan=True` stacks the same per-layer weights `scan=False` would give."""
    del batch
    d_ff = 4 * d_model if d_ff is None else d_ff
    spec = embeddings_spec(vocab=vocab, seq=seq, d_model=d_model, tied=tied)
    spec["layers"] = [
        layer_spec(d_model=d_model, heads=heads, d_ff=d_ff, layers=layers) for _ in range(layers)
    ]
    params = materialize(key, spec)
    if scan:
        params["layers"] = stack_layers(params["layers"])
    return params


def optimizer(**size: Any) -> optax.GradientTransformation:
    del size
    return optax.adamw(1e-3)


def batch_shapes(*, batch: int, seq: int, **_: Any) -> dict:
    return {"tokens": sds((batch, seq), jnp.int32), "targets": sds((batch, seq), jnp.int32)}


def make_batch(rng: np.random.Generator, *, batch: int, seq: int, vocab: int, **_: Any) -> dict:
    """Arithmetic token sequences mod `vocab` (learnable); targets are the next tokens."""
    start = rng.integers(0, vocab, (batch, 1))
    stride = rng.integers(1, 4, (batch, 1))
    seqs = ((start + stride * np.arange(seq + 1)[None, :]) % vocab).astype(np.int32)
    return {"tokens": seqs[:, :-1], "targets": seqs[:, 1:]}


def example_args(
    abstract: bool = True, preset: str | None = "tiny", **size: Any
) -> tuple[Params, PyTree, dict]:
    cfg = resolve_size(PRESETS, preset, size, OPTIONAL)
    return build_example_args(init, optimizer, batch_shapes, make_batch, cfg, abstract)


def param_count(preset: str | None = None, **size: Any) -> int:
    """Parameter count for a preset and/or explicit sizes (eval_shape, nothing allocated)."""
    return count_params(init, PRESETS, preset, size, OPTIONAL)


# ----------------------------------------------------------------------------- forward


def embed_tokens(params: Params, tokens: jax.Array) -> jax.Array:
    """[batch, seq] int32 -> [batch, seq, d_model]: token plus learned position embeddings."""
    seq = tokens.shape[1]
    return params["embed"][tokens] + params["pos_embed"][None, :seq]


def attention(p: Params, x: jax.Array) -> jax.Array:
    """Causal multi-head softmax attention; heads stay their own dim throughout."""
    q = jnp.einsum("bsd,dhk->bshk", x, p["q"])
    k = jnp.einsum("bsd,dhk->bshk", x, p["k"])
    v = jnp.einsum("bsd,dhk->bshk", x, p["v"])
    scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    seq = x.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqs,bshk->bqhk", probs, v)
    return jnp.einsum("bqhk,hkd->bqd", out, p["o"])


def mlp(p: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", x, p["w_in"]) + p["b_in"])
    return jnp.einsum("bsf,fd->bsd", h, p["w_out"]) + p["b_out"]


def block(p: Params, x: jax.Array) -> jax.Array:
    x = x + attention(p["attn"], layer_norm(p["ln1"], x))
    return x + mlp(p["mlp"], layer_norm(p["ln2"], x))


def run_layers(layers: list[Params] | Params, x: jax.Array) -> jax.Array:
    """Unrolled over a list of layers, or `lax.scan` over a stacked dict."""
    if isinstance(layers, dict):
        x, _ = jax.lax.scan(lambda h, p: (block(p, h), None), x, layers)
        return x
    for p in layers:
        x = block(p, x)
    return x


def logits(params: Params, x: jax.Array) -> jax.Array:
    """Final LayerNorm and projection to the vocabulary (embed.T when tied)."""
    x = layer_norm(params["ln_f"], x)
    if "unembed" in params:
        return jnp.einsum("bsd,dv->bsv", x, params["unembed"])
    return jnp.einsum("bsd,vd->bsv", x, params["embed"])


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean token cross-entropy (one-hot form, so a vocab-sharded plan needs no gather)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    one_hot = jax.nn.one_hot(targets, logits.shape[-1], dtype=logp.dtype)
    return -jnp.mean(jnp.sum(logp * one_hot, axis=-1))


def loss_fn(params: Params, batch: dict) -> jax.Array:
    x = embed_tokens(params, batch["tokens"])
    x = run_layers(params["layers"], x)
    return cross_entropy(logits(params, x), batch["targets"])


def train_step(params: Params, opt_state: PyTree, batch: dict) -> tuple[Params, PyTree, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt_state = apply_updates(optimizer(), grads, opt_state, params)
    return params, opt_state, {"loss": loss}
