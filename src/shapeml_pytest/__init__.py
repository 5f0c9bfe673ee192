"""shapeml's pytest plugin (registered by entry point): the `shape_contract` fixture and marker.

It imports shapeml lazily, so jaxtyping's pytest import hook still instruments shapeml when both
plugins are active.
"""

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "shape_contract: checks a function's shape contract (select with -m shape_contract)",
    )


@pytest.fixture
def shape_contract():
    """`shapeml.testing.check_contract`, for tests that pin a model's shapes."""
    from shapeml.testing import check_contract

    return check_contract
