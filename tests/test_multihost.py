"""plan.jit under jax.distributed: 2 processes of 4 CPU devices each, gloo collectives,
give what one process gives."""

import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import partir
from partir.models import mlp

WORKER = pathlib.Path(__file__).parent / "data" / "multihost_step.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_plan_jit_on_two_processes_equals_one_process(tmp_path):
    out, port = tmp_path / "out.npz", str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), port, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    got = np.load(out)
    args = mlp.example_args(abstract=False)
    goal = partir.Goal(mlp.train_step, args, mesh={"batch": 2, "model": 4})
    plan = partir.plan(
        goal,
        {
            "batch/*": P("batch"),
            "**/layers/0/w": P(None, "model"),
            "**/layers/1/w": P("model", None),
        },
    )
    want = jax.tree.leaves(plan.jit()(*args))
    assert len(got.files) == len(want)
    for k, w in enumerate(want):
        np.testing.assert_allclose(got[f"arr_{k}"], np.asarray(w), rtol=1e-5, atol=1e-6)
