"""Plan a MaxText-style Flax linen train step with partir and print `logical_axis_rules`.

MaxText (and T5X before it) names every parameter dim with a logical axis
(`nn.with_logical_partitioning(init, ("embed", "mlp"))`) and every activation too
(`nn.with_logical_constraint(x, ("activation_batch", ...))`), and a `logical_axis_rules`
list maps those names to mesh axes. This script plans a small decoder written that way,
reads the plan back as one mesh axis per logical name (`plan.logical_axis_rules`), checks that Flax's own
`nn.logical_to_mesh` of those rules gives back the plan's specs, and runs the step under
the rules with Flax's shardings, beside `plan.jit` and the unsharded step.

    python examples/ecosystem/linen_logical.py      # 8 fake CPU devices, a few seconds
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

import partir

BATCH_AXES = ("activation_batch", "activation_length")  # the logical names of the data
RESIDUAL = (*BATCH_AXES, "activation_embed")  # the residual stream's


class Dense(nn.Module):
    """A kernel of shape (contracted input dims) + `features` with one logical name per
    dim, as MaxText's own DenseGeneral (Flax's reshapes a 2-d kernel, whose logical names
    then do not fit under active rules)."""

    features: tuple[int, ...]
    axes: tuple[str, ...]
    contract: int = 1  # trailing input dims contracted

    @nn.compact
    def __call__(self, x):
        shape = x.shape[x.ndim - self.contract :] + self.features
        fan_in, fan_out = tuple(range(self.contract)), tuple(range(self.contract, len(shape)))
        init = nn.initializers.lecun_normal(in_axis=fan_in, out_axis=fan_out)
        kernel = self.param("kernel", nn.with_logical_partitioning(init, self.axes), shape)
        return jnp.tensordot(x, kernel, self.contract)


def norm(name: str) -> nn.RMSNorm:
    return nn.RMSNorm(
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("norm",)), name=name
    )


class DecoderLayer(nn.Module):
    heads: int
    head_dim: int
    mlp: int

    @nn.compact
    def __call__(self, x, _):
        s, d = x.shape[1:]
        heads, h = (self.heads, self.head_dim), norm("pre_attention_norm")(x)
        q = Dense(heads, ("embed", "q_heads", "kv"), name="query")(h)
        k = Dense(heads, ("embed", "kv_heads", "kv_head_dim"), name="key")(h)
        v = Dense(heads, ("embed", "kv_heads", "kv_head_dim"), name="value")(h)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / self.head_dim**0.5
        logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e9)
        y = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
        x = x + Dense((d,), ("heads", "kv", "embed"), contract=2, name="out")(y)
        x = nn.with_logical_constraint(x, RESIDUAL)
        h = jax.nn.gelu(Dense((self.mlp,), ("embed", "mlp"), name="wi")(norm("pre_mlp_norm")(x)))
        h = nn.with_logical_constraint(h, (*BATCH_AXES, "activation_mlp"))
        x = x + Dense((d,), ("mlp", "embed"), name="wo")(h)
        return nn.with_logical_constraint(x, RESIDUAL), None


class Decoder(nn.Module):
    vocab: int = 256
    d_model: int = 256
    heads: int = 8
    mlp: int = 1024
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        embed_init = nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
        embed = nn.Embed(self.vocab, self.d_model, embedding_init=embed_init, name="token_embedder")
        x = nn.with_logical_constraint(embed(tokens), RESIDUAL)
        # the layers scanned, as MaxText's scan_layers: every weight gains a "layers" dim
        stack = nn.scan(
            DecoderLayer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            length=self.layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        x, _ = stack(self.heads, self.d_model // self.heads, self.mlp, name="layers")(x, None)
        x = norm("decoder_norm")(x)
        return Dense((self.vocab,), ("embed", "vocab"), name="logits_dense")(x)


def train_step_and_args(*, batch=16, seq=32, seed=0, **model):
    """A pure `train_step(params, opt_state, batch)` over unboxed linen params, its
    random-initialised args, and the args' logical specs (a pytree of PartitionSpecs of
    logical axis names, as MaxText keeps them)."""
    net = Decoder(**model)
    tx = optax.adamw(1e-3)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    data = {
        "tokens": jax.random.randint(k1, (batch, seq), 0, net.vocab),
        "targets": jax.random.randint(k2, (batch, seq), 0, net.vocab),
    }
    boxed = net.init(k3, data["tokens"])["params"]  # leaves are nn.LogicallyPartitioned

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            logits = net.apply({"params": p}, batch["tokens"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    params = nn.unbox(boxed)
    # the moments inherit the params' names, as in Flax's and MaxText's own state setup
    logical = nn.get_partition_spec((boxed, jax.eval_shape(tx.init, boxed)))
    logical += ({"tokens": P(*BATCH_AXES), "targets": P(*BATCH_AXES)},)
    return train_step, (params, tx.init(params), data), logical


def rules_give_back(plan, logical, rules) -> bool:
    """Whether Flax's own `nn.logical_to_mesh` of `rules` gives every input its plan spec."""
    mesh_specs = nn.logical_to_mesh(logical, rules)
    flat = jax.tree_util.tree_leaves(mesh_specs, is_leaf=lambda x: isinstance(x, P))
    return all(_same(s, plan.specs[p]) for p, s in zip(plan.goal.program.inputs, flat, strict=True))


def _same(a: P, b: P) -> bool:
    def entry(spec: P, dim: int):
        e = spec[dim] if dim < len(spec) else None
        return (e,) if isinstance(e, str) else tuple(e or ())

    return all(entry(a, d) == entry(b, d) for d in range(max(len(a), len(b))))


def main() -> None:
    jax.config.update("jax_num_cpu_devices", 8)  # fake devices: a script may, a library not
    from _demo import goal_for

    from partir.solver.jit import make_mesh
    from partir.testing import check_plan

    train_step, args, logical = train_step_and_args()
    goal = goal_for(train_step, args)
    plan = partir.solve(goal)
    check_plan(goal, plan)
    print(plan)

    rules = plan.logical_axis_rules(logical)  # a PlanError names any dims it cannot give back
    print("logical_axis_rules = [")
    for name, axes in rules:
        print(f"    ({name!r}, {axes!r}),")
    print("]")
    print(
        "Flax's logical_to_mesh of these rules gives back the plan's specs:",
        rules_give_back(plan, logical, rules),
    )

    mesh = make_mesh(goal.mesh)
    shardings = nn.logical_to_mesh_sharding(logical, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):  # activation constraints apply
        flax_step = jax.jit(train_step, in_shardings=shardings)
        by_rules = flax_step(*args)
    got, want = plan.jit()(*args), jax.jit(train_step)(*args)
    print("loss sharded:", float(got[2]["loss"]), float(want[2]["loss"]))
    print("loss under the logical rules:", float(by_rules[2]["loss"]))
    print(plan.rules_source())


if __name__ == "__main__":
    main()
