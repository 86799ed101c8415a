"""Llama-style decoder LM: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, untied embed.

Production-style by default (MaxText's defaults): the layers run under `lax.scan` (`scan=True`;
each layer weight then carries a leading layer dim) and each layer under `jax.checkpoint`
(`remat=True` with `remat_policy`, default "nothing_saveable": only each layer's input is
saved for the backward). Parameters and adamw's moments are float32 (master weights);
activations and the weights' compute copies are `compute_dtype` ("bfloat16", or "float32":
XLA:CPU runs bf16 collectives in f32, so byte counts measured on CPU need f32 compute).

Options that are not shapes reach `train_step` as a static, leafless `Config` node in the batch
(`batch["config"]`). Parameter names follow gpt's so the expert rules apply: `attn/q`
[d_model, heads, head_dim], `attn/k` and `attn/v` [d_model, kv_heads, head_dim], `attn/o`
[heads, head_dim, d_model], `mlp/w_gate` and `mlp/w_in` [d_model, d_ff], `mlp/w_out`
[d_ff, d_model], `embed` [vocab, d_model], `unembed` [d_model, vocab], and `attn_norm`,
`mlp_norm`, `final_norm` with a `scale`.
"""

from __future__ import annotations

import dataclasses
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
    materialize,
    normal,
    ones,
    resolve_size,
    sds,
    stack,
)
from partir.models.gpt import cross_entropy

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "layers": 2,
        "d_model": 64,
        "heads": 8,
        "kv_heads": 4,
        "d_ff": 128,
        "seq": 16,
        "batch": 8,
        "vocab": 128,
    },
    "small": {
        "layers": 8,
        "d_model": 256,
        "heads": 8,
        "kv_heads": 4,
        "d_ff": 768,
        "seq": 128,
        "batch": 16,
        "vocab": 1024,
    },
    # Llama-3-8B's shape; 1M tokens per step.
    "8b": {
        "layers": 32,
        "d_model": 4096,
        "heads": 32,
        "kv_heads": 8,
        "d_ff": 14336,
        "seq": 4096,
        "batch": 256,
        "vocab": 128256,
    },
    # Llama-2-70B's shape; 4M tokens per step.
    "70b": {
        "layers": 80,
        "d_model": 8192,
        "heads": 64,
        "kv_heads": 8,
        "d_ff": 28672,
        "seq": 4096,
        "batch": 1024,
        "vocab": 32000,
    },
}
OPTIONAL: dict[str, Any] = {
    "scan": True,
    "remat": True,
    "remat_policy": "nothing_saveable",
    "compute_dtype": "bfloat16",
    "rope_theta": 500000.0,
}
COMPUTE_DTYPES = ("bfloat16", "float32")
# jax.checkpoint_policies that are policies themselves (not factories taking names).
REMAT_POLICIES = (
    "nothing_saveable",
    "everything_saveable",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
)

INIT_STD = 0.02


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class Config:
    """How the step computes (no shapes): remat and its policy, compute dtype, RoPE base."""

    remat: bool = True
    remat_policy: str = "nothing_saveable"
    compute_dtype: str = "bfloat16"
    rope_theta: float = 500000.0

    def __post_init__(self) -> None:
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(
                f"compute_dtype {self.compute_dtype!r} is not supported; use one of "
                f"{', '.join(COMPUTE_DTYPES)}"
            )
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"remat_policy {self.remat_policy!r} is not supported; use one of "
                f"{', '.join(REMAT_POLICIES)}"
            )

    @property
    def dtype(self) -> jnp.dtype:
        return jnp.dtype(self.compute_dtype)


# ----------------------------------------------------------------------------- init


def _check_heads(d_model: int, heads: int, kv_heads: int) -> int:
    """head_dim; ValueError unless heads divide d_model and kv_heads divide heads."""
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
    if heads % kv_heads:
        raise ValueError(f"heads {heads} is not divisible by kv_heads {kv_heads}")
    head_dim = d_model // heads
    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} (d_model / heads) must be even for RoPE")
    return head_dim


def layer_spec(*, d_model: int, heads: int, kv_heads: int, d_ff: int, layers: int) -> Params:
    hd = _check_heads(d_model, heads, kv_heads)
    out_std = INIT_STD / math.sqrt(2 * layers)
    kv = normal((d_model, kv_heads, hd), INIT_STD)
    return {
        "attn_norm": {"scale": ones((d_model,))},
        "attn": {
            "q": normal((d_model, heads, hd), INIT_STD),
            "k": kv,
            "v": kv,
            "o": normal((heads, hd, d_model), out_std),
        },
        "mlp_norm": {"scale": ones((d_model,))},
        "mlp": {
            "w_gate": normal((d_model, d_ff), INIT_STD),
            "w_in": normal((d_model, d_ff), INIT_STD),
            "w_out": normal((d_ff, d_model), out_std),
        },
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
    kv_heads: int,
    d_ff: int,
    vocab: int,
    scan: bool = True,
    **_: Any,
) -> Params:
    """Float32 parameters; `scan=True` stacks the weights `scan=False` would give."""
    spec: Params = {
        "embed": normal((vocab, d_model), INIT_STD),
        "layers": [
            layer_spec(d_model=d_model, heads=heads, kv_heads=kv_heads, d_ff=d_ff, layers=layers)
            for _ in range(layers)
        ],
        "final_norm": {"scale": ones((d_model,))},
        "unembed": normal((d_model, vocab), INIT_STD),
    }
    params = materialize(key, spec)
    if scan:
        params["layers"] = stack_layers(params["layers"])
    return params


def optimizer(**size: Any) -> optax.GradientTransformation:
    """adamw; its moments take the parameters' dtype (float32)."""
    del size
    return optax.adamw(1e-3)


def config(
    *,
    remat: bool = True,
    remat_policy: str = "nothing_saveable",
    compute_dtype: str = "bfloat16",
    rope_theta: float = 500000.0,
    **_: Any,
) -> Config:
    return Config(bool(remat), remat_policy, compute_dtype, float(rope_theta))


def batch_shapes(*, batch: int, seq: int, **cfg: Any) -> dict:
    return {
        "tokens": sds((batch, seq), jnp.int32),
        "targets": sds((batch, seq), jnp.int32),
        "config": config(**cfg),
    }


def make_batch(rng: np.random.Generator, *, batch: int, seq: int, vocab: int, **cfg: Any) -> dict:
    """Arithmetic token sequences mod `vocab` (learnable); targets are the next tokens."""
    start = rng.integers(0, vocab, (batch, 1))
    stride = rng.integers(1, 4, (batch, 1))
    seqs = ((start + stride * np.arange(seq + 1)[None, :]) % vocab).astype(np.int32)
    return {"tokens": seqs[:, :-1], "targets": seqs[:, 1:], "config": config(**cfg)}


def example_args(
    abstract: bool = True, preset: str | None = "tiny", **size: Any
) -> tuple[Params, PyTree, dict]:
    cfg = resolve_size(PRESETS, preset, size, OPTIONAL)
    config(**cfg)  # bad options fail here, before anything is built
    _check_heads(cfg["d_model"], cfg["heads"], cfg["kv_heads"])
    return build_example_args(init, optimizer, batch_shapes, make_batch, cfg, abstract)


def param_count(preset: str | None = None, **size: Any) -> int:
    """Parameter count for a preset and/or explicit sizes (eval_shape, nothing allocated)."""
    return count_params(init, PRESETS, preset, size, OPTIONAL)


# ----------------------------------------------------------------------------- forward


def rms_norm(scale: jax.Array, x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RMSNorm over the last axis, computed in float32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype) * scale.astype(x.dtype)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of [batch, seq, heads, head_dim] (rotate-half form)."""
    seq, hd = x.shape[1], x.shape[-1]
    freq = theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    angle = jnp.arange(seq, dtype=jnp.float32)[:, None] * freq[None, :]
    sin = jnp.sin(angle)[None, :, None, :].astype(x.dtype)
    cos = jnp.cos(angle)[None, :, None, :].astype(x.dtype)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(p: Params, x: jax.Array, theta: float) -> jax.Array:
    """Causal grouped-query attention: `heads` query heads share `kv_heads` key/value heads."""
    dt = x.dtype
    q = rope(jnp.einsum("bsd,dhk->bshk", x, p["q"].astype(dt)), theta)
    k = rope(jnp.einsum("bsd,dgk->bsgk", x, p["k"].astype(dt)), theta)
    v = jnp.einsum("bsd,dgk->bsgk", x, p["v"].astype(dt))
    b, s, h, hd = q.shape
    g = k.shape[2]
    q = q.reshape(b, s, g, h // g, hd)
    scores = jnp.einsum("bqgrk,bsgk->bgrqs", q, k).astype(jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum("bgrqs,bsgk->bqgrk", probs, v).reshape(b, s, h, hd)
    return jnp.einsum("bqhk,hkd->bqd", out, p["o"].astype(dt))


def mlp(p: Params, x: jax.Array) -> jax.Array:
    """SwiGLU: silu(x W_gate) * (x W_in), then W_out."""
    dt = x.dtype
    gate = jax.nn.silu(jnp.einsum("bsd,df->bsf", x, p["w_gate"].astype(dt)))
    h = gate * jnp.einsum("bsd,df->bsf", x, p["w_in"].astype(dt))
    return jnp.einsum("bsf,fd->bsd", h, p["w_out"].astype(dt))


def block(p: Params, x: jax.Array, cfg: Config) -> jax.Array:
    x = x + attention(p["attn"], rms_norm(p["attn_norm"]["scale"], x), cfg.rope_theta)
    return x + mlp(p["mlp"], rms_norm(p["mlp_norm"]["scale"], x))


def run_layers(layers: list[Params] | Params, x: jax.Array, cfg: Config) -> jax.Array:
    """Unrolled over a list of layers, or `lax.scan` over a stacked dict; each layer under
    `jax.checkpoint` when `cfg.remat`."""
    scanned = isinstance(layers, dict)

    def layer(p: Params, h: jax.Array) -> jax.Array:
        return block(p, h, cfg)

    if cfg.remat:
        policy = getattr(jax.checkpoint_policies, cfg.remat_policy)
        # Under scan the recompute cannot be hoisted out of the backward loop, so CSE
        # prevention is not needed there (JAX's own advice); unrolled, it keeps remat.
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=not scanned)
    if isinstance(layers, dict):  # scanned
        x, _ = jax.lax.scan(lambda h, p: (layer(p, h), None), x, layers)
        return x
    for p in layers:
        x = layer(p, x)
    return x


def logits(params: Params, x: jax.Array) -> jax.Array:
    """Final RMSNorm and the (untied) projection to the vocabulary, in float32."""
    x = rms_norm(params["final_norm"]["scale"], x)
    out = jnp.einsum("bsd,dv->bsv", x, params["unembed"].astype(x.dtype))
    return out.astype(jnp.float32)


def loss_fn(params: Params, batch: dict) -> jax.Array:
    cfg: Config = batch["config"]
    x = params["embed"][batch["tokens"]].astype(cfg.dtype)
    x = run_layers(params["layers"], x, cfg)
    return cross_entropy(logits(params, x), batch["targets"])


def train_step(params: Params, opt_state: PyTree, batch: dict) -> tuple[Params, PyTree, dict]:
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params, opt_state = apply_updates(optimizer(), grads, opt_state, params)
    return params, opt_state, {"loss": loss}
