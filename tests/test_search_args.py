"""`Search()` refuses meaningless options when it is made, not at solve time."""

from __future__ import annotations

import numpy as np
import pytest

from partir.goal import Search


@pytest.mark.parametrize(
    "kwargs",
    [
        {"seed": 1.5},
        {"seed": "0"},
        {"seed": True},
        {"seed": None},
        {"patience": 0},
        {"patience": -3},
        {"patience": 2.5},
        {"patience": True},
        {"uct_c": float("nan")},
        {"uct_c": float("inf")},
        {"uct_c": -0.1},
        {"uct_c": "1.4"},
        {"uct_c": True},
        {"proxy": "yes"},
        {"proxy": 1},
    ],
    ids=repr,
)
def test_meaningless_search_options_are_refused_at_once(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        Search(**kwargs)


def test_meaningful_search_options_are_kept():
    s = Search(seed=np.int64(-7), patience=None, uct_c=0, proxy=False)
    assert (s.seed, s.patience, s.uct_c, s.proxy) == (-7, None, 0, False)
    assert Search(patience=1, uct_c=2.5).uct_c == 2.5
