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
from _demo import get_path, nest_paths  # the script's folder is on sys.path
from penzai import pz


def train_step_and_args(*, d_in=256, hidden=1024, classes=16, batch=64, seed=0):
    """A pure `train_step(params, opt_state, batch)` of a Penzai MLP classifier with
    optax.adamw, and its random-initialised args (real arrays)."""
    keys = jax.random.split(jax.random.key(seed), 4)
    model = pz.nn.Sequential(
        [
            pz.nn.Affine.from_config(
                name="hidden",
                init_base_rng=keys[0],
                input_axes={"features": d_in},
                output_axes={"hidden": hidden},
            ),
            pz.nn.Elementwise(jax.nn.gelu),
            pz.nn.Affine.from_config(
                name="out",
                init_base_rng=keys[1],
                input_axes={"hidden": hidden},
                output_axes={"classes": classes},
            ),
        ]
    )
    unbound, values = pz.unbind_params(model, freeze=True)
    axes = {v.label: tuple(v.value.named_axes) for v in values}
    tx = optax.adamw(1e-3)

    def bind(params):
        return pz.bind_variables(
            unbound,
            [
                dataclasses.replace(
                    v, value=pz.nx.wrap(get_path(params, v.label)).tag(*axes[v.label])
                )
                for v in values
            ],
        )

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            x = pz.nx.wrap(batch["x"]).tag("batch", "features")
            logits = bind(p)(x).untag("batch", "classes").unwrap()
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    params = nest_paths({v.label: v.value.unwrap(*axes[v.label]) for v in values})
    data = {
        "x": jax.random.normal(keys[2], (batch, d_in)),
        "y": jax.random.randint(keys[3], (batch,), 0, classes),
    }
    return train_step, (params, tx.init(params), data)


def main() -> None:
    from _demo import plan_and_compare

    plan_and_compare(train_step_and_args)


if __name__ == "__main__":
    main()
