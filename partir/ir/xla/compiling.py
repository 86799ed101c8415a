"""Compiling a sharded jitted function and reading back what XLA produced."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from partir.ir.xla.buffers import BufferPeak, compile_with_buffer_peak
from partir.ir.xla.flops import hlo_bytes_accessed, hlo_flops
from partir.ir.xla.hlo import _parse_collectives, optimized_hlo_text
from partir.ir.xla.stats import CompiledStats

_log = logging.getLogger(__name__)


def _abstract(x: Any, keep_sharding: bool):
    import jax
    import numpy as np

    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        sharding = getattr(x, "sharding", None) if keep_sharding else None
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            sharding = None
        return jax.ShapeDtypeStruct(
            tuple(x.shape), x.dtype, sharding=sharding, weak_type=getattr(x, "weak_type", False)
        )
    a = np.asarray(x)
    return jax.ShapeDtypeStruct(a.shape, jax.dtypes.canonicalize_dtype(a.dtype), weak_type=True)


def stats_of_compiled(compiled, buffer_peak: BufferPeak | None = None) -> CompiledStats:
    """Collectives, per-device memory and flops of a ``jax.stages.Compiled``.

    ``buffer_peak`` (from :func:`compile_with_buffer_peak`) fills ``true_peak_bytes``.
    """
    text = optimized_hlo_text(compiled)
    collectives, notes = _parse_collectives(text)
    mem = compiled.memory_analysis()

    def m(attr: str) -> int:
        return int(getattr(mem, attr, 0) or 0) if mem is not None else 0

    flops: float | None = None
    accessed: float | None = None
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, list | tuple):
            cost = cost[0] if cost else None
        if cost and "flops" in cost:
            flops = float(cost["flops"])
        if cost and "bytes accessed" in cost:
            accessed = float(cost["bytes accessed"])
    except Exception as e:  # pragma: no cover - backend dependent
        _log.debug("cost_analysis failed: %s", e)
    step_flops = None
    if flops is not None:
        once, per_step = hlo_flops(text)
        step_flops = flops + (per_step - once)
    step_bytes = None
    if accessed is not None:
        once, per_step = hlo_bytes_accessed(text)
        step_bytes = accessed + (per_step - once)
    return CompiledStats(
        collectives=collectives,
        argument_bytes=m("argument_size_in_bytes"),
        output_bytes=m("output_size_in_bytes"),
        temp_bytes=m("temp_size_in_bytes"),
        alias_bytes=m("alias_size_in_bytes"),
        peak_bytes=m("peak_memory_in_bytes"),
        flops=flops,
        notes=tuple(notes),
        true_peak_bytes=None if buffer_peak is None else buffer_peak.bytes,
        step_flops=step_flops,
        bytes_accessed=accessed,
        step_bytes_accessed=step_bytes,
    )


def compile_stats(
    fn: Callable,
    args: Sequence[Any],
    in_shardings: Any,
    out_shardings: Any,
    *,
    donate_argnums: int | Sequence[int] = (),
    mesh=None,
) -> CompiledStats:
    """Compile ``fn`` for ``args`` (arrays or ShapeDtypeStruct pytrees) and read back stats.

    Arguments become ``jax.ShapeDtypeStruct`` so nothing is allocated. ``in_shardings`` /
    ``out_shardings`` are pytrees of ``NamedSharding`` (entries may be None), or None to let
    XLA choose. ``mesh``, if given, is set with ``jax.set_mesh`` while lowering, so bare
    ``PartitionSpec`` shardings also work.
    """
    import contextlib

    import jax

    abstract = jax.tree.map(
        lambda x: _abstract(x, keep_sharding=in_shardings is None),
        tuple(args),
        is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct),
    )
    if isinstance(in_shardings, list):  # one entry per argument, as jit wants a tuple
        in_shardings = tuple(in_shardings)
    kwargs: dict[str, Any] = {"donate_argnums": donate_argnums}
    if in_shardings is not None:
        kwargs["in_shardings"] = in_shardings
    if out_shardings is not None:
        kwargs["out_shardings"] = out_shardings
    ctx = jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
    with ctx:
        lowered = jax.jit(fn, **kwargs).lower(*abstract)
    compiled, peak = compile_with_buffer_peak(lowered)
    return stats_of_compiled(compiled, peak)
