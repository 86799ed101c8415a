"""IR speed: trace + full propagation of a 48-layer transformer train step, and the cost
of one incremental decision. Times are indicative (a noisy 2-core machine); run:

    python benchmarks/ir_speed.py [--layers 48]
"""

import argparse
import statistics
import time

import jax

from partir.goal import Goal
from partir.ir.groups import find_groups
from partir.ir.propagate import Decision
from partir.models import gpt
from partir.solver.baselines import MEGATRON, _fill
from partir.solver.plan import input_decisions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--scan", action="store_true", help="layers in a lax.scan")
    args = ap.parse_args()
    size = dict(
        layers=args.layers, d_model=1024, heads=16, seq=512, batch=64, vocab=32000, scan=args.scan
    )
    ex = gpt.example_args(preset=None, **size)
    mesh = {"batch": 8, "model": 8}

    jax.clear_caches()
    goal = Goal(gpt.train_step, ex, mesh)
    t0 = time.perf_counter()
    prog = goal.program  # traced once, here
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    prop = goal.propagator  # the rules attached, the program's own constraints applied
    t_rules = time.perf_counter() - t0
    decisions = input_decisions(goal, {"batch/*": jax.sharding.PartitionSpec("batch")})
    decisions += input_decisions(goal, _fill(MEGATRON, m="model"), priority=2)
    t0 = time.perf_counter()
    state, _ = prop.apply_all(prop.empty(), decisions)
    t_prop = time.perf_counter() - t0
    kind = "scanned" if args.scan else "unrolled"
    print(
        f"{args.layers}-layer ({kind}) gpt train step: {len(prog.ops)} ops, {len(prog.values)} values"
    )
    print(
        f"trace {t_trace:.3f} s + rules {t_rules:.3f} s + full propagation "
        f"({len(decisions)} decisions) {t_prop:.3f} s = {t_trace + t_rules + t_prop:.3f} s"
    )

    # incremental: one decision (one input) on a propagated state, fresh memo each time
    base, _ = prop.apply_all(
        prop.empty(), input_decisions(goal, {"batch/*": jax.sharding.PartitionSpec("batch")})
    )
    times = []
    vids = [v for p, v in prog.inputs.items() if p.startswith("params/layers/")]
    for vid in vids[:200]:
        shape = prog.values[vid].shape
        dim = max(range(len(shape)), key=lambda d: shape[d])
        prop._memo.clear()
        t0 = time.perf_counter()
        prop.apply(base, Decision(5, vid, dim, "model"))
        times.append(time.perf_counter() - t0)
    print(
        f"one incremental decision (a single input, cold memo): median "
        f"{statistics.median(times) * 1e3:.2f} ms, max {max(times) * 1e3:.2f} ms"
    )
    warm = []
    for vid in vids[:200]:
        shape = prog.values[vid].shape
        dim = max(range(len(shape)), key=lambda d: shape[d])
        t0 = time.perf_counter()
        prop.apply(base, Decision(5, vid, dim, "model"))
        warm.append(time.perf_counter() - t0)
    print(
        f"the same decisions again (warm memo, as in a search revisiting ops): median "
        f"{statistics.median(warm) * 1e3:.2f} ms"
    )
    groups = [g for g in find_groups(goal.program) if g.params and len(g.shape) >= 2]
    times = []
    for g in groups:
        dim = max(range(len(g.shape)), key=lambda d: g.shape[d])
        t0 = time.perf_counter()
        prop.apply_all(base, [Decision(5, v, dim, "model") for v in g.members])
        times.append(time.perf_counter() - t0)
    print(
        f"one search action (a group: a weight in all {args.layers} layers with its "
        f"moments): median {statistics.median(times) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
