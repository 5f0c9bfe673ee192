"""Suite-wide settings: strict numerics (no silent rank promotion) and a key fixture."""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jax.random.key(0)


# The slowest files (notebooks, multi-device subprocesses, the site build) are started first, so
# that under `-n 2` the many quick tests fill in around them instead of leaving one worker idle
# at the end of the run.
_SLOW_FIRST = (
    "test_multiprocess.py",
    "test_tutorials.py",
    "test_sharding.py",
    "test_int8_tp.py",
    "test_site.py",
    "test_examples.py",
    "test_training.py",
    "test_readme.py",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return _SLOW_FIRST.index(name) if name in _SLOW_FIRST else len(_SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within each file is kept
