"""Plan a Jraph graph network train step with partir, run it sharded, print the rules.

A `jraph.GraphsTuple` is a namedtuple, so it is a pytree whose leaves partir names by
field: `batch/nodes`, `batch/edges`, `batch/senders`, ... The update functions are Haiku
MLPs inside one `hk.transform`; the train step is a function of `(params, opt_state,
batch)`. Graph batches have a fixed (padded) number of nodes and edges, as under jit.

    python examples/ecosystem/jraph_gnn.py      # 8 fake CPU devices, a few seconds
"""

from __future__ import annotations

import haiku as hk
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax


def random_graphs(*, graphs=8, nodes=32, edges=64, features=16, seed=0) -> jraph.GraphsTuple:
    """`graphs` random graphs of `nodes` nodes and `edges` edges each, batched."""
    rng = np.random.default_rng(seed)
    offsets = np.repeat(np.arange(graphs) * nodes, edges)
    return jraph.GraphsTuple(
        nodes=jnp.asarray(rng.normal(size=(graphs * nodes, features)), jnp.float32),
        edges=jnp.asarray(rng.normal(size=(graphs * edges, features)), jnp.float32),
        senders=jnp.asarray(rng.integers(0, nodes, graphs * edges) + offsets, jnp.int32),
        receivers=jnp.asarray(rng.integers(0, nodes, graphs * edges) + offsets, jnp.int32),
        globals=jnp.zeros((graphs, features), jnp.float32),
        n_node=jnp.full((graphs,), nodes, jnp.int32),
        n_edge=jnp.full((graphs,), edges, jnp.int32),
    )


def train_step_and_args(*, hidden=256, steps=2, graphs=8, nodes=32, edges=64, features=16, seed=0):
    """A pure `train_step(params, opt_state, batch)` of an interaction-network GNN that
    regresses one value per graph, with optax.adam, and its random-initialised args."""

    def mlp(name):
        return hk.nets.MLP([hidden, features], activation=jax.nn.relu, name=name)

    def forward(graph: jraph.GraphsTuple):
        for k in range(steps):
            net = jraph.GraphNetwork(
                update_edge_fn=lambda e, s, r, g, k=k: mlp(f"edge_{k}")(
                    jnp.concatenate([e, s, r, g], -1)
                ),
                update_node_fn=lambda n, s, r, g, k=k: mlp(f"node_{k}")(
                    jnp.concatenate([n, s, r, g], -1)
                ),
                update_global_fn=lambda n, e, g, k=k: mlp(f"global_{k}")(
                    jnp.concatenate([n, e, g], -1)
                ),
            )
            graph = net(graph)
        return hk.Linear(1, name="readout")(graph.globals)[:, 0]

    net = hk.without_apply_rng(hk.transform(forward))
    tx = optax.adam(1e-3)

    def train_step(params, opt_state, batch):
        def loss_fn(p):
            return jnp.mean((net.apply(p, batch["graph"]) - batch["target"]) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss}

    graph = random_graphs(graphs=graphs, nodes=nodes, edges=edges, features=features, seed=seed)
    params = net.init(jax.random.key(seed), graph)
    data = {"graph": graph, "target": jnp.linspace(-1.0, 1.0, graphs)}
    return train_step, (params, tx.init(params), data)


def main() -> None:
    from _demo import plan_and_compare

    plan_and_compare(train_step_and_args)


if __name__ == "__main__":
    main()
