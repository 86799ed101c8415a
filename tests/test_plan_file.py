"""Reading plan files back: the specs a file shows are the plan it loads."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from partir.dsl import load_goal
from partir.ir.specs import PlanError
from partir.solver.plan import Plan
from partir.solver.search import solve

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "data", "goals", "tiny.partir")
W_IN = "opt_state/mu/layers/0/mlp/w_in"


def _goal(tmp_path, extra: str = ""):
    shutil.copy(os.path.join(HERE, "data", "goals", "tiny_model.py"), tmp_path)
    with open(TINY) as f:
        text = f.read().replace("episodes=10K", "episodes=20") + extra
    (tmp_path / "g.partir").write_text(text)
    return load_goal(tmp_path / "g.partir")


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    goal = _goal(tmp)
    return tmp, json.loads(solve(goal).to_json())


def _load(tmp_path, record) -> Plan:
    return Plan.from_json(json.dumps(record), _goal(tmp_path))


def test_a_plan_file_reads_back_as_written(solved):
    tmp, record = solved
    plan = _load(tmp, record)
    assert plan.decisions is not None  # replayed, exactly
    assert json.loads(plan.to_json())["specs"] == record["specs"]


def test_a_plan_read_without_its_goal_says_so_when_asked_for_a_value(solved):
    _, record = solved
    bare = Plan.from_json(json.dumps(record))
    assert bare.specs  # its input specs are all it has
    with pytest.raises(ValueError, match="pass goal="):
        bare.value_sharding(0)


def test_edited_specs_win_over_the_recorded_decisions(solved):
    tmp, record = solved
    sharded = [p for p, s in record["specs"].items() if any(s)]
    assert sharded
    edited = dict(
        record, specs={**record["specs"], sharded[0]: [None] * len(record["specs"][sharded[0]])}
    )
    plan = _load(tmp, edited)
    assert json.loads(plan.to_json())["specs"] == edited["specs"]
    assert plan.decisions is None  # made from the specs, not replayed
    # no decisions at all with sharded specs: the sharded plan, not a replicated one
    plan = _load(tmp, dict(record, decisions=[]))
    assert json.loads(plan.to_json())["specs"] == record["specs"]


def test_decisions_that_use_an_axis_twice_on_an_input_are_refused(solved):
    tmp, record = solved
    path, dim, axis, prio, pos = next(d for call in record["decisions"] for d in call)
    bad = dict(record, decisions=record["decisions"] + [[[path, 1 - dim, axis, prio, pos]]])
    with pytest.raises(PlanError, match=f"along dims {dim} and {1 - dim}"):
        _load(tmp, bad)


def test_specs_that_a_replicate_statement_forbids_are_refused(solved):
    tmp, record = solved
    path = next(p for p, s in record["specs"].items() if "batch" in str(s))
    goal = _goal(tmp, f'\nreplicate "{path}" on batch\n')
    with pytest.raises(PlanError, match="replicate statement"):
        Plan.from_json(json.dumps(record), goal)


def test_a_plan_solved_with_a_replicate_of_one_zero_member_reads_back(tmp_path):
    # ZeRO tiles the w_in group on batch; the replicate keeps one member whole
    goal = _goal(tmp_path, f'\nreplicate "{W_IN}" on batch\n')
    plan = solve(goal)
    assert "batch" not in str(plan.specs[W_IN])
    again = Plan.from_json(plan.to_json(), _goal(tmp_path, f'\nreplicate "{W_IN}" on batch\n'))
    assert again.specs == plan.specs and again.decisions is not None
