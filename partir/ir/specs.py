"""PartitionSpecs, partir shardings and path globs.

A partir sharding is a tuple with one tuple of mesh axes per dim (major first); a
`PartitionSpec` entry is None, an axis name, or a tuple of names. Globs match `/`-joined
paths: `*` one element (or part of one, as in `w_*`), `**` any number of elements.
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

from jax.sharding import PartitionSpec

from partir.ir.messages import did_you_mean
from partir.ir.propagate import Sharding


class PlanError(ValueError):
    """A plan or spec that cannot apply to the program: the message names the place."""

    keys: tuple[str, ...] = ()  # in a plan file: the JSON keys that lead to the place


def to_sharding(spec: PartitionSpec | Iterable | None, rank: int) -> Sharding:
    entries = tuple(spec) if spec is not None else ()
    if len(entries) > rank:
        raise PlanError(f"spec {spec} has {len(entries)} entries for a value of rank {rank}")
    out: list[tuple[str, ...]] = []
    for e in entries + (None,) * (rank - len(entries)):
        if e is None:
            out.append(())
        elif isinstance(e, str):
            out.append((e,))
        else:
            out.append(tuple(e))
    return tuple(out)


def to_spec(sharding: Sharding) -> PartitionSpec:
    entries = [
        None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in sharding
    ]
    return PartitionSpec(*entries)


def spec_to_json(sharding: Sharding) -> list:
    return [None if not axes else axes[0] if len(axes) == 1 else list(axes) for axes in sharding]


def spec_from_json(entries: list) -> Sharding:
    return to_sharding(
        PartitionSpec(*[tuple(e) if isinstance(e, list) else e for e in entries]), len(entries)
    )


@functools.lru_cache(maxsize=4096)
def _split(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.strip("/").split("/"))


def glob_match(pattern: str, path: str) -> bool:
    """Whether `path` matches `pattern` (`*` one element, `**` any number)."""
    return _match(_split(pattern), tuple(path.split("/")))


def _match(pat: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """One pass over the path, keeping the set of pattern positions reached: time
    len(path) x len(pattern) whatever the number of `**` (trying every split of the path
    for each `**` in turn was exponential in their number)."""
    n = len(pat)

    def closure(positions: set[int]) -> set[int]:  # a `**` may match no element
        out, todo = set(positions), list(positions)
        while todo:
            i = todo.pop()
            if i < n and pat[i] == "**" and i + 1 not in out:
                out.add(i + 1)
                todo.append(i + 1)
        return out

    reached = closure({0})
    for part in parts:
        step = set()
        for i in reached:
            if i == n:
                continue
            if pat[i] == "**":
                step.add(i)
            elif fnmatch.fnmatchcase(part, pat[i]):
                step.add(i + 1)
        reached = closure(step)
        if not reached:
            return False
    return n in reached


V = TypeVar("V")


def resolve(rules: Mapping[str, V], paths: Iterable[str], *, strict: bool = True) -> dict[str, V]:
    """{path: value} for the paths some rule matches; the first matching rule wins.

    With `strict`, a rule that matches no path is an error that names the closest paths.
    """
    paths = list(paths)
    patterns = list(rules)
    order = {pattern: k for k, pattern in enumerate(patterns)}
    globs = [(k, p) for p, k in order.items() if any(c in p for c in "*?[")]
    out: dict[str, V] = {}
    hits = dict.fromkeys(rules, 0)
    for path in paths:
        best = order.get(path, len(order))
        for k, pattern in globs:
            if k >= best:
                break
            if glob_match(pattern, path):
                best = k
                break
        if best < len(order):
            pattern = patterns[best]
            out[path] = rules[pattern]
            hits[pattern] += 1
    if strict:
        for pattern, n in hits.items():
            if n == 0 and not any(glob_match(pattern, p) for p in paths):
                raise PlanError(f"no input matches {pattern!r}{did_you_mean(pattern, paths)}")
    return out


def check_sharding(path: str, shape, sharding: Sharding, mesh: Mapping[str, int]) -> None:
    """Raise PlanError unless every axis exists, appears once, and divides its dim."""
    seen: set[str] = set()
    for d, axes in enumerate(sharding):
        for a in axes:
            if a not in mesh:
                raise PlanError(
                    f"{path}: mesh axis {a!r} is not in the mesh {dict(mesh)}"
                    f"{did_you_mean(a, mesh)}"
                )
            if a in seen:
                raise PlanError(f"{path}: mesh axis {a!r} is used twice in {to_spec(sharding)}")
            seen.add(a)
        n = math.prod(mesh[a] for a in axes)
        if shape[d] % n:
            raise PlanError(
                f"{path}: dim {d} of size {shape[d]} is not divisible by {n} "
                f"(mesh axes {axes}); choose axes whose sizes divide it or leave it replicated"
            )
