"""The suite: every case, then pruning and scaling, as one JSON-able result; `main`."""

from __future__ import annotations

import datetime
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

from partir.bench.cases import (
    DEVICE,
    DEVICES,
    MEMORY_LIMIT,
    MESH_2D,
    SCALING_LAYERS,
    Case,
    full_cases,
    quick_cases,
)
from partir.bench.experts import Traces
from partir.bench.fidelity import fidelity
from partir.bench.one_case import run_case
from partir.bench.pruning import run_pruning
from partir.bench.rendering import markdown, print_tables
from partir.bench.scaling import run_scaling

DEFAULT_REPORT = os.path.join("docs", "benchmarks.md")


def _versions() -> dict:
    import importlib.metadata as md

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("jax", "jaxlib", "ortools", "partir"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def fake_devices(n: int = DEVICES) -> None:
    """Give JAX `n` CPU devices before its backend starts (a no-op once it has)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    try:
        if jax.config.jax_num_cpu_devices < n:  # type: ignore[attr-defined]  # a dynamic option
            jax.config.update("jax_num_cpu_devices", n)
    except Exception:  # the backend already started; bigger meshes are not compiled
        pass


def run(
    cases: Sequence[Case] | None = None,
    *,
    quick: bool = False,
    scaling: Sequence[int] | None = None,
    scaling_size: dict[str, Any] | None = None,
    pruning: Sequence[Case] | None = None,
    xla: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the suite; returns the one JSON-able object that `--json` prints.

    Defaults: the full or quick case list; scaling at 12..96 layers (quick: 12, 24); pruning
    off for the realistic-size natural-schedule cases on 8x8."""
    import jax

    fake_devices(DEVICES)
    t0 = time.perf_counter()
    if cases is None:
        cases = quick_cases() if quick else full_cases()
    if scaling is None:
        scaling = SCALING_LAYERS[:2] if quick else SCALING_LAYERS
    if pruning is None:
        pruning = [c for c in cases if c.schedule == "natural" and c.mesh_dict == MESH_2D]
    devices = len(jax.devices())
    programs = Traces()
    xla_cache: dict = {}
    expert_cache: dict = {}
    results: dict[Case, dict] = {}
    for i, c in enumerate(cases):
        if progress:
            progress(f"[{i + 1}/{len(cases)}] {c.label}")
        results[c] = run_case(
            c,
            programs,
            xla=xla and c.devices <= devices,
            xla_cache=xla_cache,
            expert_cache=expert_cache,
        )
    case_list = [results[c] for c in cases]
    prune_rows = run_pruning(pruning, results, programs, progress)
    expert_cache.clear()
    scaling_result = run_scaling(scaling, scaling_size, progress=progress) if scaling else None
    return {
        "format": "partir-bench/1",
        "quick": quick,
        "device": DEVICE,
        "memory_limit": MEMORY_LIMIT,
        "note": "step times and memory are cost-model estimates for the device; compare them as "
        "ratios. Seconds are wall-clock on the machine that ran the bench: indicative only.",
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), **_versions()},
        "xla_devices": devices,
        "wall_seconds": time.perf_counter() - t0,
        "cases": case_list,
        "scaling": scaling_result,
        "fidelity": fidelity(case_list),
        "pruning": prune_rows,
    }


def main(quick: bool = False, as_json: bool = False, report: str | None = None) -> int:
    """`partir bench`: tables on stderr, `--json` one object on stdout, a markdown report."""
    from rich.console import Console

    fake_devices(DEVICES)
    console = Console(stderr=True, highlight=False)
    t0 = time.perf_counter()

    def progress(msg: str) -> None:
        console.print(f"[dim]{time.perf_counter() - t0:6.1f} s[/dim]  {msg}")

    result = run(quick=quick, progress=progress)
    print_tables(result)
    path = report or DEFAULT_REPORT
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w") as f:
        f.write(markdown(result))
    console.print(f"report written to {path}")
    if as_json:
        print(json.dumps(result, default=json_default))
    return 0


def json_default(x: Any) -> Any:
    if isinstance(x, tuple | set):
        return list(x)
    if hasattr(x, "item"):
        return x.item()
    return str(x)
