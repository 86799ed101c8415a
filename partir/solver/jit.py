"""Run a plan: a `jax.jit` with the plan's input/output shardings and its internal
shardings as `with_sharding_constraint`s, so XLA follows the plan instead of guessing.

The goal's jaxpr is replayed equation by equation; every equation's outputs are found in
the traced `Program` by the equation's position (the same keys `trace` recorded) and
constrained to the plan's sharding of that value; an operand the plan reshards is
constrained to the sharding the equation runs in, as the cost model priced it. Loops are
rebuilt with `lax.scan`, `lax.while_loop` and `lax.switch` around replayed bodies, so
their insides are constrained too. Checkpoint regions (`remat2`) and custom_jvp / custom_vjp
calls are re-bound around their replayed bodies with their own policy and derivative rules,
so XLA still rematerialises and JAX still differentiates by the user's rules. A shard_map
is re-bound on the plan's mesh with its own in/out specs, its body as written.

Values made from constants alone (`partir.ir.liveness.free_values`: scalar broadcasts,
iotas and the pointwise and layout ops of those) are not constrained, as outputs or as
operands: XLA fuses them into their readers, in whatever sharding those read; a
constraint could make it keep one as a buffer.

The user's own sharding constraints (`sharding_constraint`, `reshard`) are not replayed:
they name the user's mesh, not partir's. partir's sharding of the constrained value takes
their place, which equals the user's on the goal mesh when the goal honours them; it is
applied even with `constrain=False` then, so the user's decision always holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from partir.ir.constraints import CONSTRAINT_PRIMITIVES
from partir.ir.jaxpr_walk import BODY, COND, JaxprWalker, inlined_jaxpr, open_jaxpr, scan_counts
from partir.ir.liveness import free_values
from partir.ir.specs import PlanError, to_spec


def make_mesh(axes: dict[str, int], devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh of `axes` with Auto axis types over the first devices."""
    n = 1
    for s in axes.values():
        n *= s
    devices = list(devices if devices is not None else jax.devices())
    if len(devices) < n:
        raise ValueError(
            f"the mesh {axes} needs {n} devices but JAX sees {len(devices)}; on a CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} before JAX starts"
        )
    return jax.make_mesh(
        tuple(axes.values()),
        tuple(axes),
        axis_types=(AxisType.Auto,) * len(axes),
        devices=devices[:n],
    )


def plan_jit(plan, mesh: Mesh | None = None, *, donate: bool = False, constrain: bool = True):
    goal = plan.goal
    if goal is None:
        raise ValueError("this plan has no goal (it was read from JSON alone); pass goal=")
    prog = goal.program
    mesh = mesh or make_mesh(goal.mesh)

    def named(sharding) -> NamedSharding:
        return NamedSharding(mesh, to_spec(sharding))

    in_flat = [named(plan.input_tilings[p]) for p in prog.inputs]
    out_flat = [named(plan.output_tilings[p]) for p in prog.outputs]
    in_shardings = jax.tree_util.tree_unflatten(prog.in_tree, in_flat)
    out_shardings = jax.tree_util.tree_unflatten(prog.out_tree, out_flat)
    value_spec: Callable[[int], PartitionSpec] = lambda v: to_spec(plan.value_sharding(v))  # noqa: E731
    free = frozenset(free_values(prog))
    operand_specs = _operand_specs(plan, free) if constrain else None

    def fn(*args):
        flat = jax.tree_util.tree_leaves(args)
        closed = prog.jaxpr
        replay = _Replay(
            prog.eqn_outputs,
            mesh,
            value_spec,
            constrain,
            goal.honour_constraints,
            operand_specs,
            free,
        )
        outs = replay.run(closed.jaxpr, closed.consts, flat, ())
        return jax.tree_util.tree_unflatten(prog.out_tree, outs)

    donate_argnums: tuple[int, ...] = ()
    if donate:
        carried = {p.split("/", 1)[0] for p in prog.carried.values()}
        donate_argnums = tuple(i for i, n in enumerate(prog.arg_names) if n in carried)
    return jax.jit(
        fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums
    )


def _operand_specs(plan, free: frozenset[int]) -> Callable[[Any, tuple], dict[int, PartitionSpec]]:
    """For an equation (and its key), the specs its resharded operands take before it runs,
    by operand position: the execution sharding the cost model priced. Left to itself,
    XLA's partitioner may reshard an operand another way (e.g. over an idle mesh axis, with
    collective-permutes), and move more bytes than the plan says. Operands in `free` (made
    from constants alone) are left to XLA, which makes them in whatever sharding it reads."""
    goal = plan.goal
    prog, model = goal.program, goal.cost_model

    def specs(eqn, key: tuple) -> dict[int, PartitionSpec]:
        vids = prog.eqn_outputs.get(key)
        i = prog.producer[vids[0]] if vids else None
        if i is None:
            return {}
        op = prog.ops[i]
        if op.primitive != eqn.primitive.name or len(op.inputs) != len(eqn.invars):
            return {}
        wants = model.execution_shardings(i, plan.state)
        return {
            k: to_spec(wants[v]) for k, v in enumerate(op.inputs) if v in wants and v not in free
        }

    return specs


def _constrainable(x: Any) -> bool:
    """Whether `x` takes a sharding constraint: an array of rank >= 1, not a PRNG key."""
    return getattr(x, "ndim", 0) >= 1 and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)


class _Replay(JaxprWalker):
    """Runs a jaxpr equation by equation, constraining outputs to the plan's shardings:
    every equation's with `constrain_all`, else only the user's honoured constraints.
    `operand_specs` (see `_operand_specs`) also constrains operands that the plan
    reshards, to the sharding the equation runs in. Values in `free` are left to XLA,
    unless the user constrained them."""

    def __init__(
        self,
        eqn_outputs: dict[tuple, list[int]],
        mesh: Mesh,
        value_spec: Callable[[int], PartitionSpec],
        constrain_all: bool = True,
        honour_constraints: bool = True,
        operand_specs: Callable[[Any, tuple], dict[int, PartitionSpec]] | None = None,
        free: frozenset[int] = frozenset(),
    ) -> None:
        self.eqn_outputs = eqn_outputs
        self.free = free
        self.operand_specs = operand_specs
        self.mesh = mesh
        self.value_spec = value_spec
        self.constrain_all = constrain_all
        self.honour_constraints = honour_constraints

    def constrain(self, key: tuple, outs: list, eqn: Any = None) -> list:
        user = eqn is not None and eqn.primitive.name in CONSTRAINT_PRIMITIVES
        if not (self.constrain_all or (user and self.honour_constraints)):
            return outs
        vids = self.eqn_outputs.get(key)
        if vids is None:
            return outs
        res = []
        for x, v in zip(outs, vids):
            if _constrainable(x) and (user or v not in self.free):
                x = jax.lax.with_sharding_constraint(
                    x, NamedSharding(self.mesh, self.value_spec(v))
                )
            res.append(x)
        return res

    def equation(self, eqn, ins, key, **context: Any) -> list:
        outs = self._replay(eqn, ins, key)
        if not isinstance(outs, list | tuple):
            outs = [outs]
        return self.constrain(key, list(outs), eqn)

    def _replay(self, eqn, ins, key):
        name = eqn.primitive.name
        p = eqn.params
        if name in REMAT_CALLS:
            return self.remat(eqn, ins, key)
        if name in CUSTOM_CALLS:
            return self.custom(eqn, ins, key)
        if name == "shard_map":
            return self.shard_map(eqn, ins)
        inlined = inlined_jaxpr(eqn)
        if inlined is not None:
            return self.run(*inlined, ins, key)
        if name in CONSTRAINT_PRIMITIVES:  # the user's constraint: partir's takes its place
            return list(ins)
        if name == "scan":
            jaxpr, consts = open_jaxpr(p["jaxpr"])
            nc, nk = scan_counts(p)
            c, init, xs = ins[:nc], ins[nc : nc + nk], ins[nc + nk :]

            def body(carry, x):
                outs = self.run(jaxpr, consts, list(c) + list(carry) + list(x), key + (BODY,))
                return outs[:nk], outs[nk:]

            carry, ys = jax.lax.scan(
                body,
                list(init),
                list(xs),
                length=p["length"],
                reverse=p["reverse"],
                unroll=p["unroll"],
            )
            return list(carry) + list(ys)
        if name == "while":
            cj, cc = open_jaxpr(p["cond_jaxpr"])
            bj, bc = open_jaxpr(p["body_jaxpr"])
            nc, nb = p["cond_nconsts"], p["body_nconsts"]
            cconsts, bconsts, init = ins[:nc], ins[nc : nc + nb], ins[nc + nb :]

            def cond_fun(carry):
                return self.run(cj, cc, list(cconsts) + list(carry), key + (COND,))[0]

            def body_fun(carry):
                return self.run(bj, bc, list(bconsts) + list(carry), key + (BODY,))

            return list(jax.lax.while_loop(cond_fun, body_fun, list(init)))
        if name == "cond":
            branches = []
            for b, br in enumerate(p["branches"]):
                jaxpr, consts = open_jaxpr(br)

                def run_branch(*ops, _j=jaxpr, _c=consts, _b=b):
                    return self.run(_j, _c, list(ops), key + (_b,))

                branches.append(run_branch)
            return list(jax.lax.switch(ins[0], branches, *ins[1:]))
        if self.operand_specs is not None:
            for k, spec in self.operand_specs(eqn, key).items():
                if _constrainable(ins[k]):
                    ins[k] = jax.lax.with_sharding_constraint(
                        ins[k], NamedSharding(self.mesh, spec)
                    )
        out = eqn.primitive.bind(*ins, **p)
        return list(out) if eqn.primitive.multiple_results else [out]

    def remat(self, eqn, ins, key) -> list:
        """A checkpoint region, re-bound around its replayed body with the same policy,
        `prevent_cse` and `differentiated`: inlined, XLA's CSE merged the recompute back."""
        p = eqn.params
        jaxpr, consts = open_jaxpr(p["jaxpr"])
        body, body_consts = _trace(lambda *a: self.run(jaxpr, consts, list(a), key), eqn.invars)
        prevent_cse = p["prevent_cse"]
        if not isinstance(prevent_cse, bool):  # one flag per operand: the consts come first
            prevent_cse = (False,) * len(body_consts) + tuple(prevent_cse)
        params = {**p, "jaxpr": body, "prevent_cse": prevent_cse}
        return list(eqn.primitive.bind(*body_consts, *ins, **params))

    def custom(self, eqn, ins, key) -> list:
        """A custom_jvp / custom_vjp call, re-bound with its primal replayed and its own
        jvp (or fwd and bwd) rules kept: inlined, JAX differentiated the primal instead."""
        jaxpr, consts = open_jaxpr(eqn.params["call_jaxpr"])
        subfuns, params = _bind_params(eqn.primitive, eqn.params)
        primal = lu.wrap_init(
            lambda *a: self.run(jaxpr, consts, list(a), key), debug_info=subfuns[0].debug_info
        )
        return list(eqn.primitive.bind(*ins, subfuns=(primal, *subfuns[1:]), **params))

    def shard_map(self, eqn, ins) -> list:
        """The user's shard_map, re-bound on the plan's mesh with its own in/out specs; its
        body runs as written (its values are per-device: no plan sharding applies)."""
        p = eqn.params
        mesh = _shard_map_mesh(p["mesh"], self.mesh)
        subfuns, params = _bind_params(eqn.primitive, {**p, "mesh": mesh})
        return list(eqn.primitive.bind(*ins, subfuns=subfuns, **params))


REMAT_CALLS = ("checkpoint", "remat2")
CUSTOM_CALLS = ("custom_jvp_call", "custom_vjp_call")


def _trace(fn: Callable, invars: Sequence[Any]) -> tuple[Any, list]:
    """`fn` traced on the avals of `invars` into an open jaxpr whose leading invars are its
    constants, and those constants."""
    avals = [v.aval for v in invars]
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    closed = jax.make_jaxpr(fn)(*specs)
    return pe.convert_constvars_jaxpr(closed.jaxpr), list(closed.consts)


def _bind_params(primitive, params: dict) -> tuple[tuple, dict]:
    """(subfuns, params) to re-bind a call primitive of a jaxpr equation (as
    `jax.core.eval_jaxpr` does); jax 0.10 returns them as one dict."""
    got = primitive.get_bind_params(params)
    if isinstance(got, tuple):
        subfuns, bind = got
        return tuple(subfuns), dict(bind)
    bind = dict(got)
    return tuple(bind.pop("subfuns", ())), bind


def _shard_map_mesh(theirs: Any, ours: Mesh) -> Mesh:
    """The plan's mesh for a shard_map written on `theirs`: its body was traced for that
    mesh's axes (names, sizes and order), so the plan's mesh must have the same."""
    want, have = dict(theirs.shape), dict(ours.shape)
    if list(want.items()) != list(have.items()):
        raise PlanError(
            f"a shard_map in the program runs on the mesh {want}, but the goal mesh is "
            f"{have}; write the goal mesh as {want} (the same axes, sizes and order)"
        )
    return ours
