"""The hostile corpus of tests/data/hostile: each goal and plan file exits as cases.toml
says, with its message at FILE:LINE:COL and no traceback."""

from __future__ import annotations

import os
import tomllib

import pytest

from partir.cli import main

HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "hostile")
with open(os.path.join(HOSTILE, "cases.toml"), "rb") as f:
    CASES = tomllib.load(f)
PLAN_GOAL = os.path.join(HOSTILE, "plans", "goal.partir")


def _check(argv: list[str], where: str, case: dict, capsys) -> None:
    status = main(argv)
    err = capsys.readouterr().err
    assert status == case["exit"], err
    assert "Traceback" not in err
    if case["exit"]:
        place = f"{where}:{case['at']}: " if case["at"] else ""  # "": found while solving
        assert f"{place}error: " in err, err
        assert case["message"] in err, err


@pytest.mark.parametrize("case", CASES["goal"], ids=lambda c: c["file"])
def test_hostile_goal_files(case, capsys):
    path = os.path.join(HOSTILE, "goals", case["file"])
    _check([case.get("command", "check"), path], path, case, capsys)


@pytest.mark.parametrize("case", CASES["plan"], ids=lambda c: c["file"])
def test_hostile_plan_files(case, capsys):
    path = os.path.join(HOSTILE, "plans", case["file"])
    _check(["explain", PLAN_GOAL, path], path, case, capsys)


def test_every_file_of_the_corpus_has_a_case():
    for kind, ext in (("goal", ".partir"), ("plan", ".json")):
        folder = os.path.join(HOSTILE, f"{kind}s")
        files = {f for f in os.listdir(folder) if f.endswith(ext)} - {"goal.partir"}
        assert files == {c["file"] for c in CASES[kind]}
