"""Plan a Penzai train step with partir, run it sharded, print the rules.

A Penzai model is a pytree of layers whose weights sit in `pz.Parameter`s holding named
arrays. `pz.unbind_params(model, freeze=True)` splits it into a parameter-free model and
the parameter values; the step takes the values as plain arrays in a nested dict keyed by
the parameters' labels (`hidden/Linear.weights` becomes `params/hidden/Linear.weights`),
re-tags them with their axis names, and binds them back with `pz.bind_variables`.

    python examples/ecosystem/penzai_mlp.py      # 8 fake CPU devices, a few seconds
"""

from __future__ import annotations

import dataclasses

import jax
import optax
from penzai import pz

import partir
from partir import strategies as st


def _nest(flat: dict) -> dict:
    out: dict = {}
    for path, x in flat.items():
        *outer, leaf = path.split("/")
        node = out
        for key in outer:
            node = node.setdefault(key, {})
        node[leaf] = x
    return out


def _get(tree: dict, path: str):
    for key in path.split("/"):
        tree = tree[key]
    return tree


def train_step_and_args(*, d_in=256, hidden=1024, classes=16, batch=64, seed=0):
    """A pure `train_step(params, opt_state, batch)` of a Penzai MLP classifier with
    optax.adamw, and its random-initialised args (real arrays)."""
    keys = jax.random.split(jax.random.key(seed), 4)
    model = pz.nn.Sequential([
        pz.nn.Affine.from_config(name="hidden", init_base_rng=keys[0],
                                 input_axes={"features": d_in}, output_axes={"hidden": hidden}),
        pz.nn.Elementwise(jax.nn.gelu),
        pz.nn.Affine.from_config(name="out", init_base_rng=keys[1],
                                 input_axes={"hidden": hidden}, output_axes={"classes": classes}),
    ])  # fmt: skip
    unbound, values = pz.unbind_params(model, freeze=True)
    axes = {v.label: tuple(v.value.named_axes) for v in values}
    tx = optax.adamw(1e-3)

    def bind(params):
        return pz.bind_variables(unbound, [
            dataclasses.replace(v, value=pz.nx.wrap(_get(params, v.label)).tag(*axes[v.label]))
            for v in values
        ])  # fmt: skip

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            x = pz.nx.wrap(batch["x"]).tag("batch", "features")
            logits = bind(p)(x).untag("batch", "classes").unwrap()
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    params = _nest({v.label: v.value.unwrap(*axes[v.label]) for v in values})
    data = {"x": jax.random.normal(keys[2], (batch, d_in)),
            "y": jax.random.randint(keys[3], (batch,), 0, classes)}  # fmt: skip
    return train_step, (params, tx.init(params), data)


def main() -> None:
    jax.config.update("jax_num_cpu_devices", 8)  # fake devices: a script may, a library not
    from partir.testing import check_plan, max_relative_error

    train_step, args = train_step_and_args()
    goal = partir.Goal(train_step, args, mesh={"batch": 2, "model": 4}, device="tpu-v4",
                       schedule=[st.batch("batch"), st.megatron("model")],
                       search=partir.Search(seed=0, episodes=40))  # fmt: skip
    plan = partir.solve(goal)
    check_plan(goal, plan)
    print(plan)
    got, want = plan.jit()(*args), jax.jit(train_step)(*args)
    print("loss sharded / unsharded:", float(got[2]["loss"]), float(want[2]["loss"]))
    print("max relative error of the gradients (Adam's mu):",
          max_relative_error(got[1][0].mu, want[1][0].mu))  # fmt: skip
    print(plan.rules_source())


if __name__ == "__main__":
    main()
