"""Plan a Flax NNX transformer train step with partir, run it sharded, print the rules.

NNX modules are stateful objects; partir needs a pure function of pytrees. `nnx.split`
separates a module into a static graph definition and its state, `nnx.to_pure_dict`
makes that state a nested dict of arrays, and `nnx.merge` rebuilds the module inside the
step. The step's arguments are then plain pytrees whose paths read like Flax's own:
`params/blocks/0/attn/query/kernel`, `optimizer/opt_state/0/mu/blocks/0/attn/query/kernel`.

    python examples/ecosystem/flax_nnx.py      # 8 fake CPU devices, a few seconds
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class Attention(nnx.Module):
    def __init__(self, d: int, heads: int, rngs: nnx.Rngs) -> None:
        # no biases on q/k: the key bias has a zero gradient (softmax ignores it)
        self.query = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.key = nnx.Linear(d, d, use_bias=False, rngs=rngs)
        self.value = nnx.Linear(d, d, rngs=rngs)
        self.out = nnx.Linear(d, d, rngs=rngs)
        self.heads = heads

    def __call__(self, x):
        b, s, d = x.shape
        split = lambda y: y.reshape(b, s, self.heads, d // self.heads)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        mask = jnp.tril(jnp.ones((s, s), bool))
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / (d // self.heads) ** 0.5
        w = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
        return self.out(jnp.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, s, d))


class Block(nnx.Module):
    def __init__(self, d: int, heads: int, rngs: nnx.Rngs) -> None:
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = Attention(d, heads, rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.mlp_in = nnx.Linear(d, 4 * d, rngs=rngs)
        self.mlp_out = nnx.Linear(4 * d, d, rngs=rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp_out(jax.nn.gelu(self.mlp_in(self.ln2(x))))


class Transformer(nnx.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocab, d, rngs=rngs)
        self.blocks = nnx.List([Block(d, heads, rngs) for _ in range(layers)])
        self.ln = nnx.LayerNorm(d, rngs=rngs)
        self.head = nnx.Linear(d, vocab, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train_step_and_args(*, vocab=256, d_model=256, heads=8, layers=2, batch=16, seq=32, seed=0):
    """A pure `train_step(params, optimizer, batch)` over pure-dict NNX state, and its
    random-initialised args (real arrays)."""
    model = Transformer(vocab, d_model, heads, layers, nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)
    model_def, model_state = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)

    def train_step(params, optimizer, batch):
        model = nnx.merge(model_def, params)
        opt = nnx.merge(opt_def, optimizer)

        def loss_fn(model):
            logits = model(batch["tokens"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return nnx.to_pure_dict(nnx.state(model)), nnx.to_pure_dict(nnx.state(opt)), {"loss": loss}

    k1, k2 = jax.random.split(jax.random.key(seed + 1))
    data = {
        "tokens": jax.random.randint(k1, (batch, seq), 0, vocab),
        "targets": jax.random.randint(k2, (batch, seq), 0, vocab),
    }
    return train_step, (nnx.to_pure_dict(model_state), nnx.to_pure_dict(opt_state), data)


def main() -> None:
    from _demo import plan_and_compare

    plan_and_compare(train_step_and_args, moments=lambda s: s["opt_state"])


if __name__ == "__main__":
    main()
