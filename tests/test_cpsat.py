"""CP-SAT pruning: Ctrl-C still reaches Python after a solve, and the subprocess that keeps
OR-tools away from TensorFlow answers as the in-process solve does."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partir.solver import cpsat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRUNE_THEN_CTRL_C = """
import os, signal, time
from partir.solver import cpsat
print(cpsat.feasible([(100, [50, 50])], 60, [None, ("whole", 0)], isolate=False))
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    print("no KeyboardInterrupt")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""


def test_ctrl_c_after_a_solve_raises_keyboard_interrupt():
    done = subprocess.run(
        [sys.executable, "-c", PRUNE_THEN_CTRL_C],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # -2: killed by the default handler
    assert done.stdout.split() == ["[True,", "False]", "KeyboardInterrupt"]


models = st.lists(
    st.tuples(st.integers(0, 10**6), st.lists(st.integers(0, 10**6), max_size=3)),
    min_size=1,
    max_size=4,
)


@settings(max_examples=4, deadline=None)
@given(models, st.integers(0, 3 * 10**6))
def test_the_subprocess_answers_as_the_in_process_solve(groups, budget):
    queries = [None]
    queries += [("action", i) for i in range(sum(len(t) for _, t in groups))]
    queries += [("whole", k) for k in range(len(groups))]
    here = cpsat.feasible(groups, budget, queries, isolate=False)
    assert cpsat.feasible(groups, budget, queries, isolate=True) == here
    # the whole-model answer is what the numbers say
    assert here[0] == (sum(min([w, *t]) for w, t in groups) <= budget)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["tensorflow", "keras_hub"])
def test_pruning_after_tensorflow_is_imported_does_not_crash(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"needs {module}")
    script = textwrap.dedent(f"""
        import os
        os.environ["KERAS_BACKEND"] = "jax"
        import {module}  # imports TensorFlow: OR-tools in this process would crash (-11)
        from partir.cli import main
        raise SystemExit(main(["solve", {os.path.join(ROOT, "examples", "mlp.partir")!r},
                               "--seconds", "5"]))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pruned by" in done.stderr


LONG = """\
program "partir.models.gpt:train_step"
inputs  "partir.models.gpt:example_args"(preset="small")
mesh    batch=2, model=4, spare=1
device  "tpu-v4"
memory  <= 32GiB
axis batch { batch }
axis model { auto }
search mcts(seconds=60, patience=10000000, proxy=false)
"""


@pytest.mark.slow
def test_ctrl_c_during_partir_solve_still_prints_a_plan(tmp_path):
    goal = tmp_path / "long.partir"
    goal.write_text(LONG)
    partir = os.path.join(os.path.dirname(sys.executable), "partir")
    proc = subprocess.Popen(
        [partir, "solve", str(goal)], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stderr.readline()  # the note on axis 'spare' comes once traced
        assert line.startswith(str(goal)), line
        time.sleep(5)  # CP-SAT has pruned the model axis; the search is under way
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]  # -2: killed, no plan
    assert "searched" in err and "PartitionSpec" in err
