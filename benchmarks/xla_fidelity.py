"""The cost model held to XLA: per model and plan, predicted / XLA for peak memory, collective
bytes (per kind and in total) and FLOPs, on 8 fake CPU devices.

    python benchmarks/xla_fidelity.py [--quick] [--json] [--seconds S] [--only TEXT]

What XLA's side is, per device, for the plan compiled by `plan.jit` from abstract arguments:

- peak: the peak of XLA's buffer assignment (most bytes live at once over its schedule;
  `CompiledStats.true_peak_bytes`), not `peak_memory_in_bytes` (arguments + outputs on CPU);
- collective bytes: the collectives of the optimized HLO, loop bodies weighted by their trip
  counts, kinds folded as XLA:CPU lowers them (reduce-scatter -> all-reduce);
- FLOPs: `cost_analysis()["flops"]` with each while body counted once per iteration
  (`CompiledStats.step_flops`; the cost analysis itself counts a loop body once);
- HBM bytes (`hbm`): `cost_analysis()["bytes accessed"]`, what XLA's kernels read and write,
  its collectives among them, each while body once per iteration (`step_bytes_accessed`).
  Predicted: `plan.cost.hbm_bytes`, the kernels of the cost model's fusion, no collectives.
  Reported, held to no bar: XLA:CPU fuses less than XLA:TPU and XLA:GPU, and the model's
  HBM time is meant for those.

Predicted: `plan.cost.peak_memory_bytes`, `plan.cost.bytes_by_kind()` and `plan.cost.flops`.
XLA:CPU carries bf16 collectives in f32, so every llama here computes in f32.

Models: the zoo's tiny presets, and a Llama-style step with its layers under `lax.scan` and
`jax.checkpoint` (`llama scan`) and unrolled (`llama flat`, still rematerialised). Meshes:
8 (data), 2x4 (data x model) and 2x2x2 (data x fsdp x tensor). Plans: the library's expert
plans (`partir.baselines`, BP+FSDP+MP among them on 2x2x2), for llama on 2x2x2
MaxText's default sharding (`maxtext_rules`), and the plan `partir.solve` finds in a few
seconds from the natural schedule. Compiles use LLVM optimisation level 0: the HLO, its
buffer assignment and its collectives are the same as at the default level, only the
machine code differs (checked on gpt and llama), and compiles take half the time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEVICES = 8
# Fake CPU devices: set before JAX starts its backend (this is a script, not a library).
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={DEVICES}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

MESHES: dict[str, dict[str, int]] = {
    "8": {"data": 8},
    "2x4": {"data": 2, "model": 4},
    "2x2x2": {"data": 2, "fsdp": 2, "tensor": 2},
}
FAST_COMPILE = {"xla_backend_optimization_level": 0}
GNS_EDGE_INPUTS = ("batch/edges", "batch/senders", "batch/receivers")
F32 = (("compute_dtype", "float32"),)


@dataclass(frozen=True)
class Model:
    label: str
    module: str  # a partir.models name
    preset: str
    options: tuple[tuple[str, Any], ...] = ()


ZOO = [Model(m, m, "tiny") for m in ("mlp", "gpt", "moe", "unet", "gns")]
LLAMA_SCAN = Model("llama scan", "llama", "tiny", F32)
LLAMA_FLAT = Model("llama flat", "llama", "tiny", (*F32, ("scan", False)))
LLAMA_SMALL = Model("llama-small scan", "llama", "small", F32)

# --quick: fewer models and, per mesh, only these expert plans (plus MaxText and the search).
QUICK_MODELS = [ZOO[0], ZOO[1], LLAMA_SCAN, LLAMA_FLAT]
QUICK_EXPERTS = {"8": ("Z3",), "2x4": ("BP+MP",), "2x2x2": ("BP+FSDP+MP",)}


@dataclass
class Row:
    model: str
    mesh: str
    plan: str
    predicted: dict[str, float] = field(default_factory=dict)
    xla: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    def ratio(self, what: str) -> float | None:
        p, x = self.predicted.get(what), self.xla.get(what)
        if p is None or x is None:
            return None
        if x == 0:
            return 1.0 if p == 0 else None
        return p / x


# ----------------------------------------------------------------------------- plans


def maxtext_rules(goal) -> dict:
    """MaxText's default sharding of a Llama decoder on data x fsdp x tensor, from the logical
    axis rules of its configs/base.yml: activation_batch -> (data, fsdp); embed -> fsdp;
    heads, mlp, vocab, norm -> tensor; kv (head_dim) unsharded. Its weights' logical axes:
    embedding (vocab, embed), query/key/value (embed, heads, kv), out (heads, kv, embed),
    wi_0/wi_1 (embed, mlp), wo (mlp, embed), norm scales (norm,), logits (embed, vocab). A
    scanned weight's layer dim stays whole. The optimizer moments follow their parameters."""
    from jax.sharding import PartitionSpec as P

    data, fsdp, tensor = list(goal.mesh)
    scanned = any(p.endswith("layers/attn/q") for p in goal.program.inputs)
    lead = (None,) if scanned else ()
    layer = {
        "attn/q": (fsdp, tensor, None),
        "attn/k": (fsdp, tensor, None),
        "attn/v": (fsdp, tensor, None),
        "attn/o": (tensor, None, fsdp),
        "mlp/w_gate": (fsdp, tensor),
        "mlp/w_in": (fsdp, tensor),
        "mlp/w_out": (tensor, fsdp),
        "attn_norm/scale": (tensor,),
        "mlp_norm/scale": (tensor,),
    }
    rules = {f"**/layers/**/{k}": P(*lead, *v) for k, v in layer.items()}
    rules.update(
        {
            "**/embed": P(tensor, fsdp),
            "**/unembed": P(fsdp, tensor),
            "**/final_norm/scale": P(tensor),
            "batch/tokens": P((data, fsdp)),
            "batch/targets": P((data, fsdp)),
        }
    )
    return rules


def natural_schedule(module: str, mesh: dict[str, int]) -> list:
    """What a user would write: data: batch + zero(3); model: megatron (moe: expert too);
    3-D: data: batch, fsdp: fsdp, tensor: megatron (gns batches its edge inputs)."""
    from partir import strategies as S

    axes = list(mesh)

    def batch(axis: str):
        return S.batch(axis, inputs=GNS_EDGE_INPUTS) if module == "gns" else S.batch(axis)

    def model_axis(axis: str) -> list:
        return [S.expert(axis), S.megatron(axis)] if module == "moe" else [S.megatron(axis)]

    data = axes[0]
    if len(axes) == 1:
        return [batch(data), S.zero(data, 3)] + ([S.expert(data)] if module == "moe" else [])
    if len(axes) == 2:
        return [batch(data), S.zero(data, 3), *model_axis(axes[1])]
    fsdp, tensor = axes[1], axes[2]
    sharded = [batch(fsdp), S.zero(fsdp, 3)] if module == "gns" else [S.fsdp(fsdp)]
    return [batch(data), *sharded, *model_axis(tensor)]


def plans_for(model: Model, mesh_name: str, args, quick: bool, seconds: float) -> list:
    """[(name, build)] where build() returns a Plan (or raises PlanError)."""
    import partir
    from partir.models import get

    mesh = MESHES[mesh_name]
    module = get(model.module)
    goal = partir.Goal(module.train_step, args, mesh)
    out: list[tuple[str, Callable[[], Any]]] = []
    experts = partir.baselines(goal)
    keep = QUICK_EXPERTS[mesh_name] if quick else tuple(experts)
    out += [(n, lambda p=p: p) for n, p in experts.items() if n in keep]
    if len(mesh) == 3 and model.module == "llama":
        out.append(("MaxText", lambda: partir.plan(goal, [maxtext_rules(goal)])))

    def searched():
        g = partir.Goal(
            module.train_step,
            args,
            mesh,
            schedule=natural_schedule(model.module, mesh),
            search=partir.Search(seconds=seconds, seed=0),
        )
        return partir.solve(g, baselines=False)

    out.append(("searched", searched))
    return [(n, b) for n, b in out if not quick or n in keep or n in ("MaxText", "searched")]


# ----------------------------------------------------------------------------- measuring


def measure(model: Model, mesh_name: str, name: str, build: Callable[[], Any]) -> Row:
    from partir.ir.xla import KINDS
    from partir.solver.verify import verify

    row = Row(model.label, mesh_name, name)
    t0 = time.perf_counter()
    try:
        plan = build()
        report = verify(plan.goal, plan, compiler_options=FAST_COMPILE)
    except Exception as e:  # a plan that cannot be built or compiled is reported, not fatal
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        row.seconds = time.perf_counter() - t0
        return row
    cost, stats = plan.cost, report.stats
    row.predicted = {
        "peak": cost.peak_memory_bytes,
        "flops": cost.flops,
        "collectives": sum(report.predicted.values()),
        "hbm": cost.hbm_bytes,
    }
    row.xla = {
        "peak": stats.true_peak_bytes,
        "flops": stats.step_flops,
        "collectives": sum(report.compiled.values()),
        "allocated": stats.allocated_bytes,
        "cost_analysis_flops": stats.flops,
        "hbm": stats.step_bytes_accessed,
    }
    for k in KINDS:
        if report.predicted.get(k) or report.compiled.get(k):
            row.predicted[k] = report.predicted.get(k, 0)
            row.xla[k] = report.compiled.get(k, 0)
    row.seconds = time.perf_counter() - t0
    return row


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(rows: list[Row]) -> dict[str, Any]:
    """Per metric: geometric mean of predicted / XLA, the worst plan, and how many plans are
    within 5% and 15%; over all plans and per model."""
    ok = [r for r in rows if r.error is None]

    def stats(sel: list[Row], what: str) -> dict[str, Any]:
        pairs = [(r, r.ratio(what)) for r in sel]
        pairs = [(r, x) for r, x in pairs if x is not None and x > 0]
        if not pairs:
            return {"n": 0}
        worst_r, worst = max(pairs, key=lambda rx: abs(math.log(rx[1])))
        return {
            "n": len(pairs),
            "geomean": geomean([x for _, x in pairs]),
            "within_5pct": sum(abs(x - 1) <= 0.05 for _, x in pairs),
            "within_15pct": sum(abs(x - 1) <= 0.15 for _, x in pairs),
            "worst": worst,
            "worst_plan": f"{worst_r.model} {worst_r.mesh} {worst_r.plan}",
        }

    metrics = ("peak", "collectives", "flops", "hbm")
    out: dict[str, Any] = {"all": {m: stats(ok, m) for m in metrics}}
    for label in dict.fromkeys(r.model for r in ok):
        out[label] = {m: stats([r for r in ok if r.model == label], m) for m in metrics}
    return out


# ----------------------------------------------------------------------------- printing


def _b(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= k:
            return f"{n / k:.1f}{unit}"
    return f"{n:.0f}"


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(rows: list[Row]) -> str:
    from partir.ir.cost import KIND_ABBREVIATIONS

    head = (
        f"{'model':<17}{'mesh':<7}{'plan':<12}{'peak':>6} {'pred/XLA':<15}"
        f"{'coll':>6} {'pred/XLA':<15}{'flops':>6}{'hbm':>6}  per kind (pred/XLA)"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(f"{r.model:<17}{r.mesh:<7}{r.plan:<12}  error: {r.error[:90]}")
            continue
        kinds = " ".join(
            f"{KIND_ABBREVIATIONS[k]} "
            + (
                _r(r.ratio(k))
                if r.xla[k] and r.predicted[k]
                else f"{_b(r.predicted[k])}/{_b(r.xla[k])}"
            )
            for k in KIND_ABBREVIATIONS
            if k in r.xla
        )
        lines.append(
            f"{r.model:<17}{r.mesh:<7}{r.plan:<12}"
            f"{_r(r.ratio('peak')):>6} {_b(r.predicted['peak']) + '/' + _b(r.xla['peak']):<15}"
            f"{_r(r.ratio('collectives')):>6} "
            f"{_b(r.predicted['collectives']) + '/' + _b(r.xla['collectives']):<15}"
            f"{_r(r.ratio('flops')):>6}{_r(r.ratio('hbm')):>6}  {kinds}"
        )
    return "\n".join(lines)


def summary_text(s: dict[str, Any]) -> str:
    lines = [f"{'':<17}{'metric':<12}{'n':>4}{'geomean':>9}{'<=5%':>6}{'<=15%':>7}  worst"]
    for label, by_metric in s.items():
        for m, st in by_metric.items():
            if not st["n"]:
                continue
            lines.append(
                f"{label:<17}{m:<12}{st['n']:>4}{_r(st['geomean']):>9}{st['within_5pct']:>6}"
                f"{st['within_15pct']:>7}  {_r(st['worst'])} ({st['worst_plan']})"
            )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def run(quick: bool, seconds: float, only: str | None, log=print) -> list[Row]:
    import jax

    from partir.models import get

    jax.config.update("jax_num_cpu_devices", DEVICES)
    models = QUICK_MODELS if quick else [*ZOO, LLAMA_SCAN, LLAMA_FLAT, LLAMA_SMALL]
    rows: list[Row] = []
    for model in models:
        if only and only not in model.label:
            continue
        args = get(model.module).example_args(preset=model.preset, **dict(model.options))
        for mesh_name in MESHES:
            try:
                plans = plans_for(model, mesh_name, args, quick, seconds)
            except Exception as e:
                rows.append(Row(model.label, mesh_name, "-", error=f"{type(e).__name__}: {e}"))
                continue
            for name, build in plans:
                row = measure(model, mesh_name, name, build)
                rows.append(row)
                log(
                    f"  {row.model} {row.mesh} {row.plan}: {row.seconds:.1f}s"
                    + (f" ({row.error})" if row.error else "")
                )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="mlp, gpt and llama tiny; fewer plans")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="search budget per searched plan (default 2 quick, 5 full)",
    )
    ap.add_argument("--only", help="only the models whose label contains this text")
    a = ap.parse_args(argv)
    seconds = a.seconds if a.seconds is not None else (2.0 if a.quick else 5.0)
    t0 = time.perf_counter()
    rows = run(a.quick, seconds, a.only, log=lambda s: print(s, file=sys.stderr))
    s = summary(rows)
    if a.json:
        print(
            json.dumps(
                {
                    "rows": [r.__dict__ for r in rows],
                    "summary": s,
                    "seconds": time.perf_counter() - t0,
                },
                default=float,
            )
        )
    else:
        print(table(rows))
        print()
        print("predicted / XLA: geometric mean, plans within 5% and 15%, worst")
        print(summary_text(s))
        print(f"\n{len(rows)} plans in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
