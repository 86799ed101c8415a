"""What `partir.jit` costs: the first call (trace, plan, compile, run) and every later call
against `jax.jit` of the same function with the same shardings, on 8 fake CPU devices.

    python benchmarks/jit_overhead.py [--preset tiny|small] [--calls 50]

Times are wall-clock medians on this machine; the later calls run the same compiled XLA
program under both, so what differs is the Python dispatch in front of it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import partir  # noqa: E402
from partir import strategies as st  # noqa: E402
from partir.models import gpt  # noqa: E402


def interleaved(fns: dict, args, calls: int) -> dict[str, list[float]]:
    """Per function, the wall time of `calls` train steps, run round-robin so that other
    load on the machine falls on all of them alike."""
    params, opt_state, batch = args
    state = {}
    for name, fn in fns.items():  # warm: arguments now carry the plan's shardings
        p, o, m = fn(params, opt_state, batch)
        jax.block_until_ready(m)
        state[name] = (p, o)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(calls):
        for name, fn in fns.items():
            p, o = state[name]
            t = time.perf_counter()
            p, o, m = fn(p, o, batch)
            jax.block_until_ready(m)
            times[name].append(time.perf_counter() - t)
            state[name] = (p, o)
    return times


def dispatch_us(calls: int = 2000) -> tuple[float, float]:
    """Median microseconds per call of a one-op function: partir.jit against jax.jit with
    the same shardings, its argument already laid out as the plan says."""
    x = jax.numpy.ones((8, 128))
    ours = partir.jit(
        lambda x: x * 2.0,
        mesh={"batch": 8},
        schedule=[st.auto("batch")],
        search=partir.Search(episodes=5),
    )
    jax.block_until_ready(ours(x))
    ins, outs = ours.plan.shardings()
    x = jax.device_put(x, ins[0])
    theirs = jax.jit(lambda x: x * 2.0, in_shardings=ins, out_shardings=outs)
    out = {"partir.jit": [], "jax.jit": []}
    for fn in (ours, theirs):
        jax.block_until_ready(fn(x))
    for _ in range(calls):
        for name, fn in (("partir.jit", ours), ("jax.jit", theirs)):
            t = time.perf_counter()
            fn(x)
            out[name].append(time.perf_counter() - t)
    return (statistics.median(out["partir.jit"]) * 1e6, statistics.median(out["jax.jit"]) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--episodes", type=int, default=50)
    a = ap.parse_args()
    args = gpt.example_args(abstract=False, preset=a.preset)
    schedule = [st.batch("batch"), st.zero("batch", stage=3), st.megatron("model")]
    search = partir.Search(episodes=a.episodes, seed=0)
    step = partir.jit(
        gpt.train_step,
        mesh={"batch": 2, "model": 4},
        schedule=schedule,
        device="tpu-v4",
        search=search,
    )

    t = time.perf_counter()
    jax.block_until_ready(step(*args))
    first = time.perf_counter() - t
    plan = step.plan
    plan_s = plan.search["seconds"]

    ins, outs = plan.shardings()
    plain = jax.jit(gpt.train_step, in_shardings=ins, out_shardings=outs)
    t = time.perf_counter()
    jax.block_until_ready(plain(*args))
    plain_first = time.perf_counter() - t

    compiled = next(iter(step._compiled.values()))
    times = interleaved({"partir.jit": step, "compiled": compiled, "plain": plain}, args, a.calls)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ours_us, jax_us = dispatch_us()
    print(
        f"gpt {a.preset}, mesh batch=2 x model=4, {len(plan.goal.program.ops)} ops, "
        f"jax {jax.__version__}"
    )
    print(f"first call, partir.jit:                  {first:8.3f} s (search {plan_s:.3f} s)")
    print(f"first call, jax.jit with plan.shardings: {plain_first:8.3f} s")
    print(f"later calls (median of {a.calls}, interleaved):")
    print(f"  partir.jit                             {med['partir.jit']:8.3f} ms")
    print(f"  the jax.jit partir.jit runs            {med['compiled']:8.3f} ms")
    print(f"  jax.jit with plan.shardings only       {med['plain']:8.3f} ms")
    print(f"dispatch of a one-op function: partir.jit {ours_us:.1f} us, jax.jit {jax_us:.1f} us")


if __name__ == "__main__":
    main()
