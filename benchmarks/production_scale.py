"""Production-scale plans: Llama-shaped train steps on thousands of chips, beside the roofline.

    python benchmarks/production_scale.py [--seconds S] [--json]

Each case is examples/llama.partir with another preset and mesh: layers under `lax.scan`, each
under `jax.checkpoint` (nothing saved), GQA, bf16 compute over f32 master weights and adamw
moments; data: batch, fsdp: batch + ZeRO-3, tensor: Megatron. Printed per case: the wall time
of `partir.solve` on this machine, the plan's estimated peak memory against the limit, its
estimated compute and step time, and the roofline ideal of the same step:

    ideal = (8 N T + 16 L d S T) / (chips x peak FLOP/s)

with N parameters, T tokens per step, L layers, d the model width, S the sequence length: the
forward, backward and the rematerialised forward of every matmul (8 N T) and of attention's
two S x S products (16 L d S T), as PaLM's MFU counts them. Compute and step time are
estimates of partir's cost model; the ideal is arithmetic. "of it FLOPs" is the plan's FLOPs
at the device's peak (what XLA's cost analysis would count, rematerialisation included): the
rest of the compute estimate is kernels bound by HBM bandwidth, most of it attention's
S x S softmax, which XLA materialises where a model does not call a fused attention kernel. Where the plan splits a mesh axis
in two parts (16 tensor ways over 8 key-value heads: `tensor:0` x `tensor:1`, see
partir/solver/subaxes.py), the parts are named after the ratio. The last case leaves the
shape to partir: every data x fsdp x tensor of 4096 chips is screened on the model's
shallow copies and the best few searched in full (partir/solver/mesh_search.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CASES = [
    # (label, preset, mesh); the 70B mesh first: 16 tensor ways over 8 kv heads, split
    ("70b 16x16x16", "70b", {"data": 16, "fsdp": 16, "tensor": 16}),
    ("70b 16x32x8", "70b", {"data": 16, "fsdp": 32, "tensor": 8}),
    ("8b 4x16x4", "8b", {"data": 4, "fsdp": 16, "tensor": 4}),
    # the shape searched: every data x fsdp x tensor of 4096 chips (`data=?, ... over 4096`)
    ("70b ? over 4096", "70b", {"data": None, "fsdp": None, "tensor": None}),
]
CHIPS = 4096  # of the searched shape


def goal_text(preset: str, mesh: dict[str, int], seconds: float) -> str:
    text = (ROOT / "examples" / "llama.partir").read_text()
    text = text.replace('preset="8b"', f'preset="{preset}"')
    over = f" over {CHIPS}" if None in mesh.values() else ""
    text = text.replace(
        "mesh    data=4, fsdp=16, tensor=4",
        "mesh    " + ", ".join(f"{a}={n or '?'}" for a, n in mesh.items()) + over,
    )
    return text.replace("seconds=30", f"seconds={seconds:g}")


def ideal_seconds(preset: str, chips: int, peak_flops: float) -> float:
    from partir.models import llama

    cfg = {**llama.OPTIONAL, **llama.PRESETS[preset]}
    n = llama.param_count(preset)
    tokens = cfg["batch"] * cfg["seq"]
    flops = 8 * n * tokens + 16 * cfg["layers"] * cfg["d_model"] * cfg["seq"] * tokens
    return flops / (chips * peak_flops)


def run(seconds: float) -> list[dict]:
    import partir

    rows = []
    for label, preset, mesh in CASES:
        t0 = time.perf_counter()
        goal = partir.load_goal_text(goal_text(preset, mesh, seconds), "<production_scale>")
        plan = partir.solve(goal, baselines=False)
        wall = time.perf_counter() - t0
        chips = CHIPS if None in mesh.values() else 1
        for n in mesh.values():
            chips *= n or 1
        ideal = ideal_seconds(preset, chips, goal.device.flops)
        c = plan.cost
        rows.append(
            {
                "case": label,
                "chips": chips,
                "solve_s": wall,
                "fits": c.fits,
                "peak_bytes": c.peak_memory_bytes,
                "limit_bytes": goal.memory_limit,
                "compute_s": c.compute_s,
                "flops_s": c.flops / goal.device.flops,
                "step_s": c.step_time_s,
                "ideal_s": ideal,
                "compute_over_ideal": c.compute_s / ideal,
                "split": ", ".join(a for a in plan.mesh if a not in mesh),
                "mesh": dict(plan.mesh) if None in mesh.values() else None,
            }
        )
        print(f"  {label}: {wall:.1f} s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="search budget per case")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = run(a.seconds)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    gib = 1024**3
    print(
        f"{'case':<16}{'chips':>6}{'solve':>8}{'peak / limit (est.)':>22}"
        f"{'compute (est.)':>16}{'of it FLOPs':>13}{'step (est.)':>13}{'ideal':>9}"
        f"{'compute/ideal':>15}"
    )
    for r in rows:
        peak = f"{r['peak_bytes'] / gib:.1f}/{r['limit_bytes'] / gib:.0f} GiB"
        print(
            f"{r['case']:<16}{r['chips']:>6}{r['solve_s']:>7.1f}s{peak:>22}"
            f"{r['compute_s']:>15.3f}s{r['flops_s']:>12.3f}s{r['step_s']:>12.3f}s"
            f"{r['ideal_s']:>8.3f}s"
            f"{r['compute_over_ideal']:>14.2f}x"
            + (f"  on {r['split']}" if r["split"] else "")
            + (f"  chose {'x'.join(map(str, r['mesh'].values()))}" if r["mesh"] else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
