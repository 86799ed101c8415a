"""The benchmark suite: where partir stands against expert plans and against XLA.

`partir bench [--quick] [--json] [--report FILE]` runs it. Four parts:

- **cases**: every model of the zoo, tiny and at a realistic size, on 1-D, 2-D and 3-D
  meshes, each with its natural schedule and with `auto` on every axis. Per case: the best
  expert plan that fits the memory limit, the searched plan, their estimated step times
  and memory, and, on meshes of at most 8 devices, what XLA compiles for both (on fake CPU
  devices, from abstract args).
- **scaling**: search time of gpt at 12, 24, 48 and 96 layers of one width.
- **fidelity**: the cost model's collective bytes and memory over XLA's, for every plan
  compiled.
- **pruning**: the 2-D natural-schedule searches again with CP-SAT pruning off.

Step times and memory are the cost model's estimates (for the goal's device, tpu-v4); they
are compared as ratios within one run. Search seconds are wall-clock on whatever machine
runs the bench: indicative only, and best read as ratios too.

One file per section: cases, experts (the goals and the expert plans), xla, one_case,
scaling, pruning, fidelity, suite (`run`, `main`), rendering (tables and the report).
"""

from partir.bench.cases import (
    DEVICE,
    DEVICES,
    MEMORY_LIMIT,
    MESH_1D,
    MESH_2D,
    MESH_2D_LARGE,
    MESH_2D_SMALL,
    MESH_3D,
    MESH_3D_SMALL,
    MODELS,
    REALISTIC,
    Case,
    case,
    full_cases,
    quick_cases,
    realistic,
    schedule_for,
)
from partir.bench.fidelity import fidelity
from partir.bench.one_case import run_case
from partir.bench.pruning import run_pruning
from partir.bench.rendering import anomalies, losses, markdown, print_tables
from partir.bench.scaling import run_scaling
from partir.bench.suite import DEFAULT_REPORT, fake_devices, json_default, main, run

__all__ = [
    "DEFAULT_REPORT",
    "DEVICE",
    "DEVICES",
    "MEMORY_LIMIT",
    "MESH_1D",
    "MESH_2D",
    "MESH_2D_LARGE",
    "MESH_2D_SMALL",
    "MESH_3D",
    "MESH_3D_SMALL",
    "MODELS",
    "REALISTIC",
    "Case",
    "anomalies",
    "case",
    "fake_devices",
    "fidelity",
    "full_cases",
    "json_default",
    "losses",
    "main",
    "markdown",
    "print_tables",
    "quick_cases",
    "realistic",
    "run",
    "run_case",
    "run_pruning",
    "run_scaling",
    "schedule_for",
]
