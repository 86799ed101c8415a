"""Path globs: `*` one element (or part of one), `**` any number; fast with many `**`."""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partir.ir.specs import glob_match


def _reference(pat: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Every way of giving each `**` some elements: the definition, slowly."""
    import fnmatch

    if not pat:
        return not parts
    if pat[0] == "**":
        return any(_reference(pat[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and _reference(pat[1:], parts[1:])


@pytest.mark.parametrize(
    ("pattern", "path", "want"),
    [
        ("params/**/scale", "params/layers/0/norm/scale", True),
        ("params/**/scale", "params/scale", True),
        ("**", "a/b/c", True),
        ("**/w_*", "a/b/w_in", True),
        ("a/*/c", "a/b/x/c", False),
        ("a/**/b/**/c", "a/x/b/y/z/c", True),
        ("a/**/b/**/c", "a/x/c", False),
    ],
)
def test_globs_match_as_documented(pattern, path, want):
    assert glob_match(pattern, path) is want


ELEMENTS = st.sampled_from(["a", "b", "w_in", "0", "1"])
PATTERN_ELEMENTS = st.sampled_from(["a", "b", "*", "**", "w_*", "?", "0"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(PATTERN_ELEMENTS, min_size=1, max_size=6), st.lists(ELEMENTS, min_size=1, max_size=7)
)
def test_globs_agree_with_the_definition(pattern, parts):
    assert glob_match("/".join(pattern), "/".join(parts)) == _reference(
        tuple(pattern), tuple(parts)
    )


def test_many_double_stars_take_linear_time():
    pattern = "/".join(itertools.repeat("**", 16)) + "/nothing"  # a 50-character line
    path = "/".join(f"layers/{i}/mlp" for i in range(30))
    start = time.perf_counter()
    assert not glob_match(pattern, path)
    assert glob_match(pattern[: -len("nothing")] + "mlp", path)
    assert time.perf_counter() - start < 0.5
