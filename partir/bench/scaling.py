"""Scaling: search time of gpt as it deepens, its layers unrolled and under `lax.scan`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax

from partir.bench.cases import (
    MESH_2D_SMALL,
    SCALING_LAYERS,
    SCALING_SIZE,
    case,
    schedule_for,
    schedule_text,
)
from partir.bench.experts import Traces
from partir.bench.one_case import run_case
from partir.bench.xla import ratio


def run_scaling(
    layers: Iterable[int] = SCALING_LAYERS,
    size: dict[str, Any] | None = None,
    mesh: dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    scans: Iterable[bool] = (False, True),
) -> dict:
    """Search time of gpt at each depth (same width), natural schedule, with its layers
    unrolled (a list) and under `lax.scan`; ratios to the first depth of each."""
    size = dict(SCALING_SIZE if size is None else size)
    mesh = dict(MESH_2D_SMALL if mesh is None else mesh)
    rows = []
    for scan in scans:
        rows += _scaling_run(layers, size, mesh, scan, progress)
    return {
        "model": "gpt",
        "size": size,
        "mesh": mesh,
        "strategies": schedule_text(schedule_for("gpt", mesh, "natural")),
        "rows": rows,
    }


def _scaling_run(layers, size, mesh, scan: bool, progress) -> list[dict]:
    rows = []
    for n in layers:
        if progress:
            progress(f"scaling: gpt {n} layers{' (scan)' if scan else ''}")
        jax.clear_caches()
        programs = Traces()
        c = case("gpt", f"{n} layers", mesh, "natural", **{**size, "layers": n, "scan": scan})
        r = run_case(c, programs, xla=False, experts="same")
        row = {"layers": n, "scan": scan, "ops": r.get("ops")}
        row["trace_seconds"] = next(iter(programs.trace_seconds.values()), None)
        if "error" in r:
            row["error"] = r["error"]
        else:
            row.update(
                seconds=r["searched"]["seconds"],
                mcts_seconds=r["searched"]["mcts_seconds"],
                full_program_seconds=r["searched"]["full_program_seconds"],
                searching_seconds=r["searched"]["seconds"] - r["searched"]["full_program_seconds"],
                proxy=r["searched"]["proxy"].get("used"),
                episodes=r["searched"]["episodes"],
                step_time_s=r["searched"]["step_time_s"],
                ratio_to_expert=r.get("same_schedule_ratio"),
                expert=(r.get("same_schedule_expert") or {}).get("name"),
            )
        rows.append(row)
    base = next((r for r in rows if r.get("seconds")), None)
    for r in rows:
        r["time_ratio"] = ratio(r.get("seconds"), base["seconds"]) if base else None
        r["mcts_ratio"] = ratio(r.get("mcts_seconds"), base["mcts_seconds"]) if base else None
        r["searching_ratio"] = (
            ratio(r.get("searching_seconds"), base["searching_seconds"]) if base else None
        )
        r["ops_ratio"] = ratio(r.get("ops"), base["ops"]) if base and base.get("ops") else None
    return rows
