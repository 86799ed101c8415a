"""Rendering: the suite's result as tables on the terminal and as the markdown report."""

from __future__ import annotations

import math
import sys

from partir.bench.cases import GNS_EDGE_INPUTS, mesh_text, schedule_label
from partir.bench.experts import SAME_SCHEDULE
from partir.bench.fidelity import log_distance
from partir.bench.pruning import TIGHT_SLACK
from partir.ir.messages import fmt_bytes, fmt_seconds


def _bytes(n: float | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def _secs(s: float | None) -> str:
    return "-" if s is None else fmt_seconds(s)


def _x(r: float | None, digits: int = 2) -> str:
    return "-" if r is None else f"{r:.{digits}f}"


def _case_row(r: dict) -> list[str]:
    e, s, x = r.get("expert"), r.get("searched"), r.get("xla") or {}
    if "error" in r:
        return [
            r["model"],
            r["size"],
            mesh_text(r["mesh"]),
            _case_schedule(r),
            "error: " + r["error"][:60],
            *["-"] * 12,
        ]
    assert s is not None  # a case without an error has its searched plan
    mark = lambda c: "" if c is None or c["fits"] else " *"  # noqa: E731
    return [
        r["model"],
        r["size"],
        mesh_text(r["mesh"]),
        _case_schedule(r),
        e["name"] if e else "-",
        _secs(e["step_time_s"]) if e else "-",
        _secs(s["step_time_s"]),
        _x(r.get("ratio")) + (" r" if s.get("is_replicated") else ""),
        (
            f"{_x(r['same_schedule_ratio'])} {r['same_schedule_expert']['name']}"
            if r.get("same_schedule_expert")
            else "-"
        ),
        (_bytes(e["peak_memory_bytes"]) + mark(e)) if e else "-",
        _bytes(s["peak_memory_bytes"]) + mark(s),
        f"{s['seconds']:.1f}",
        str(s["episodes"]),
        _pair(x, "collective_bytes"),
        _pair(x, "peak_bytes"),
        _x(x.get("same_schedule_collective_ratio")),
        _x(x.get("same_schedule_priced_comm_ratio")),
    ]


def _case_schedule(r: dict) -> str:
    return schedule_label(r["schedule"], r.get("objective", "time"))


def _pair(x: dict, key: str) -> str:
    """`searched / expert` XLA figures."""
    s, e = x.get("searched") or {}, x.get("expert") or {}
    if key not in s and key not in e:
        return "-"
    return f"{_bytes(s.get(key))} / {_bytes(e.get(key))}"


CASE_COLUMNS = [
    "model",
    "size",
    "mesh",
    "schedule",
    "expert",
    "expert step",
    "searched step",
    "ratio",
    "same-schedule ratio",
    "expert mem",
    "searched mem",
    "search s",
    "episodes",
    "XLA coll (s / e)",
    "XLA peak (s / e)",
    "XLA coll s / same",
    "XLA comm time s / same (est.)",
]
CASE_CAPTION = (
    "expert = the fastest sharded expert plan within the limit; ratio = searched / expert "
    "estimated step time (< 1: partir is faster; r: the searched plan is the replicated "
    "one); same-schedule ratio = searched / the expert plan made of the schedule's own "
    "strategies, where one exists; mem = estimated peak per device, * over the limit; XLA "
    "coll / XLA peak = per-device collective bytes and peak memory of the searched / expert "
    "plan as XLA:CPU compiles them (meshes <= 8 devices; peak = arguments + outputs + "
    "temporaries - donated aliases from the compiled memory analysis, since XLA:CPU's "
    "peak_memory_in_bytes counts arguments and outputs only); XLA coll s / same = searched "
    "over same-schedule expert compiled collective bytes; XLA comm time s / same (est.) = "
    "the same two plans' compiled collectives priced by the cost model's alpha-beta terms "
    "(an estimate). Schedule `natural, comm`: the goal's objective is `comm` (fewest "
    "collective bytes) instead of step time."
)


def _scaling_rows(s: dict) -> list[list[str]]:
    return [
        [
            str(r["layers"]),
            "scan" if r.get("scan") else "list",
            str(r.get("ops", "-")),
            _x(r.get("trace_seconds")),
            "yes" if r.get("proxy") else "no",
            _x(r.get("seconds")),
            _x(r.get("full_program_seconds")),
            _x(r.get("searching_seconds")),
            _x(r.get("mcts_seconds")),
            str(r.get("episodes", "-")),
            _x(r.get("time_ratio")),
            _x(r.get("searching_ratio")),
            _x(r.get("mcts_ratio")),
            _x(r.get("ops_ratio")),
            _x(r.get("ratio_to_expert")),
        ]
        for r in s["rows"]
    ]


SCALING_COLUMNS = [
    "layers",
    "as",
    "ops",
    "trace s",
    "proxy",
    "search s",
    "of it full program s",
    "of it searching s",
    "MCTS s",
    "episodes",
    "search time ratio",
    "searching ratio",
    "MCTS time ratio",
    "ops ratio",
    "step ratio to same-schedule expert",
]


def _fidelity_summary_rows(f: dict) -> list[list[str]]:
    rows = []
    for what, key in (
        ("collective bytes", "collectives"),
        ("peak memory", "peak_memory"),
        ("argument memory", "argument_memory"),
    ):
        s = f[key]
        worst = s.get("worst") or {}
        rows.append(
            [
                what,
                str(s["plans"]),
                _x(s.get("geomean"), 3),
                _x(s.get("mean"), 3),
                str(s.get("within_5pct", "-")),
                _x(worst.get("ratio"), 3),
                worst.get("plan", "-"),
            ]
        )
    return rows


FIDELITY_COLUMNS = [
    "predicted / XLA",
    "plans",
    "geomean",
    "mean",
    "within 5%",
    "worst",
    "worst plan",
]


def _pruning_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        on, off = r["cpsat"], r["none"]
        head = [r["model"], r["size"], mesh_text(r["mesh"]), _bytes(r["memory_limit_bytes"])]
        if "error" in on or "error" in off:
            err = on.get("error") or off.get("error")
            who = "cpsat" if "error" in on else "none"
            note = "FALSE INFEASIBLE: " if r.get("false_infeasible") else ""
            rest = ("-",) * 7
            if "error" not in off:
                rest = (
                    "-",
                    str(off["actions_after"]),
                    f"- / {off['episodes_to_best']}",
                    f"- / {off['seconds_to_best']:.2f}",
                    f"- / {off['seconds']:.2f}",
                    "-",
                    "-",
                )
            err = str(err).split(": ", 1)[-1]
            out.append(
                [
                    *head,
                    f"{note}{who}: {err[:48]}",
                    *rest[1:],
                    "-" if "error" in off else ("yes" if off["fits"] else "no"),
                ]
            )
            continue
        out.append(
            [
                *head,
                f"{on['actions_after']} ({on['pruned']} pruned)",
                str(off["actions_after"]),
                f"{on['episodes_to_best']} / {off['episodes_to_best']}",
                f"{on['seconds_to_best']:.2f} / {off['seconds_to_best']:.2f}",
                f"{on['seconds']:.2f} / {off['seconds']:.2f}",
                _x(r.get("seconds_ratio")),
                _x(r.get("step_time_ratio"), 3),
                ("yes" if on["fits"] else "no") + " / " + ("yes" if off["fits"] else "no"),
            ]
        )
    return out


PRUNING_COLUMNS = [
    "model",
    "size",
    "mesh",
    "limit",
    "actions (cpsat)",
    "actions (none)",
    "episodes to best (cpsat / none)",
    "s to best",
    "search s",
    "time off / on",
    "step off / on",
    "fits",
]


def losses(result: dict) -> list[dict]:
    """Cases where the searched plan is slower than the best expert (ratio > 1)."""
    return [r for r in result["cases"] if r.get("ratio") is not None and r["ratio"] > 1 + 1e-9]


def anomalies(result: dict) -> list[str]:
    """Things worth a look: plans over the limit, failures, XLA far from the prediction."""
    out = []
    for r in result["cases"]:
        name = f"{r['model']} {r['size']} {mesh_text(r['mesh'])} {r['schedule']}"
        if "error" in r:
            out.append(f"{name}: {r['error']}")
            continue
        if not r["searched"]["fits"]:
            out.append(f"{name}: the searched plan is over the memory limit")
        if r.get("expert") and not r["expert"]["fits"]:
            out.append(f"{name}: no expert plan fits the memory limit")
        for who, x in (r.get("xla") or {}).items():
            if isinstance(x, dict) and "error" in x:
                out.append(f"{name}: XLA compile of the {who} plan failed: {x['error'][:120]}")
        if r["schedule"] == "natural":
            batched = _batched_axes(r)
            inputs = GNS_EDGE_INPUTS if r["model"] == "gns" else None
            dim0 = [
                _first_entry(spec)
                for pat, spec in r["searched"]["rules"]
                if pat.startswith("batch/") and (inputs is None or pat in inputs)
            ]
            for axis in batched:
                if not any(repr(axis) in entry for entry in dim0):
                    out.append(
                        f"{name}: the schedule batches on {axis!r} but the plan tiles no "
                        f"data input on it"
                    )
    for row in result.get("pruning") or []:
        if row.get("false_infeasible"):
            out.append(
                f"{row['model']} {row['size']} {mesh_text(row['mesh'])} at "
                f"{_bytes(row['memory_limit_bytes'])}: CP-SAT declared it infeasible "
                f"({row['cpsat']['error'].split(' (')[0]}), yet the unpruned search found a plan of "
                f"{_bytes(row['none']['peak_memory_bytes'])} within the limit"
            )
    rows = result["fidelity"]["rows"]
    far = [r for r in rows if log_distance(r["peak_memory_ratio"]) > math.log(2)]
    if far:
        w = max(far, key=lambda r: log_distance(r["peak_memory_ratio"]))
        out.append(
            f"peak memory: the prediction is more than 2x off XLA's for {len(far)} of "
            f"{len(rows)} plans compiled (worst {w['plan']}: predicted "
            f"{_bytes(w['predicted_peak_bytes'])}, XLA {_bytes(w['peak_bytes'])})"
        )
    for row in rows:
        if log_distance(row["collective_ratio"]) > math.log(1.5):
            out.append(
                f"{row['plan']}: predicted {_bytes(row['predicted_collective_bytes'])} of "
                f"collectives, XLA {_bytes(row['collective_bytes'])}"
            )
    return out


def _first_entry(spec: str) -> str:
    """The dim-0 entry of a printed spec: "P(('data', 'fsdp'), None)" -> "('data', 'fsdp')"."""
    inner = spec[2:-1]
    if inner.startswith("("):
        return inner[: inner.index(")") + 1]
    return inner.split(",", 1)[0]


def _batched_axes(r: dict) -> list[str]:
    """Axes on which a case's schedule has batch or fsdp."""
    out = []
    for part in r["strategies"].split(" | "):
        axis, names = part.split(": ", 1)
        if any(n in ("batch", "fsdp") for n in names.split("+")):
            out.append(axis)
    return out


def print_tables(result: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stderr, highlight=False, width=200)

    def table(title, columns, rows, caption=None):
        t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
        for i, col in enumerate(columns):
            t.add_column(col, justify="left" if i < 5 else "right")
        for row in rows:
            t.add_row(*row)
        console.print(t)

    title = (
        f"partir bench{' --quick' if result['quick'] else ''}: searched plans against "
        f"expert plans ({result['device']}, limit {result['memory_limit']})"
    )
    table(title, CASE_COLUMNS, [_case_row(r) for r in result["cases"]], CASE_CAPTION)
    if result.get("scaling"):
        s = result["scaling"]
        table(
            f"scaling: gpt d_model={s['size']['d_model']} on {mesh_text(s['mesh'])} "
            f"({s['strategies']})",
            SCALING_COLUMNS,
            _scaling_rows(s),
        )
    table(
        "fidelity: cost model / XLA, per device",
        FIDELITY_COLUMNS,
        _fidelity_summary_rows(result["fidelity"]),
    )
    if result.get("pruning"):
        table("CP-SAT pruning on / off", PRUNING_COLUMNS, _pruning_rows(result["pruning"]))
    lost = losses(result)
    console.print(
        f"{len(lost)} of {sum(1 for r in result['cases'] if 'ratio' in r)} cases "
        f"slower than the best expert; {result['wall_seconds']:.0f} s in all"
    )


def _md_table(columns: list[str], rows: list[list[str]]) -> str:
    def cell(s: str) -> str:
        return str(s).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The report: what was run, the tables, the losses and anomalies."""
    m = result["machine"]
    cmd = "partir bench" + (" --quick" if result["quick"] else "")
    parts = [
        "# partir benchmarks",
        "",
        f"Generated by `{cmd}` on {result['generated']} ({m['cpus']} CPUs, jax {m['jax']}, "
        f"ortools {m['ortools']}, Python {m['python']}); {result['wall_seconds']:.0f} s in all. "
        "Regenerate with `partir bench --report docs/benchmarks.md` (see "
        "`benchmarks/README.md`).",
        "",
        f"Step times and memory are the cost model's estimates per device for "
        f"`{result['device']}` with a memory limit of {result['memory_limit']}; read them as "
        "ratios within this run. Search seconds are wall-clock on the machine above and only "
        "indicative. XLA figures come from compiling the plans on "
        f"{result['xla_devices']} fake CPU devices from abstract arguments (meshes of at "
        "most that many devices); XLA:CPU lowers reduce-scatter as all-reduce, so "
        "collectives are compared in its kinds.",
        "",
        "## Searched plans against expert plans",
        "",
        "Natural schedules: data axis batch + zero(stage=3) (gns: batch on the edge inputs); "
        "2-D model axis megatron (moe: expert + megatron); 3-D data x fsdp x tensor: batch, "
        "fsdp, megatron (moe: expert + megatron). `auto`: auto on every axis. The expert is "
        "the fastest plan within the limit among the library's expert plans "
        "(`partir.baselines`: BP, Z1-3 or FSDP, MP, BP+MP, BP+MP+Z3, BP+EMB, EP, BP+EP+Z3, "
        "BP+EP+MP+Z3, EDGE, NODE, EDGE+Z3, EDGE+MP+Z3, with the first mesh axis as data and "
        "the second as model) and on 3-D meshes BP+FSDP, BP+FSDP+MP, BP+FSDP+EP, "
        "BP+FSDP+EP+MP, EDGE+FSDP, EDGE+FSDP+MP (data, fsdp, tensor). The same-schedule "
        "expert is the expert plan made of the natural schedule's own strategies: "
        + "; ".join(
            f"{model} {rank}-D {', '.join(names)}" for (model, rank), names in SAME_SCHEDULE.items()
        )
        + ".",
        "",
        _md_table(CASE_COLUMNS, [_case_row(r) for r in result["cases"]]),
        "",
        CASE_CAPTION,
        "",
    ]
    lost = losses(result)
    parts += ["### Where partir loses", ""]
    if lost:
        for r in lost:
            parts.append(
                f"- {r['model']} {r['size']} {mesh_text(r['mesh'])} {r['schedule']} "
                f"({r['strategies']}): {r['ratio']:.3f}x {r['expert']['name']}"
            )
    else:
        parts.append("- nowhere: every searched plan is at least as fast as the best expert.")
    rep = [
        r
        for r in result["cases"]
        if r.get("replicated")
        and "searched" in r
        and r["replicated"]["fits"]
        and r["replicated"]["step_time_s"] < r["searched"]["step_time_s"] * (1 - 1e-9)
    ]
    if rep:
        parts += [
            "",
            f"The replicated plan is faster still than the searched one in {len(rep)} cases "
            "(the natural schedules require batch and ZeRO, which cost latency that models "
            "this small cannot amortise): "
            + ", ".join(
                f"{r['model']} {r['size']} {mesh_text(r['mesh'])} {r['schedule']} "
                f"({r['searched']['step_time_s'] / r['replicated']['step_time_s']:.1f}x)"
                for r in rep
            )
            + ".",
        ]
    parts.append("")
    if result.get("scaling"):
        s = result["scaling"]
        size = ", ".join(f"{k}={v}" for k, v in s["size"].items())
        parts += [
            "## Scaling",
            "",
            f"gpt ({size}) on {mesh_text(s['mesh'])}, {s['strategies']}; ratios are to the "
            f"{s['rows'][0]['layers']}-layer model. search s = all of `solve` after the "
            "program is traced. Of it, `full program s` is building the full program's "
            "propagator and cost model, replaying the decisions on it and costing the plan "
            "(what still grows with depth); `searching` is the rest: tracing the 1- and "
            "2-layer copies and searching them (MCTS s), which does not grow. With the "
            "layers under `lax.scan` (`as` scan) the program is one layer body whatever the "
            "depth: it is searched whole, with no copies, and nothing grows.",
            "",
            _md_table(SCALING_COLUMNS, _scaling_rows(s)),
            "",
        ]
    f = result["fidelity"]
    parts += [
        "## Fidelity: the cost model against XLA",
        "",
        f"Predicted over compiled, per device, for the {len(f['rows'])} plans compiled "
        f"({f['verify_ok']} pass `partir verify`: collectives within 5 % per kind, argument "
        "bytes exact). Peak memory is an estimate and is not held to a tolerance.",
        "",
        _md_table(FIDELITY_COLUMNS, _fidelity_summary_rows(f)),
        "",
        _md_table(
            ["plan", "collectives predicted", "XLA", "ratio", "peak predicted", "XLA", "ratio"],
            [
                [
                    r["plan"],
                    _bytes(r["predicted_collective_bytes"]),
                    _bytes(r["collective_bytes"]),
                    _x(r["collective_ratio"], 3),
                    _bytes(r["predicted_peak_bytes"]),
                    _bytes(r["peak_bytes"]),
                    _x(r["peak_memory_ratio"], 3),
                ]
                for r in f["rows"]
            ],
        ),
        "",
    ]
    if result.get("pruning"):
        parts += [
            "## CP-SAT pruning",
            "",
            "The realistic-size natural-schedule searches on 8x8 again with "
            "`Search(prune=None)`, at the suite's limit and (mlp, gpt, moe) at a tight limit, "
            f"{TIGHT_SLACK:.2f} times the peak of the plan found at the suite's limit, where "
            "pruning has something to remove. Episodes and seconds to best: the last "
            "improvement of each axis's best-reward curve, summed over axes. FALSE INFEASIBLE: "
            "CP-SAT declared the limit infeasible but the unpruned search found a plan within "
            "it.",
            "",
            _md_table(PRUNING_COLUMNS, _pruning_rows(result["pruning"])),
            "",
        ]
    notes = anomalies(result)
    if notes:
        parts += ["## Anomalies", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(parts)
