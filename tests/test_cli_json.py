"""`partir solve --json` prints exactly one JSON object on stdout in every outcome; the
package exports its errors and warnings and loads ortools only when pruning runs."""

import json
import pathlib
import subprocess
import sys

import pytest

import partir
from partir.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "mlp.partir"


def one_object(capsys) -> dict:
    out = capsys.readouterr().out
    assert out.count("\n") == 1 or out.strip().startswith("{")
    return json.loads(out)  # exactly one object: json.loads refuses anything after it


def test_solve_json_prints_the_plan(capsys):
    assert main(["solve", str(MLP), "--json", "--seconds", "5"]) == 0
    assert one_object(capsys)["format"] == "partir-plan/1"


def test_an_infeasible_limit_prints_an_error_object_with_the_numbers(tmp_path, capsys):
    goal = tmp_path / "tight.partir"
    goal.write_text(MLP.read_text().replace("16GiB", "1KiB"))
    assert main(["solve", str(goal), "--json"]) == 3
    d = one_object(capsys)
    assert d["exit"] == 3 and "needs at least" in d["error"]
    assert d["memory_limit_bytes"] == 1024
    assert d["smallest_memory_bytes"] > d["memory_limit_bytes"]


def test_a_plan_over_the_limit_unpruned_prints_an_error_object_with_the_plan(tmp_path, capsys):
    goal = tmp_path / "tight.partir"
    goal.write_text(MLP.read_text().replace("16GiB", "1KiB"))
    assert main(["solve", str(goal), "--json", "--no-prune", "--seconds", "2"]) == 3
    d = one_object(capsys)
    assert d["exit"] == 3 and d["peak_memory_bytes"] > d["memory_limit_bytes"] == 1024
    assert d["plan"]["format"] == "partir-plan/1"


@pytest.mark.parametrize(
    "argv",
    [
        ["solve", "no-such-file.partir", "--json"],
        ["solve", "{goal}", "--json"],  # a goal file with a syntax error
        ["solve", str(MLP), "--json", "--seconds", "-1"],  # argparse refuses it
    ],
)
def test_bad_input_prints_an_error_object_and_exits_2(argv, tmp_path, capsys):
    bad = tmp_path / "bad.partir"
    bad.write_text('program "partir.models.mlp:train_step"\nmesh batch=\n')
    argv = [a.replace("{goal}", str(bad)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    d = one_object(capsys)
    assert d["exit"] == 2 and d["error"]


def test_errors_and_warnings_are_exported():
    from partir.ir.program import TraceError
    from partir.ir.rules import UnknownPrimitiveWarning

    assert partir.TraceError is TraceError
    assert partir.UnknownPrimitiveWarning is UnknownPrimitiveWarning
    with pytest.raises(partir.TraceError):
        partir.Goal(lambda x: x["missing"], ({"a": 1.0},), mesh={"m": 1}).program  # noqa: B018


def test_import_partir_does_not_load_ortools():
    code = "import sys, partir; print(sorted(m for m in sys.modules if m.startswith('ortools')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
