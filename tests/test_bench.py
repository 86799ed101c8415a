"""The benchmark suite in tiny form, so that it cannot rot: one tiny case compiled by XLA,
scaling at 1 and 2 layers, pruning on and off, the tables, the report and the JSON."""

import io
import json

import partir
from partir import bench

TINY_GPT = {"d_model": 32, "heads": 4, "seq": 16, "batch": 8, "vocab": 64}


def test_bench_runs_in_tiny_form(tmp_path):
    c = bench.case("mlp", "tiny", bench.MESH_2D_SMALL)
    result = bench.run([c], scaling=[1, 2], scaling_size=TINY_GPT, pruning=[c])
    json.dumps(result, default=bench.json_default)  # one JSON-able object

    (r,) = result["cases"]
    assert "error" not in r, r.get("error")
    assert r["model"] == "mlp" and r["mesh"] == {"data": 2, "model": 4}
    assert r["expert"]["name"] in r["experts"] and r["ratio"] > 0
    assert r["searched"]["episodes"] >= 0 and r["searched"]["seconds"] >= 0
    assert r["xla"]["searched"]["argument_bytes"] > 0
    assert r["xla"]["expert"]["argument_bytes"] > 0

    rows = result["scaling"]["rows"]
    assert [(row["layers"], row["scan"]) for row in rows] == [
        (1, False),
        (2, False),
        (1, True),
        (2, True),
    ]
    listed, scanned = rows[:2], rows[2:]
    assert listed[0]["time_ratio"] == 1.0 and listed[1]["ops"] > listed[0]["ops"]
    assert scanned[0]["time_ratio"] == 1.0 and scanned[1]["ops"] == scanned[0]["ops"]
    assert all(0 <= row["full_program_seconds"] <= row["seconds"] for row in rows)

    f = result["fidelity"]
    assert f["argument_memory"]["plans"] >= 1 and f["argument_memory"]["geomean"] == 1.0

    (p, tight) = result["pruning"]  # mlp: at the suite's limit and at a tight one
    assert p["cpsat"]["step_time_s"] > 0 and p["none"]["step_time_s"] > 0
    assert tight["memory_limit_bytes"] < p["memory_limit_bytes"]

    out = io.StringIO()
    bench.print_tables(result, file=out)
    assert "searched plans against expert plans" in out.getvalue()
    md = bench.markdown(result)
    assert md.startswith("# partir benchmarks") and "| mlp | tiny | 2x4 |" in md


def test_main_writes_report_and_json(tmp_path, monkeypatch, capsys):
    small = {"cases": [bench.case("mlp", "tiny", bench.MESH_1D)], "scaling": [], "pruning": []}
    real_run = bench.suite.run
    monkeypatch.setattr(bench.suite, "run", lambda **kw: real_run(**{**kw, **small}))
    report = tmp_path / "bench.md"
    assert bench.main(quick=True, as_json=True, report=str(report)) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["model"] for c in out["cases"]] == ["mlp"]
    assert set(out) >= {"cases", "scaling", "fidelity", "pruning"}
    assert report.read_text().startswith("# partir benchmarks")


def test_goals_of_one_model_share_one_trace_and_the_library_experts():
    programs = bench.experts.Traces()
    flat = programs.goal(bench.case("mlp", "tiny", bench.MESH_1D))
    cube = programs.goal(bench.case("mlp", "tiny", bench.MESH_3D_SMALL))
    assert cube.program is flat.program and len(programs.trace_seconds) == 1
    assert cube.mesh == bench.MESH_3D_SMALL and cube.propagator is not flat.propagator
    # the expert plans are the library's (three-axis ones included), and the replicated plan
    plans = bench.experts.expert_candidates(cube)
    assert set(plans) == set(partir.baselines(cube)) | {"replicated"}
    assert {"BP+FSDP", "BP+FSDP+MP"} <= set(plans)
    rules = dict(plans["BP+FSDP+MP"].to_rules())
    assert {
        a
        for spec in rules.values()
        for e in spec
        if e
        for a in (e if isinstance(e, tuple) else (e,))
    } == set(bench.MESH_3D_SMALL)
