"""Pausing Python's cyclic garbage collector around work that allocates many small,
acyclic objects (propagating and costing a program of 10^4-10^5 ops).

A traced program keeps a large heap alive (jaxprs, values, ops). Every full collection
walks all of it, and allocating tuples by the million triggers many: on a 45k-op program
they took three quarters of building the propagator. Reference counting still frees
everything these loops drop; cycles made meanwhile are collected once the pause ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-entrant; restores its state)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
