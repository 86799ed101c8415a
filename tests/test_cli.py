"""The partir command: exit statuses, --json, the plan file, rules, verify, explain."""

import json
import pathlib

from partir.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
MLP = str(ROOT / "examples" / "mlp.partir")


def test_check_ok(capsys):
    assert main(["check", MLP]) == 0
    assert "ok:" in capsys.readouterr().err


def test_bad_goal_file_exits_2_with_the_place_and_no_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.partir"
    bad.write_text(pathlib.Path(MLP).read_text().replace("megatron", "megatorn"))
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:9:" in err and "did you mean 'megatron'?" in err
    assert "Traceback" not in err
    assert main(["check", str(tmp_path / "missing.partir")]) == 2


def test_solve_json_out_rules_verify_explain(tmp_path, capsys):
    out, rules = tmp_path / "plan.json", tmp_path / "rules.py"
    assert main(["solve", MLP, "--json", "--out", str(out), "--rules", str(rules)]) == 0
    printed = json.loads(capsys.readouterr().out)  # exactly one object on stdout
    assert printed["format"] == "partir-plan/1" == json.loads(out.read_text())["format"]
    assert set(printed) >= {
        "mesh",
        "device",
        "specs",
        "out_specs",
        "cost",
        "baselines",
        "search",
        "goal",
    }
    namespace: dict = {}
    exec(rules.read_text(), namespace)
    assert namespace["RULES"][-1][0] == "**"
    assert main(["verify", MLP, str(out), "--json", "--numerics"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["numerics"]["max_relative_error"] <= 1e-5
    assert main(["explain", MLP, str(out)]) == 0
    assert "where the collectives come from" in capsys.readouterr().out


def test_memory_limit_that_cannot_be_met_exits_3(tmp_path, capsys):
    goal = tmp_path / "tight.partir"
    goal.write_text(pathlib.Path(MLP).read_text().replace("16GiB", "1KiB"))
    assert main(["solve", str(goal)]) == 3
    assert "needs at least" in capsys.readouterr().err


def test_no_plan_fits_names_the_largest_buffers_at_its_peak(tmp_path, capsys):
    goal = tmp_path / "tight.partir"
    goal.write_text(pathlib.Path(MLP).read_text().replace("16GiB", "1KiB"))
    assert main(["solve", str(goal), "--no-prune", "--seconds", "1"]) == 3
    err = capsys.readouterr().err
    assert "no plan found fits the memory limit" in err
    listed = err.split("the largest buffers live at its peak:")[1].strip().splitlines()[:5]
    assert len(listed) == 5 and all(("iB" in row or " B " in row) for row in listed)
    assert any("params/" in row or "opt_state/" in row or " at " in row for row in listed)


def test_solve_text_in_a_pipe_keeps_names_and_numbers_whole(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["solve", MLP]) == 0
    err = capsys.readouterr().err
    rows = [line for line in err.splitlines() if line.startswith("│")]
    assert any(row.split("│")[1].strip() == "replicated" for row in rows)
    assert any(row.split("│")[1].strip() == "searched" for row in rows)
    assert "…" not in err
    # every cost row on one line: a step time and its unit side by side
    steps = [row.split("│")[2].strip() for row in rows if row.split("│")[1].strip() == "searched"]
    assert len(steps) == 1 and steps[0].split()[-1] in ("s", "ms", "us", "ns")


def test_a_damaged_or_foreign_plan_file_exits_2_with_a_reason(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["solve", MLP, "--json", "--out", str(plan)]) == 0
    capsys.readouterr()
    text = plan.read_text()
    record = json.loads(text)
    other_mesh = pathlib.Path(MLP).read_text().replace("model=4", "model=2")
    assert other_mesh != pathlib.Path(MLP).read_text()
    (tmp_path / "other.partir").write_text(other_mesh)
    nope = json.loads(text)
    nope["decisions"] = [
        [[p, d, "nope", pr, po] for p, d, _, pr, po in call] for call in record["decisions"]
    ]
    cases = {
        "truncated": (text[: len(text) // 2], MLP, "it is not JSON"),
        "a list": ("[1, 2]", MLP, "format is 'list'"),
        "no specs": (
            json.dumps({"format": record["format"], "mesh": record["mesh"]}),
            MLP,
            "damaged",
        ),
        "unknown axis": (json.dumps(nope), MLP, "on axis 'nope'"),
        "other mesh": (text, str(tmp_path / "other.partir"), "solve the goal again"),
    }
    for name, (content, goal, reason) in cases.items():
        bad = tmp_path / f"{name}.json"
        bad.write_text(content)
        for command in ("explain", "verify"):
            assert main([command, goal, str(bad)]) == 2, (name, command)
            err = capsys.readouterr().err
            assert reason in err and "Traceback" not in err, (name, command, err)


def test_a_mesh_axis_that_divides_no_batch_exits_2(tmp_path, capsys):
    goal = tmp_path / "three.partir"
    goal.write_text(pathlib.Path(MLP).read_text().replace("batch=2", "batch=3"))
    assert main(["solve", str(goal)]) == 2
    err = capsys.readouterr().err
    assert "can tile no data input" in err and "Traceback" not in err


def test_a_program_that_fails_to_trace_exits_2_naming_the_error(tmp_path, capsys):
    goal = tmp_path / "mixed.partir"
    text = (
        pathlib.Path(MLP)
        .read_text()
        .replace('"partir.models.mlp:train_step"', '"partir.models.gpt:train_step"')
    )
    goal.write_text(text)
    for command in ("check", "solve"):
        assert main([command, str(goal)]) == 2
        err = capsys.readouterr().err
        assert f"{goal}:2:9: error: tracing train_step" in err and "Traceback" not in err


def test_a_goal_file_that_begins_with_a_byte_order_mark_is_read(tmp_path, capsys):
    goal = tmp_path / "bom.partir"
    goal.write_bytes(b"\xef\xbb\xbf" + pathlib.Path(MLP).read_bytes())
    assert main(["check", str(goal)]) == 0
    assert "ok:" in capsys.readouterr().err


SMALL = """
import jax, jax.numpy as jnp
def step(params, data):
    return jnp.sum(data["x"] @ params["w"])
def args():
    return ({"w": jax.ShapeDtypeStruct((16, 16), jnp.float32)},
            {"x": jax.ShapeDtypeStruct((16, 16), jnp.float32)})
"""


def test_verify_that_crashes_exits_4_not_1_the_mismatch_status(tmp_path, capsys):
    # this process's JAX has started with fewer devices than the plan's mesh needs
    import jax
    import pytest

    if len(jax.devices()) >= 16:
        pytest.skip("JAX started with 16 devices or more")
    (tmp_path / "small.py").write_text(SMALL)
    goal = tmp_path / "small.partir"
    goal.write_text(
        'program "small.py:step"\ninputs "small.py:args"()\nmesh batch=16\n'
        "axis batch { batch }\nsearch mcts(episodes=2)\n"
    )
    plan = tmp_path / "plan.json"
    assert main(["solve", str(goal), "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["verify", str(goal), str(plan)]) == 4
    err = capsys.readouterr().err
    assert "needs 16 devices but JAX sees" in err and "exit status 4, not a verdict" in err
