"""Meshes: {axis name: size} with a bounded number of devices."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

AXIS_NAMES = ("x", "y", "z", "data", "model", "expert")
MESH_SIZES = (2, 1, 4, 8)  # shrinks towards 2: the smallest axis that shards anything

# ------------------------------------------------------------------------------ meshes


def meshes(
    max_axes: int = 3,
    max_devices: int = 8,
    *,
    min_axes: int = 1,
    names: Sequence[str] = AXIS_NAMES,
    sizes: Sequence[int] = MESH_SIZES,
) -> st.SearchStrategy[dict[str, int]]:
    """{axis name: size}: `min_axes` to `max_axes` axes with distinct names from `names`,
    sizes from `sizes` (1, 2, 4, 8), whose product is at most `max_devices` (fewer than
    `max_axes` axes when the sizes leave no room for more)."""
    if not 1 <= min_axes <= max_axes <= len(names):
        raise ValueError(f"need 1 <= min_axes <= max_axes <= {len(names)} (the names)")
    if max_devices < 1 or not sizes or min(sizes) < 1 or min(sizes) ** min_axes > max_devices:
        raise ValueError(
            f"{min_axes} axes of sizes {tuple(sizes)} do not fit max_devices={max_devices}"
        )

    @st.composite
    def draw_mesh(draw) -> dict[str, int]:
        n = draw(st.integers(min_axes, max_axes))
        order = draw(st.permutations(list(names)))
        mesh, budget, smallest = {}, max_devices, min(sizes)
        for k, name in enumerate(order[:n]):
            needed = smallest ** max(0, min_axes - k - 1)  # room for the axes still owed
            fits = [s for s in sizes if s * needed <= budget]
            if not fits:
                break
            size = draw(st.sampled_from(fits))
            mesh[name] = size
            budget //= size
        return mesh

    return draw_mesh()
