"""The mesh shape question: how many ways of data, fsdp and tensor for 64 chips.

    python benchmarks/mesh_search.py [--hand]

Solves the README's model (gpt, 24 layers, d_model 2048, batch 32, tpu-v4, 32 GiB) with
`mesh={"data": None, "fsdp": None, "tensor": None}, devices=64`, prints every shape tried
and the wall time; with --hand, also solves a few shapes one would pick by hand, each on
its own, for comparison. Step times are estimates of partir's cost model.
"""

from __future__ import annotations

import argparse
import time

import partir
from partir import strategies as st
from partir.ir.messages import fmt_bytes, fmt_seconds
from partir.models import gpt
from partir.solver.mesh_search import mesh_rows

HAND = [(8, 1, 8), (4, 4, 4), (2, 8, 4), (8, 4, 2), (1, 8, 8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hand", action="store_true", help="also solve shapes chosen by hand")
    a = ap.parse_args()
    args = gpt.example_args(layers=24, d_model=2048, heads=16, seq=1024, batch=32, vocab=32000)
    common = dict(
        device="tpu-v4",
        memory_limit="32GiB",
        schedule=[st.batch("data"), st.fsdp("fsdp"), st.megatron("tensor")],
    )
    t = time.perf_counter()
    goal = partir.Goal(
        gpt.train_step,
        args,
        devices=64,
        **common,
        mesh={"data": None, "fsdp": None, "tensor": None},
    )
    plan = partir.solve(goal)
    seconds = time.perf_counter() - t
    for row in mesh_rows(plan):
        print(" | ".join(row)[:140])
    print(
        f"chosen {plan.mesh}: step {fmt_seconds(plan.cost.step_time_s)}, peak "
        f"{fmt_bytes(plan.cost.peak_memory_bytes)} (estimates); {seconds:.1f} s in all, "
        "tracing included"
    )
    if a.hand:
        for data, fsdp, tensor in HAND:
            mesh = {"data": data, "fsdp": fsdp, "tensor": tensor}
            t = time.perf_counter()
            hand = partir.solve(
                partir.Goal(gpt.train_step, args, mesh=mesh, **common), baselines=False
            )
            print(
                f"by hand {mesh}: step {fmt_seconds(hand.cost.step_time_s)}, peak "
                f"{fmt_bytes(hand.cost.peak_memory_bytes)} ({time.perf_counter() - t:.1f} s)"
            )


if __name__ == "__main__":
    main()
