"""Every model of the zoo x every expert plan that applies: on 8 fake CPU devices the
sharded step equals the unsharded one, and XLA's collectives match the cost model."""

import functools

import jax
import pytest

from partir.goal import Goal
from partir.ir.xla import as_cpu_kinds, stats_of_compiled
from partir.models import MODELS
from partir.solver.baselines import expert_plans
from partir.solver.verify import close
from partir.testing import max_relative_error

# f32, sharded against unsharded: reductions run in another order, and an Adam step
# amplifies that rounding in elements whose gradient is near its epsilon; the worst seen
# over the zoo is 1.5e-5 (gpt BP+MP, mlp/w_out of layer 0), so 1e-5 holds for most plans
# but not all.
TOLERANCE = 3e-5
MESHES = {"1d": {"batch": 8}, "2d": {"batch": 2, "model": 4}}

# Where XLA:CPU moves part of the data differently from the cost model (it replaces the
# scatter half of some reduce-scatters by collective-permutes on a 2-D mesh, or gathers the
# updates of top_k's gradient scatter in full): held on total bytes instead of per kind.
TOTAL_ONLY = {
    ("gpt", "2d", "BP+MP+Z3"),
    ("gns", "1d", "EDGE+Z3"),
    ("moe", "1d", "BP"),
    ("moe", "2d", "BP"),
    ("moe", "2d", "BP+EMB"),
    ("moe", "2d", "EP"),
    ("moe", "2d", "BP+MP"),
    ("moe", "2d", "BP+MP+Z3"),
    ("moe", "2d", "BP+EP+MP+Z3"),
    ("unet", "2d", "BP+MP+Z3"),
}
# Where even the totals differ by more than 5%: known gaps of the cost model, kept as
# strict xfails so that a fix shows up. (gns EDGE+Z3 on 2-D: 92 KiB of collective-permutes
# and 16 KiB of all-to-all.) mlp and moe BP+MP+Z3 left this list when plan.jit began
# constraining resharded operands; moe EP on 1-D when the model priced one all-reduce per
# sharded reduction factor.
KNOWN_GAPS = {
    ("gns", "2d", "EDGE+Z3"),
    ("gns", "2d", "EDGE+MP+Z3"),  # 107 KiB of collective-permutes, 16 KiB of all-to-all
}


@functools.cache
def setup(model: str, mesh: str):
    m = MODELS[model]
    args = m.example_args(abstract=False, preset="tiny")
    goal = Goal(m.train_step, args, MESHES[mesh])
    expected = jax.jit(m.train_step)(*args)
    return goal, args, expected, expert_plans(goal)


def _names(model, mesh):
    m = MODELS[model]
    goal = Goal(m.train_step, m.example_args(preset="tiny"), MESHES[mesh])
    from partir.solver.baselines import expert_schedules

    return list(expert_schedules(goal))


# The slowest plans, 4-20 s each on 2 cores (XLA compiles of unet and moe mostly): run with
# -m slow. At least one plan of each model stays in the default run.
SLOW = {
    ("unet", "1d", "BP"),
    ("unet", "1d", "Z2"),
    ("unet", "1d", "Z3"),
    ("unet", "2d", "BP"),
    ("unet", "2d", "FSDP"),
    ("moe", "1d", "BP"),
    ("moe", "1d", "Z1"),
    ("moe", "1d", "Z3"),
    ("moe", "1d", "EP"),
    ("moe", "2d", "BP"),
    ("moe", "2d", "BP+EMB"),
    ("moe", "2d", "BP+MP"),
    ("moe", "2d", "BP+MP+Z3"),
    ("moe", "2d", "EP"),
    ("moe", "2d", "FSDP"),
    ("moe", "2d", "MP"),
    ("gpt", "1d", "Z2"),
    ("gpt", "1d", "Z3"),
    ("gpt", "2d", "BP+MP+Z3"),
    ("gns", "1d", "EDGE"),
    ("gns", "1d", "EDGE+Z3"),
    ("gns", "2d", "EDGE+Z3"),
    ("gns", "2d", "EDGE+MP+Z3"),
    ("unet", "2d", "MP"),
    ("unet", "2d", "BP+MP"),
    ("unet", "2d", "BP+MP+Z3"),
    ("moe", "1d", "BP+EP+Z3"),
    ("moe", "2d", "BP+EP+MP+Z3"),
}


def _marks(case: tuple[str, str, str]) -> list:
    marks = [pytest.mark.slow] if case in SLOW else []
    if case in KNOWN_GAPS:
        marks.append(pytest.mark.xfail(strict=True, reason="known cost-model gap"))
    return marks


CASES = [
    pytest.param(model, mesh, name, marks=_marks((model, mesh, name)), id=f"{model}-{mesh}-{name}")
    # llama (bf16 compute by default) is held to XLA by benchmarks/xla_fidelity.py: in f32 its
    # sharded step differs from the unsharded one by 1.4e-4 on every plan, BP included.
    for model in MODELS
    if model != "llama"
    for mesh in MESHES
    for name in _names(model, mesh)
]


@pytest.mark.parametrize("model, mesh, name", CASES)
def test_expert_plan_runs_sharded_and_matches_xla(model, mesh, name):
    goal, args, expected, plans = setup(model, mesh)
    plan = plans[name]
    compiled = plan.jit().lower(*args).compile()
    err = max_relative_error(compiled(*args), expected)
    assert err <= TOLERANCE, f"max relative error {err:.2e}"
    stats = stats_of_compiled(compiled)
    assert plan.cost.argument_bytes == stats.argument_bytes
    predicted = as_cpu_kinds(plan.cost.bytes_by_kind())
    measured = as_cpu_kinds(stats.bytes_by_kind())
    if (model, mesh, name) in TOTAL_ONLY | KNOWN_GAPS:
        assert close(sum(predicted.values()), sum(measured.values())), (predicted, measured)
    else:
        bad = {
            k: (predicted[k], measured[k])
            for k in predicted
            if not close(predicted[k], measured[k])
        }
        assert not bad, f"(predicted, XLA) bytes per kind: {bad}"


def test_megatron_rules_skip_the_layer_dim_of_scanned_layers():
    """gpt with `scan=True` stacks each layer weight under a leading layer dim: the Megatron
    expert tiles the same dims as on the unrolled model, so it moves the same bytes. (Step
    times differ: the latency model combines a scan body's collectives differently.)"""
    m = MODELS["gpt"]
    mesh = MESHES["2d"]
    unrolled = expert_plans(Goal(m.train_step, m.example_args(preset="tiny"), mesh))
    scanned = expert_plans(Goal(m.train_step, m.example_args(preset="tiny", scan=True), mesh))
    rules = dict(scanned["BP+MP"].to_rules())
    assert tuple(rules["**/layers/attn/q"]) == (None, None, "model", None)  # heads
    assert tuple(rules["**/layers/mlp/w_out"]) == (None, "model", None)  # hidden
    for name in ("MP", "BP+MP"):
        assert scanned[name].cost.comm_bytes == unrolled[name].cost.comm_bytes, name
