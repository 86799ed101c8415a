"""Each strategy class owns its meaning: its arguments, its conflicts, its constraints."""

from __future__ import annotations

import pytest

from partir import strategies as S
from partir.strategies.base import conflict


def test_catalog_is_made_of_the_classes():
    assert list(S.CATALOG) == ["batch", "zero", "fsdp", "megatron", "expert", "auto"]
    assert S.CATALOG["zero"].arguments == ("stage",)
    assert S.CATALOG["batch"].arguments == ("inputs",)
    assert S.CATALOG["megatron"].arguments == ()


def test_arguments_are_checked_by_their_class():
    assert S.Zero.check_argument("stage", 2) == 2
    with pytest.raises(ValueError, match="zero stage must be 1, 2 or 3, not 4"):
        S.zero("a", stage=4)
    with pytest.raises(ValueError, match="not true"):
        S.Zero.check_argument("stage", True, show=lambda v: str(v).lower())
    assert S.Batch.check_argument("inputs", "batch/*") == ("batch/*",)
    with pytest.raises(ValueError, match="a path glob or a list of them"):
        S.Batch.check_argument("inputs", [])


def test_conflicts_say_what_to_change():
    why = conflict([S.batch("a"), S.megatron("a")])
    assert why is not None and "different mesh axes" in why
    assert conflict([S.megatron("a"), S.fsdp("a")]) is not None
    twice = conflict([S.zero("a", 1), S.zero("a", 3)])
    assert twice is not None and "twice" in twice and "'a'" in twice
    assert conflict([S.batch("a"), S.zero("a")]) is None
    assert conflict([S.tile("x", 0, "a"), S.tile("y", 1, "a")]) is None
    assert conflict([S.replicate("x", "a"), S.replicate("y", "a")]) is None
