"""The `partir` command: solve, check, verify, explain, bench.

Exit status: 0 ok; 1 verify mismatch; 2 bad input; 3 no plan fits the memory limit;
4 an unexpected error (a crash, not a verdict: the traceback is printed).
With `--json`, exactly one JSON object goes to stdout and everything else to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_CRASH = 0, 1, 2, 3, 4


def _fake_devices(n: int) -> None:
    """Give JAX `n` CPU devices for verify / plan.jit, before its backend starts."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    try:
        if jax.config.jax_num_cpu_devices < n:  # type: ignore[attr-defined]  # a dynamic option
            jax.config.update("jax_num_cpu_devices", n)
    except Exception:  # the backend already started: plans needing more devices will say so
        pass


def _positive_seconds(text: str) -> float:
    """argparse type of --seconds: what `Search(seconds=...)` accepts."""
    from partir.goal import Search

    try:
        seconds = Search(seconds=float(text)).seconds
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, not {text!r}"
        ) from None
    assert seconds is not None  # given, so kept
    return seconds


def _console():
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # a pipe or a log file: rich assumes 80 columns and would cut the plans' names and
        # wrap the cost table's numbers; its widest rows fit in this many
        console.width = 120
    return console


def _load(path: str):
    from partir.dsl import load_goal

    goal = load_goal(path)
    _fake_devices(goal.num_devices)
    return goal


def _rows_of_specs(plan) -> list[tuple[str, str]]:
    """(pattern, spec) rows: repeated layers that agree collapse into one pattern."""
    return [(pattern, _spec_str(spec)) for pattern, spec in plan.to_rules()]


def _spec_str(spec) -> str:
    return "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"


def _cost_table(title: str, cost, baselines: dict):
    from rich.table import Table

    from partir.ir.cost import KIND_ABBREVIATIONS, KINDS
    from partir.ir.messages import fmt_bytes, fmt_seconds

    t = Table(
        title=title,
        title_justify="left",
        caption="times and memory are estimates of the "
        "cost model; * over the memory limit; AR all-reduce, AG all-gather, RS reduce-scatter, A2A all-to-all, "
        "CP collective-permute",
        caption_justify="left",
    )
    t.add_column("plan")
    t.add_column("step", justify="right")
    t.add_column("compute", justify="right")
    kinds = [
        k
        for k in KINDS
        if cost.comm_s_by_kind.get(k) or any(c.comm_s_by_kind.get(k) for c in baselines.values())
    ]
    for kind in kinds:
        t.add_column(KIND_ABBREVIATIONS[kind], justify="right")
    t.add_column("memory", justify="right")
    t.add_column("ratio", justify="right")

    def row(name, c):
        ratio = c.step_time_s / cost.step_time_s if cost.step_time_s else float("nan")
        t.add_row(
            name,
            fmt_seconds(c.step_time_s),
            fmt_seconds(c.compute_s),
            *[fmt_seconds(c.comm_s_by_kind[k]) if c.comm_s_by_kind.get(k) else "-" for k in kinds],
            fmt_bytes(c.peak_memory_bytes) + ("" if c.fits else " *"),
            f"{ratio:.2f}x",
        )

    row("searched", cost)
    for name, c in sorted(baselines.items(), key=lambda kv: kv[1].step_time_s):
        row(name, c)
    return t


def cmd_solve(args) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from partir.ir.messages import fmt_bytes
    from partir.solver.mesh_search import solve_goal as solve

    console = _console()
    goal = _load(args.goal)
    if args.seed is not None or args.seconds is not None or args.no_prune:
        import dataclasses

        goal = goal.replace(
            search=dataclasses.replace(
                goal.search,
                seed=args.seed if args.seed is not None else goal.search.seed,
                seconds=args.seconds if args.seconds is not None else goal.search.seconds,
                prune=None if args.no_prune else goal.search.prune,
            )
        )
    show = console.is_terminal and not args.json
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("episode {task.fields[episode]}  best reward {task.fields[best]:.4f}"),
        TimeElapsedColumn(),
        console=console,
        disable=not show,
        transient=True,
    ) as bar:
        task = bar.add_task("tracing", total=None, episode=0, best=0.0)
        goal.program  # noqa: B018  (trace once, visibly; tracing may add notes)
        for note in goal.notes:
            console.print(note)

        def progress(axis, episode, seconds, best):
            bar.update(task, description=f"axis {axis}", episode=episode, best=best)

        plan = solve(goal, progress=progress)
    if args.out:
        with open(args.out, "w") as f:
            f.write(plan.to_json())
    if args.rules:
        with open(args.rules, "w") as f:
            f.write(plan.rules_source(args.rules))
    if args.json and plan.cost.fits:
        print(plan.to_json())
    elif not args.json:
        t = Table(title="plan", title_justify="left")
        t.add_column("input")
        t.add_column("PartitionSpec")
        for pattern, spec in _rows_of_specs(plan):
            t.add_row(pattern, spec)
        console.print(t)
        console.print(_cost_table("cost per device", plan.cost, plan.baselines))
        if plan.search.get("meshes"):
            console.print(_mesh_table(plan))
        if plan.search.get("splits"):
            console.print(_split_table(plan))
        s = plan.search
        console.print(
            f"searched {s['episodes']} episodes in {s['seconds']:.2f} s; actions "
            f"{s['actions_before']} -> {s['actions_after']} after analysis, "
            f"{s['pruned']} pruned by CP-SAT"
        )
        if goal.memory_limit:
            console.print(
                f"memory: {fmt_bytes(plan.cost.peak_memory_bytes)} peak per device (estimate) "
                f"against a limit of {fmt_bytes(goal.memory_limit)}"
                + (
                    f" ({goal.memory_limit_source})"
                    if goal.memory_limit_source != "the goal"
                    else ""
                )
            )
    if not plan.cost.fits:
        message = (
            f"no plan found fits the memory limit; the best found needs "
            f"{fmt_bytes(plan.cost.peak_memory_bytes)} per device (estimate), the limit is "
            f"{fmt_bytes(goal.memory_limit)}"
        )
        largest = plan.goal.cost_model.peak_buffers(plan.state)
        console.print(f"error: {message}; the largest buffers live at its peak:")
        for nbytes, what in largest:
            console.print(f"  {fmt_bytes(nbytes):>12}  {what}")
        if args.json:
            _print_error(
                message,
                EXIT_INFEASIBLE,
                peak_memory_bytes=plan.cost.peak_memory_bytes,
                memory_limit_bytes=goal.memory_limit,
                largest_buffers=[{"bytes": n, "what": w} for n, w in largest],
                plan=json.loads(plan.to_json()),
            )
        return EXIT_INFEASIBLE
    return EXIT_OK


def _mesh_table(plan):
    from partir.solver.mesh_search import mesh_rows

    return _shapes_table(
        f"mesh shapes tried ({plan.goal.num_devices} devices)",
        "step and peak memory per device are estimates of the cost model; every "
        "shape is searched briefly, the best again in full",
        mesh_rows(plan),
    )


def _shapes_table(title: str, caption: str, rows: list[tuple[str, str, str, str]]):
    from rich.table import Table

    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    t.add_column("mesh")
    t.add_column("step", justify="right")
    t.add_column("peak", justify="right")
    t.add_column("")
    for row in rows:
        t.add_row(*row)
    return t


def _split_table(plan):
    from partir.solver.subaxes import split_rows

    return _shapes_table(
        "mesh axes split in two parts (`tensor:0` major, `tensor:1` minor)",
        "a megatron axis wider than a weight's dim is searched whole and split; step and "
        "peak memory per device are estimates of the cost model",
        split_rows(plan),
    )


def _print_error(message: str, code: int, **numbers) -> None:
    """The one JSON object of `--json` when there is no plan to print."""
    print(json.dumps({"error": message, "exit": code, **numbers}))


def cmd_check(args) -> int:
    console = _console()
    goal = _load(args.goal)
    prog = goal.program
    for note in goal.notes:
        console.print(note)
    mesh = goal.mesh
    if goal.open_axes:
        mesh = f"{ {a: '?' if s is None else s for a, s in goal.mesh.items()} } over {goal.devices}"
    console.print(
        f"{args.goal}: ok: {len(prog.inputs)} inputs, {len(prog.ops)} ops, mesh {mesh}, "
        f"device {goal.device.name}, {len(prog.carried)} carried state values"
    )
    return EXIT_OK


def _load_plan(goal, path):
    """The plan file on the goal; a goal whose mesh has open axes takes the plan's shape
    when it is one of its factorizations (what `solve` chose)."""
    from partir.solver.mesh_search import candidate_meshes, with_mesh
    from partir.solver.plan import read_plan_file

    if goal.open_axes:
        try:
            with open(path, encoding="utf-8-sig") as f:
                mesh = json.loads(f.read()).get("mesh")
        except (ValueError, AttributeError, RecursionError):
            mesh = None  # read_plan_file says what is wrong with it
        if mesh in candidate_meshes(goal):
            goal = with_mesh(goal, mesh)
    return read_plan_file(path, goal)


def cmd_verify(args) -> int:
    from partir.solver.verify import verify

    console = _console()
    goal = _load(args.goal)
    plan = _load_plan(goal, args.plan)
    goal = plan.goal or goal  # an open mesh's goal on the plan's shape
    report = verify(goal, plan)
    numerics: float | str | None = None
    if args.numerics:
        from partir.testing.checks import NumericsMismatch, check_numerics

        try:
            numerics = check_numerics(goal, plan)
        except NumericsMismatch as err:
            numerics = str(err)
    ok = report.ok and (numerics is None or not isinstance(numerics, str))
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "predicted": report.predicted,
                    "compiled": report.compiled,
                    "rows": [r.__dict__ for r in report.rows],
                    "numerics": numerics
                    if isinstance(numerics, str)
                    else (None if numerics is None else {"max_relative_error": numerics}),
                }
            )
        )
    else:
        console.print(str(report))
        if numerics is not None:
            console.print(
                numerics
                if isinstance(numerics, str)
                else f"numerics: max relative error {numerics:.2e} (sharded against unsharded)"
            )
    return EXIT_OK if ok else EXIT_MISMATCH


def cmd_explain(args) -> int:
    from partir.solver.explain import explain

    goal = _load(args.goal)
    plan = _load_plan(goal, args.plan)
    goal = plan.goal or goal  # an open mesh's goal on the plan's shape
    print(explain(goal, plan, plot=args.plot))
    return EXIT_OK


def cmd_bench(args) -> int:
    from partir.bench import main as bench_main

    return bench_main(quick=args.quick, as_json=args.json, report=args.report)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="partir", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("solve", help="search a plan for a goal file")
    s.add_argument("goal")
    s.add_argument("--out", help="write the plan (partir-plan/1 JSON) here")
    s.add_argument("--rules", help="write the plan as a partition-rule list (.py or .json)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    s.add_argument("--seed", type=int)
    s.add_argument("--seconds", type=_positive_seconds, help="cap the search time")
    s.add_argument("--no-prune", action="store_true", help="skip the CP-SAT pruning pass")
    s.set_defaults(fn=cmd_solve)
    c = sub.add_parser(
        "check",
        help="parse, resolve and trace a goal file; search nothing",
        description="Parse, resolve and trace a goal file; search nothing. A goal file is "
        "code, like a Python script: this imports the modules it names and calls its inputs "
        "function and program (functions of Python's standard library are refused). Check "
        "only goal files you would run.",
    )
    c.add_argument("goal")
    c.set_defaults(fn=cmd_check)
    v = sub.add_parser("verify", help="compile a plan with XLA and compare with the prediction")
    v.add_argument("goal")
    v.add_argument("plan")
    v.add_argument(
        "--numerics",
        action="store_true",
        help="also run sharded and unsharded on small real arrays",
    )
    v.add_argument("--json", action="store_true")
    v.set_defaults(fn=cmd_verify)
    e = sub.add_parser("explain", help="where each collective comes from, per layer")
    e.add_argument("goal")
    e.add_argument("plan")
    e.add_argument("--plot", help="write PNG plots with this path prefix (needs matplotlib)")
    e.set_defaults(fn=cmd_explain)
    b = sub.add_parser("bench", help="the benchmark suite")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--json", action="store_true")
    b.add_argument("--report", help="write a markdown report here")
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse said why on stderr
        if as_json and e.code:
            _print_error("invalid command line (the reason is on stderr)", int(e.code))
        raise
    from partir.dsl import GoalError
    from partir.ir.program import TraceError
    from partir.ir.specs import PlanError
    from partir.solver.plan import PlanFileError
    from partir.solver.prune import InfeasibleMemory

    as_json = getattr(args, "json", False)
    try:
        return args.fn(args)
    except (GoalError, PlanError, OSError, TraceError) as err:
        if isinstance(err, GoalError | PlanFileError):
            message = str(err)
        elif isinstance(err, TraceError):
            where = f"{args.goal}: " if getattr(args, "goal", None) else ""
            message = f"{where}error: {err}; check the program and inputs statements"
        else:
            message = f"error: {err}"
        print(message, file=sys.stderr)
        if as_json:
            _print_error(message.splitlines()[0], EXIT_BAD_INPUT)
        return EXIT_BAD_INPUT
    except InfeasibleMemory as err:
        print(f"error: {err}", file=sys.stderr)
        if as_json:
            _print_error(
                str(err),
                EXIT_INFEASIBLE,
                smallest_memory_bytes=err.smallest_bytes,
                memory_limit_bytes=err.limit_bytes,
                axis=err.axis,
            )
        return EXIT_INFEASIBLE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        if as_json:
            _print_error("interrupted", 130)
        return 130
    except SystemExit as err:  # user code that calls sys.exit where nothing caught it
        print(f"error: the program called sys.exit({err.code!r})", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception:  # a crash must not read as "mismatch" (1, Python's own status)
        import traceback

        traceback.print_exc()
        print(
            f"error: partir {args.command} stopped on an unexpected error (exit status "
            f"{EXIT_CRASH}, not a verdict); the traceback above says where: in your program, "
            "check it; in partir, please report it",
            file=sys.stderr,
        )
        return EXIT_CRASH


if __name__ == "__main__":
    sys.exit(main())
