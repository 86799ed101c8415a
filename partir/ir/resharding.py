"""Resharding: the collectives that turn one sharding of a value into another, and the size
of a value's tile on each device. The cost model prices every reshard with these."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from partir.ir.propagate import Axes, Sharding


def local_size(shape, sharding: Sequence[Axes], mesh: Mapping[str, int]) -> int:
    n = math.prod(shape)
    for axes in sharding:
        for a in axes:
            n //= mesh[a]
    return n


def reshard(shape, itemsize: int, src: Sharding, dst: Sharding, mesh) -> list:
    """Collectives that turn `src` into `dst`: gather the axes `dst` drops, all-to-all the
    axes that move to another dim, then slice locally (free); where every dim is cut into
    as many tiles on both sides, one collective-permute. Axes of size 1 cut nothing: they
    are left out before comparing."""
    if src == dst:
        return []
    src, dst = _cutting(src, mesh), _cutting(dst, mesh)
    if src == dst:
        return []
    cuts = [
        (math.prod(mesh[a] for a in s), math.prod(mesh[a] for a in t)) for s, t in zip(src, dst)
    ]
    if all(a == b for a, b in cuts):
        # the same tiles on other devices (a dim cut on x re-cut on y of x's size): XLA
        # sends each device's tile where it is needed, one collective-permute
        moved = [a for s, t in zip(src, dst) if s != t for a in (*s, *t)]
        return [
            (
                "collective-permute",
                tuple(dict.fromkeys(moved)),
                local_size(shape, src, mesh) * itemsize,
            )
        ]
    where = {a: d for d, axes in enumerate(dst) for a in axes}
    kept: list[Axes] = []
    moving: list[tuple[str, int]] = []
    for d, (s, t) in enumerate(zip(src, dst)):
        k = 0
        while k < len(s) and k < len(t) and s[k] == t[k]:
            k += 1
        kept.append(s[:k])
        moving += [(a, d) for a in s[k:]]
    if not moving:
        return []
    gather = tuple(a for a, _ in moving if a not in where)
    move = [(a, d) for a, d in moving if a in where]
    out = []
    if gather:
        after = [k + tuple(a for a, dd in move if dd == d) for d, k in enumerate(kept)]
        out.append(("all-gather", gather, local_size(shape, after, mesh) * itemsize))
    if move:
        after = [k + tuple(a for a, dd in move if dd == d) for d, k in enumerate(kept)]
        out.append(
            ("all-to-all", tuple(a for a, _ in move), local_size(shape, after, mesh) * itemsize)
        )
    return out


def _cutting(sharding: Sharding, mesh) -> Sharding:
    """`sharding` without its mesh axes of size 1."""
    return tuple(tuple(a for a in axes if mesh[a] > 1) for axes in sharding)
