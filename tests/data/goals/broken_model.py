"""A program module that cannot be imported, for tests/test_dsl.py."""

import partir_no_such_dependency  # noqa: F401


def train_step(params):
    return params
