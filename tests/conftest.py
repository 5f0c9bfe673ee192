"""Suite-wide settings: strict numerics (no silent rank promotion) and a key fixture."""

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def key():
    return jax.random.key(0)
