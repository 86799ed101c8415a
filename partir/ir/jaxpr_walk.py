"""One way to walk a jaxpr, shared by the tracer (`ir/program.py`, which builds partir's
program from it) and plan.jit's replay (`solver/jit.py`, which runs it again with the plan's
shardings).

The two must agree on which equation is which: the replay looks up, by key, the value ids the
tracer gave each equation's outputs. The key of an equation is its position in the nest of
jaxprs: `prefix + (index,)`, where the prefix of a jaxpr inlined from a call (`INLINED_CALLS`,
remat) is the key of the calling equation, and that of a loop body, a while condition or a
cond branch is the key of its equation followed by `BODY`, `COND` or the branch's index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.extend as jex

BODY, COND = "body", "cond"

# call primitives whose jaxpr the program inlines, and the parameter that holds it
INLINED_CALLS = {
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr",
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "remat2": "jaxpr",
}


def expand_high_primitives(closed: Any) -> Any:
    """`closed` (a ClosedJaxpr) with JAX's higher-level primitives expanded into the
    primitives they are built of, as `jax.jit` does before it compiles: jax >= 0.12 stages a
    few `jnp` functions (frexp, ldexp, histogram, ...) as one `call_hi_primitive`, which has
    no sharding rule. Unused equations are dropped on the way (JAX's dead-code pass).
    Unchanged when there are none, and on jax versions that have none."""
    if not getattr(closed.jaxpr, "is_high", False):
        return closed
    from jax._src.interpreters import partial_eval as pe

    return pe.lower_jaxpr2(closed)


def open_jaxpr(j: Any) -> tuple[Any, Sequence[Any]]:
    """(Jaxpr, consts) of a Jaxpr or ClosedJaxpr."""
    if isinstance(j, jex.core.ClosedJaxpr):
        return j.jaxpr, j.consts
    return j, ()


def inlined_jaxpr(eqn: Any) -> tuple[Any, Sequence[Any]] | None:
    """(Jaxpr, consts) that a call equation inlines, or None if it is no such call."""
    name = eqn.primitive.name
    if name not in INLINED_CALLS:
        return None
    inner = eqn.params.get(INLINED_CALLS[name])
    if inner is None:
        inner = next(iter(jex.core.jaxprs_in_params(eqn.params)), None)
    return None if inner is None else open_jaxpr(inner)


def scan_counts(params: dict[str, Any]) -> tuple[int, int]:
    """(constants, carried values) of a scan equation: the leading operands of its body.

    jax < 0.11 names them num_consts/num_carry; jax 0.11 packs the operand tree as ft_in
    (constants, carry, xs)."""
    if "num_consts" in params:
        return params["num_consts"], params["num_carry"]
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts.vals)), len(list(carry.vals))


class JaxprWalker:
    """Visits a jaxpr's equations in order with their operands, binding each equation's
    outputs for the equations after it. A subclass says what an equation does
    (`equation`), and what a constant, a literal and a result of the jaxpr are; `context`
    passes through to `equation` untouched (the tracer's loop multiplicity and scope)."""

    def run(
        self,
        jaxpr: Any,
        consts: Sequence[Any],
        args: Sequence[Any],
        prefix: tuple = (),
        **context: Any,
    ) -> list:
        env: dict[Any, Any] = {}
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.constant(c)
        for var, a in zip(jaxpr.invars, args):
            env[var] = a

        def read(atom: Any) -> Any:
            return self.literal(atom) if isinstance(atom, jex.core.Literal) else env[atom]

        for n, eqn in enumerate(jaxpr.eqns):
            key = prefix + (n,)
            outs = self.equation(eqn, [read(a) for a in eqn.invars], key, **context)
            for var, x in zip(eqn.outvars, outs):
                env[var] = x
        return [self.result(read(atom), atom) for atom in jaxpr.outvars]

    def equation(self, eqn: Any, ins: list, key: tuple, **context: Any) -> list:
        """The outputs of `eqn` on operands `ins`; `key` names it (module docstring)."""
        raise NotImplementedError

    def constant(self, c: Any) -> Any:
        return c

    def literal(self, atom: Any) -> Any:
        return atom.val

    def result(self, x: Any, atom: Any) -> Any:
        return x
