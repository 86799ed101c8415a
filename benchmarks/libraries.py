"""partir's plans against the sharding plans libraries ship for their own models, on XLA.

    python benchmarks/libraries.py [--case NAME ...] [--seconds S] [--json]
    python benchmarks/libraries.py --list

Per case (a library's model at a small size, its train step, its own plan; see
benchmarks/library_steps.py), on 8 fake CPU devices, per device:

- the library's plan: `jax.jit` with the library's in_shardings (carried outputs as their
  inputs, state donated), nothing else; XLA's collective bytes (loop bodies weighted by
  their trip counts, kinds as XLA:CPU lowers them) and allocation (arguments + outputs +
  temporaries - aliased); and `partir.evaluate` of the same specs, its collective bytes
  held to XLA's (an estimate against a measurement);
- partir's plan: `partir.solve` with the case's schedule, compiled by `plan.jit`
  (donating the state too), the same XLA figures. With `--limit library` (the default) its
  memory limit is partir's estimate of the library plan's peak: the question a user asks
  of a library's plan is whether another fits the same memory and moves less, and the same
  model judges both; with `--limit device` the limit is the device's HBM, where these small
  models fit unsharded and the search rightly prefers data parallelism (fewer bytes moved,
  more memory);
- the library's plan run by partir's `plan.jit` (its input specs, every operand resharded
  as the cost model prices it): XLA's collective bytes, the `pinned` column. Left to
  itself, XLA may reshard the library's plan another way and move more; partir's estimate
  is of the plan as `plan.jit` runs it.

The table gives partir / library for both (the issue's bar: collectives <= 1.05,
allocation <= 1.10) and partir's estimate / XLA for the library's plan (bar: within 10%).
A case whose library is not installed is skipped with a message. The libraries are pinned in
benchmarks/requirements-libraries.txt (not partir's dependencies).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

DEVICES = 8
# Fake CPU devices: set before JAX starts its backend (this is a script, not a library).
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={DEVICES}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FAST_COMPILE = {"xla_backend_optimization_level": 0}  # same HLO and buffers, faster compile
DEVICE = "tpu-v4"
COLLECTIVE_BAR, ALLOCATION_BAR, ESTIMATE_BAR = 1.05, 1.10, 0.10


@dataclass(frozen=True)
class Case:
    name: str
    module: str  # the library, as imported
    build: Callable  # () -> library_steps.LibraryStep


def _cases() -> list[Case]:
    import library_steps as ls

    def penzai(v):
        return Case(f"penzai-{v}", "penzai", lambda: ls.penzai_step(v))

    def keras(v):
        return Case(f"keras-hub-{v}", "keras_hub", lambda: ls.keras_hub_step(v))

    return [
        penzai("llama"),
        penzai("gemma"),
        penzai("neox"),
        keras("llama"),
        keras("gemma"),
        keras("gpt2"),
        Case("jraph-gns", "jraph", ls.jraph_gns_step),
        Case("maxtext-llama2", "maxtext", lambda: ls.maxtext_step("llama2", "fsdp")),
        Case("maxtext-mistral", "maxtext", lambda: ls.maxtext_step("mistral", "fsdp")),
        Case("maxtext-mixtral", "maxtext", lambda: ls.maxtext_step("mixtral", "fsdp")),
        Case("maxtext-mixtral-ep", "maxtext", lambda: ls.maxtext_step("mixtral", "expert")),
    ]


@dataclass
class Measured:
    collective_bytes: int  # XLA, per device, per step
    allocated_bytes: int  # XLA: arguments + outputs + temporaries - aliased
    true_peak_bytes: int | None  # XLA's buffer assignment at its peak
    by_kind: dict[str, int]


@dataclass
class Row:
    case: str
    mesh: str
    library_plan: str = ""
    library: Measured | None = None
    partir: Measured | None = None
    estimate_collective_bytes: int | None = None  # partir.evaluate of the library's plan
    estimate_by_kind: dict[str, int] = field(default_factory=dict)
    partir_plan_specs: dict[str, str] = field(default_factory=dict)
    memory_limit: int | None = None  # partir's limit (None: the device's HBM)
    library_pinned: Measured | None = None  # the library's plan run by partir's plan.jit
    seconds: float = 0.0
    note: str = ""
    error: str | None = None

    def ratio(self, what: str) -> float | None:
        if self.library is None or self.partir is None:
            return None
        a, b = getattr(self.partir, what), getattr(self.library, what)
        return (1.0 if a == 0 else None) if b == 0 else a / b

    @property
    def estimate_ratio(self) -> float | None:
        if self.estimate_collective_bytes is None or self.library is None:
            return None
        x = self.library.collective_bytes
        return (
            (1.0 if self.estimate_collective_bytes == 0 else None)
            if x == 0
            else (self.estimate_collective_bytes / x)
        )


def _measure(lowered) -> Measured:
    from partir.ir.xla import as_cpu_kinds, compile_with_buffer_peak, stats_of_compiled

    compiled, peak = compile_with_buffer_peak(lowered, FAST_COMPILE)
    stats = stats_of_compiled(compiled, peak)
    kinds = {k: v for k, v in as_cpu_kinds(stats.bytes_by_kind()).items() if v}
    return Measured(sum(kinds.values()), stats.allocated_bytes, stats.true_peak_bytes, kinds)


def _shapes(args):
    import jax

    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)


def library_specs_by_path(goal, step) -> dict:
    """{input path: spec} of the library's plan, in the order of the program's inputs."""
    import jax
    from jax.sharding import PartitionSpec as P

    flat = jax.tree.leaves(step.library_specs, is_leaf=lambda x: isinstance(x, P))
    if len(flat) != len(goal.program.inputs):
        raise ValueError(
            f"the library's specs have {len(flat)} leaves, the step "
            f"{len(goal.program.inputs)} inputs"
        )
    return dict(zip(goal.program.inputs, flat))


def library_jit(goal, step, mesh):
    """`jax.jit` of the step with the library's in_shardings, carried outputs sharded as
    their inputs (other outputs replicated) and the carried arguments donated."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    prog = goal.program
    spec_of = library_specs_by_path(goal, step)
    ins = jax.tree.map(
        lambda s: NamedSharding(mesh, s), step.library_specs, is_leaf=lambda x: isinstance(x, P)
    )
    outs = [NamedSharding(mesh, spec_of.get(prog.carried.get(p), P())) for p in prog.outputs]
    carried = {p.split("/", 1)[0] for p in prog.carried.values()}
    donate = tuple(i for i, n in enumerate(prog.arg_names) if n in carried)
    return jax.jit(
        step.fn,
        in_shardings=tuple(ins),
        out_shardings=jax.tree_util.tree_unflatten(prog.out_tree, outs),
        donate_argnums=donate,
    )


def mesh_label(mesh: dict[str, int]) -> str:
    """The axes of more than one device, as initial and size: d2xm4, d2xf2xt2, d8."""
    return "x".join(f"{a[0]}{n}" for a, n in mesh.items() if n > 1)


def run_case(
    case: Case, seconds: float, log=print, limit: str = "library", objective: str = "time"
) -> Row:
    import jax

    import partir
    from partir.ir.xla import as_cpu_kinds
    from partir.solver.jit import make_mesh

    t0 = time.perf_counter()
    step = case.build()
    row = Row(case.name, mesh_label(step.mesh), step.library_plan, note=step.note)
    args = _shapes(step.args)
    mesh = step.jax_mesh if step.jax_mesh is not None else make_mesh(step.mesh)
    with step.context():
        goal = partir.Goal(
            step.fn,
            args,
            mesh,
            device=DEVICE,
            schedule=step.schedule,
            objective=objective,
            search=partir.Search(seconds=seconds, seed=0),
        )
        log(f"  {case.name}: compiling the library's plan")
        jitted = step.library_jit() if step.library_jit else library_jit(goal, step, mesh)
        with jax.set_mesh(mesh):
            row.library = _measure(jitted.lower(*args))
        try:
            library_plan = partir.plan(goal, library_specs_by_path(goal, step))
            cost = library_plan.cost
            row.estimate_by_kind = {
                k: v for k, v in as_cpu_kinds(cost.bytes_by_kind()).items() if v
            }
            row.estimate_collective_bytes = sum(row.estimate_by_kind.values())
            # the library's plan as plan.jit runs it (operands resharded as the model prices)
            row.library_pinned = _measure(library_plan.jit(mesh, donate=True).lower(*args))
        except Exception as e:  # the library's plan may not be expressible: say why
            row.note += f" evaluate failed: {type(e).__name__}: {str(e).splitlines()[0]}"
            cost = None
        if limit == "library":
            # the library's plan's peak by partir's own model (XLA's allocation where the
            # plan cannot be evaluated): a plan is kept only if the same model says it
            # needs no more
            row.memory_limit = cost.peak_memory_bytes if cost else row.library.allocated_bytes
            goal = goal.replace(memory_limit=row.memory_limit)
        log(f"  {case.name}: searching ({seconds:g} s) and compiling partir's plan")
        plan = partir.solve(goal, baselines=False)
        if not plan.cost.fits:
            row.note += " partir's best plan is over its memory limit (estimate)"
        row.partir = _measure(plan.jit(mesh, donate=True).lower(*args))
    row.partir_plan_specs = {p: str(s) for p, s in plan.specs.items() if any(s)}
    row.seconds = time.perf_counter() - t0
    return row


# ----------------------------------------------------------------------------- printing
def _b(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if abs(n) >= k:
            return f"{n / k:.1f}{unit}"
    return f"{n:.0f}"


def _r(x: float | None, bar: float | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" + ("" if bar is None else (" " if x <= bar else "!"))


def table(rows: list[Row]) -> str:
    head = (
        f"{'case':<20}{'mesh':<10}{'coll lib':>9}{'partir':>9}{'ratio':>7}"
        f"{'alloc lib':>11}{'partir':>9}{'ratio':>7}{'est/XLA':>9}{'pinned':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(f"{r.case:<20}{r.mesh:<10}{r.error[:80]}")
            continue
        lib, par = r.library, r.partir
        est = r.estimate_ratio
        est_s = (
            "-" if est is None else f"{est:.2f}" + (" " if abs(est - 1) <= ESTIMATE_BAR else "!")
        )
        lines.append(
            f"{r.case:<20}{r.mesh:<10}{_b(lib.collective_bytes):>9}{_b(par.collective_bytes):>9}"
            f"{_r(r.ratio('collective_bytes'), COLLECTIVE_BAR):>7}"
            f"{_b(lib.allocated_bytes):>11}{_b(par.allocated_bytes):>9}"
            f"{_r(r.ratio('allocated_bytes'), ALLOCATION_BAR):>7}{est_s:>9}"
            f"{_b(r.library_pinned.collective_bytes if r.library_pinned else None):>9}"
        )
    lines += [
        "",
        "coll: XLA's collective bytes per device per step; alloc: XLA's arguments + outputs +",
        "temporaries - aliased, per device; ratio: partir / library ('!' past the bar: 1.05",
        "collectives, 1.10 allocation); est/XLA: partir.evaluate's collective bytes for the",
        "library's plan over XLA's ('!' off by more than 10%); pinned: XLA's collective bytes",
        "for the library's plan run by partir's plan.jit. XLA:CPU carries bf16 collectives",
        "in f32.",
    ]
    if any(r.memory_limit for r in rows):
        lines.append("partir's memory limit: its estimate of the library plan's peak (--limit).")
    plans = [
        f"  {r.case}: {r.library_plan}" + (f" ({r.note.strip()})" if r.note.strip() else "")
        for r in rows
        if not r.error
    ]
    return "\n".join(lines + ["", "library plans:", *plans])


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="a case name (repeatable); default all")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--seconds", type=float, default=10.0, help="search budget per case")
    ap.add_argument(
        "--limit",
        choices=("library", "device"),
        default="library",
        help="partir's memory limit: XLA's allocation for the library's plan, or the HBM",
    )
    ap.add_argument(
        "--objective",
        choices=("time", "comm"),
        default="time",
        help="what partir's search minimises: the step time it estimates, or the bytes moved",
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help="a JSON list of the rows on stdout (the table goes to stderr)",
    )
    a = ap.parse_args(argv)
    cases = _cases()
    if a.list:
        print("\n".join(f"{c.name}  ({c.module})" for c in cases))
        return 0
    known = {c.name for c in cases}
    unknown = [n for n in a.case or [] if n not in known]
    if unknown:
        print(f"unknown case {unknown[0]!r}; cases: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    rows: list[Row] = []
    for case in cases:
        if a.case and case.name not in a.case:
            continue
        if importlib.util.find_spec(case.module) is None:
            needs = (
                "Python 3.12 and benchmarks/requirements-maxtext.txt"
                if case.module == "maxtext"
                else "benchmarks/requirements-libraries.txt"
            )
            log(f"skip {case.name}: {case.module} is not installed (see {needs})")
            continue
        try:  # libraries print while they build: keep stdout for the table or the JSON
            with contextlib.redirect_stdout(sys.stderr):
                rows.append(run_case(case, a.seconds, log, a.limit, a.objective))
        except Exception as e:  # one case failing does not stop the others: it is reported
            log(traceback.format_exc())
            rows.append(Row(case.name, "-", error=f"{type(e).__name__}: {e}".splitlines()[0]))
        log(f"  {case.name}: done")
    if not rows:
        log("no case ran: none of their libraries is installed")
        return 0
    if a.json:
        out = [
            {
                **asdict(r),
                "ratios": {
                    "collective_bytes": r.ratio("collective_bytes"),
                    "allocated_bytes": r.ratio("allocated_bytes"),
                    "estimate_over_xla": r.estimate_ratio,
                },
            }
            for r in rows
        ]
        print(json.dumps(out, indent=1))
        log(table(rows))
    else:
        print(table(rows))
    return 0 if all(r.error is None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
