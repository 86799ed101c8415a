"""Baseline plans: sharding rules written the way people write them today (the "expert"
plans that the search is measured against; `expert` the strategy is MoE parallelism).

Each plan is a schedule of rule lists ({path glob: PartitionSpec}, first match wins), the
shape of MaxText's or Flax's partition rules, applied in order (batch first, then model
parallelism, then ZeRO). `**/attn/q` covers a parameter and its optimizer moments alike.
`experts(goal)` costs the ones that apply to a goal's program and mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from jax.sharding import PartitionSpec as P

from partir.goal import Goal
from partir.ir.groups import largest_dividing_dim, param_prefix
from partir.ir.specs import PlanError, glob_match
from partir.solver.plan import Plan, make_plan

Rules = dict[str, P]
Schedule = list[Rules]

# Megatron (Shoeybi et al. 2019): column-parallel q/k/v (by heads) and MLP-in, row-parallel
# o and MLP-out; layer norms, embeddings and biases after a row-parallel op replicated.
MEGATRON = {
    "**/attn/q": P(None, "{m}"),
    "**/attn/k": P(None, "{m}"),
    "**/attn/v": P(None, "{m}"),
    "**/attn/o": P("{m}"),
    "**/mlp/w_in": P(None, "{m}"),
    "**/mlp/w_gate": P(None, "{m}"),  # SwiGLU's gate (llama): column-parallel like w_in
    "**/mlp/b_in": P("{m}"),
    "**/mlp/w_out": P("{m}"),
}
EXPERTS = {"**/moe/w_in": P("{m}"), "**/moe/w_out": P("{m}"), "**/moe/b_in": P("{m}")}
EMBEDDING = {"**/embed": P("{m}")}


def _fill(rules: dict, **names: str) -> Rules:
    def sub(e):
        if e is None:
            return None
        return e.format(**names)

    return {k.format(**names): P(*[sub(e) for e in spec]) for k, spec in rules.items()}


def _scanned(goal: Goal) -> bool:
    """Whether the layers are one stacked subtree (run under `lax.scan`): their parameters
    are `.../layers/attn/q` with a leading layer dim, not `.../layers/3/attn/q`."""
    for path in goal.program.inputs:
        parts = path.split("/")
        if any(p == "layers" and not n.isdigit() for p, n in zip(parts, parts[1:])):
            return True
    return False


def _per_layer(goal: Goal, rules: dict, axis: str) -> Rules:
    """Rules written for one layer's weights, on `axis`, shifted past the layer dim when
    stacked (the leading "layers" logical axis of MaxText's scanned parameters)."""
    paths = list(goal.program.inputs)
    # a family's optional weights (SwiGLU's gate) only where the model has them
    filled = {k: s for k, s in _fill(rules, m=axis).items() if any(glob_match(k, p) for p in paths)}
    if not _scanned(goal):
        return filled
    return {k: P(None, *spec) for k, spec in filled.items()}


# Megatron for a U-Net's residual blocks: the first conv column-parallel (output channels,
# with its bias, the time projection added to it and the norm after it), the second
# row-parallel (input channels); the other convs (in, out, skip, down/upsampling) replicated.
CONV_MEGATRON = {
    "**/conv1/w": P(None, None, None, "{m}"),
    "**/conv1/b": P("{m}"),
    "**/time/w": P(None, "{m}"),
    "**/time/b": P("{m}"),
    "**/norm2/scale": P("{m}"),
    "**/norm2/bias": P("{m}"),
    "**/conv2/w": P(None, None, "{m}"),
}


def megatron_rules(goal: Goal, axis: str) -> Rules:
    """Megatron on `axis` for the goal's model family."""
    family = _family(goal)
    if family in ("mlp", "graph"):
        return _mlp_megatron(goal, axis)
    if family == "conv":
        return _fill(CONV_MEGATRON, m=axis)
    return _per_layer(goal, MEGATRON, axis)


def expert_parallel_rules(goal: Goal, axis: str) -> Rules:
    """The experts dim of moe layers tiled on `axis`."""
    return _per_layer(goal, EXPERTS, axis)


def _state_paths(goal: Goal) -> list[str]:
    return sorted(set(goal.program.carried.values()))


def _data_paths(goal: Goal) -> list[str]:
    state = set(_state_paths(goal))
    return [p for p in goal.program.inputs if p not in state]


def _size(goal: Goal, axis: str | tuple[str, ...]) -> int:
    axes = (axis,) if isinstance(axis, str) else axis
    n = 1
    for a in axes:
        n *= goal.sizes[a]
    return n


def batch_rules(goal: Goal, axis, paths: list[str] | None = None) -> Rules:
    """Data inputs tiled along dim 0 (the zoo's batch dim), where the axis (or tuple of
    axes) divides it."""
    prog = goal.program
    n = _size(goal, axis)
    out = {}
    for path in paths if paths is not None else _data_paths(goal):
        shape = prog.values[prog.inputs[path]].shape
        if shape and shape[0] % n == 0:
            out[path] = P(axis)
    if not out:
        raise PlanError(f"no data input has a leading dim that {axis!r} ({n}) divides")
    return out


def zero_rules(goal: Goal, axis, *, params: bool, taken: Sequence[Rules] = ()) -> Rules:
    """ZeRO: optimizer state (and with `params`, parameters) tiled on `axis` (or a tuple
    of axes) along their largest dim that it divides and that earlier stages left whole."""
    prog = goal.program
    n = _size(goal, axis)
    out = {}
    prefix = param_prefix(prog)
    for path in _state_paths(goal):
        if not params and prefix is not None and path.startswith(prefix + "/"):
            continue
        shape = prog.values[prog.inputs[path]].shape
        used = set()
        for stage in taken:
            for pattern, spec in stage.items():
                if pattern == path or glob_match(pattern, path):
                    used |= {d for d, e in enumerate(spec) if e is not None}
                    if axis in spec:  # an earlier stage tiles it on this axis already
                        used = set(range(len(shape)))
                    break
        d = largest_dividing_dim(shape, n, exclude=used)
        if d is not None:
            out[path] = P(*([None] * d + [axis]))
    return out


def _family(goal: Goal) -> str:
    paths = list(goal.program.inputs)
    has = lambda pattern: any(glob_match(pattern, p) for p in paths)  # noqa: E731
    if has("**/moe/w_in"):
        return "moe"
    if has("**/attn/q"):
        return "transformer"
    if has("**/senders"):
        return "graph"
    if has("**/images"):
        return "conv"
    return "mlp"


def expert_schedules(goal: Goal) -> dict[str, Callable[[], Schedule]]:
    """Name -> schedule builder, for the expert plans of the goal's model family and mesh.
    The first mesh axis is the data axis; the second (if any) the model axis. On three axes
    or more, also plans that use the first three as data x fsdp x tensor (`_three_axes`)."""
    axes = list(goal.mesh)
    data = axes[0]
    model = axes[1] if len(axes) > 1 else None
    family = _family(goal)
    plans: dict[str, Callable[[], Schedule]] = {}
    bp = lambda: batch_rules(goal, data)  # noqa: E731

    if family == "graph":
        edge = _edge_paths(goal)
        node = [p for p in _data_paths(goal) if p not in edge]
        plans["EDGE"] = lambda: [batch_rules(goal, data, edge)]
        plans["NODE"] = lambda: [batch_rules(goal, data, node)]
        plans["EDGE+Z3"] = lambda: [
            batch_rules(goal, data, edge),
            zero_rules(goal, data, params=True),
        ]
        if model:
            mp = megatron_rules(goal, model)
            plans["EDGE+MP+Z3"] = lambda: [
                batch_rules(goal, data, edge),
                mp,
                zero_rules(goal, data, params=True, taken=[mp]),
            ]
    else:
        plans["BP"] = lambda: [bp()]
        if model is None:  # ZeRO stages on a 1-D mesh; on more axes, FSDP over all of them
            plans["Z1"] = lambda: [bp(), zero_rules(goal, data, params=False)]
            plans["Z2"] = lambda: [bp(), zero_rules(goal, data, params=False)]
            plans["Z3"] = lambda: [bp(), zero_rules(goal, data, params=True)]
        else:
            every = tuple(axes)
            plans["FSDP"] = lambda: [batch_rules(goal, every), zero_rules(goal, every, params=True)]
    if family in ("transformer", "moe", "mlp", "conv") and model:
        mp = megatron_rules(goal, model)
        plans["MP"] = lambda: [mp]
        plans["BP+MP"] = lambda: [bp(), mp]
        plans["BP+MP+Z3"] = lambda: [bp(), mp, zero_rules(goal, data, params=True, taken=[mp])]
        if family in ("transformer", "moe"):
            plans["BP+EMB"] = lambda: [bp(), _fill(EMBEDDING, m=model)]
    if family == "moe":
        ep_axis = model or data
        ep = expert_parallel_rules(goal, ep_axis)
        plans["EP"] = lambda: [bp(), ep] if model else [ep]
        # what `expert` and `megatron` together on one axis do: experts and attention heads
        if model:
            ep_mp = {**ep, **megatron_rules(goal, model)}
            plans["BP+EP+MP+Z3"] = lambda: [
                bp(),
                ep_mp,
                zero_rules(goal, data, params=True, taken=[ep_mp]),
            ]
        else:
            plans["BP+EP+Z3"] = lambda: [bp(), ep, zero_rules(goal, data, params=True, taken=[ep])]
    if len(axes) >= 3:
        plans.update(_three_axes(goal, family))
    return plans


def _edge_paths(goal: Goal) -> list[str]:
    """A graph network's per-edge data inputs."""
    return [p for p in _data_paths(goal) if any(k in p for k in ("edges", "senders", "receivers"))]


def _three_axes(goal: Goal, family: str) -> dict[str, Callable[[], Schedule]]:
    """Plans that use all three axes of a data x fsdp x tensor mesh: the batch split over
    data and fsdp, ZeRO-3 on fsdp, Megatron or expert parallelism on tensor."""
    data, fsdp, tensor = list(goal.mesh)[:3]
    plans: dict[str, Callable[[], Schedule]] = {}
    if family == "graph":
        edge = _edge_paths(goal)
        plans["EDGE+FSDP"] = lambda: [
            batch_rules(goal, data, edge),
            batch_rules(goal, fsdp, edge),
            zero_rules(goal, fsdp, params=True),
        ]
        mp = megatron_rules(goal, tensor)
        plans["EDGE+FSDP+MP"] = lambda: [
            batch_rules(goal, data, edge),
            batch_rules(goal, fsdp, edge),
            mp,
            zero_rules(goal, fsdp, params=True, taken=[mp]),
        ]
        return plans

    def bp2() -> Schedule:
        return [batch_rules(goal, data), batch_rules(goal, fsdp)]

    plans["BP+FSDP"] = lambda: [*bp2(), zero_rules(goal, fsdp, params=True)]
    if family in ("transformer", "moe", "mlp", "conv"):
        mp = megatron_rules(goal, tensor)
        plans["BP+FSDP+MP"] = lambda: [*bp2(), mp, zero_rules(goal, fsdp, params=True, taken=[mp])]
    if family == "moe":
        ep = expert_parallel_rules(goal, tensor)
        plans["BP+FSDP+EP"] = lambda: [*bp2(), ep, zero_rules(goal, fsdp, params=True, taken=[ep])]
        ep_mp = {**ep, **megatron_rules(goal, tensor)}
        plans["BP+FSDP+EP+MP"] = lambda: [
            *bp2(),
            ep_mp,
            zero_rules(goal, fsdp, params=True, taken=[ep_mp]),
        ]
    return plans


def _mlp_megatron(goal: Goal, model: str) -> Rules:
    """Megatron in each stack of dense layers (`.../layers/<i>/w`): even layers
    column-parallel (with their biases), odd layers row-parallel."""
    out: Rules = {}
    for path in goal.program.inputs:
        parts = path.split("/")
        if "layers" in parts and parts[-1] in ("w", "b"):
            i = int(parts[parts.index("layers") + 1])
            col = i % 2 == 0
            if parts[-1] == "w":
                out[path] = P(None, model) if col else P(model)
            elif col:
                out[path] = P(model)
    return out


def expert_plans(goal: Goal) -> dict[str, Plan]:
    """The expert plans that apply to `goal` (rules that fit its shapes and mesh), costed."""
    out = {}
    for name, build in expert_schedules(goal).items():
        try:
            out[name] = make_plan(goal, build(), strict=False)
        except PlanError:
            continue
    return out


def replicated_plan(goal: Goal) -> Plan:
    return make_plan(goal, {})
