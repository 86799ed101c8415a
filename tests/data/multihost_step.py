"""One process of a 2-process run: 4 CPU devices each, gloo collectives, 8 global devices.

    python multihost_step.py PROCESS_ID PORT OUT.npz

Every process builds the same goal and plan, lays out its part of the global arrays with
`jax.make_array_from_callback`, runs `plan.jit()`, and process 0 writes the gathered
outputs to OUT.npz."""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import partir  # noqa: E402
from partir.models import mlp  # noqa: E402

assert jax.device_count() == 8 and jax.local_device_count() == 4
args = mlp.example_args(abstract=False)  # the same values on every host (fixed seeds)
goal = partir.Goal(mlp.train_step, args, mesh={"batch": 2, "model": 4})
plan = partir.plan(
    goal,
    {"batch/*": P("batch"), "**/layers/0/w": P(None, "model"), "**/layers/1/w": P("model", None)},
)
ins, _ = plan.shardings()
host = jax.tree.map(np.asarray, args)
global_args = jax.tree.map(
    lambda x, s: jax.make_array_from_callback(x.shape, s, lambda idx, x=x: x[idx]), host, ins
)
result = plan.jit()(*global_args)
leaves = [multihost_utils.process_allgather(x, tiled=True) for x in jax.tree.leaves(result)]
if pid == 0:
    np.savez(out, *[np.asarray(x) for x in leaves])
