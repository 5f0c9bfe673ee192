"""Suite-wide settings: strict numerics (no silent rank promotion), a key fixture, and how `-n 2`
spreads the tests over its workers."""

import os
from pathlib import Path

from _forced_devices import FAST_COMPILE

# XLA's cheaper CPU compile for the suite's own programs, set before JAX starts its backend: the
# programs are small, so compiling them is most of the suite's time (about half less with it);
# what they compute is the same HLO. The benchmarks run with XLA's defaults.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

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
    "test_sharding_explicit.py",
    "test_sharding.py",
    "test_soak.py",
    "test_int8_tp.py",
    "test_site.py",
    "test_examples.py",
    "test_training.py",
    "test_readme.py",
    "test_deep_options.py",
    "test_lora.py",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        name = item.path.name
        return _SLOW_FIRST.index(name) if name in _SLOW_FIRST else len(_SLOW_FIRST)

    items.sort(key=rank)  # stable: the order within each file is kept


# A module with a module-scoped fixture (a multi-device subprocess, a built site, a trained model)
# runs on one worker, so the fixture is built once rather than once per worker; every other test
# is spread on its own, in the order above. (xdist's own `xdist_group` mark does not take effect
# under pytest 9.2, which no longer reads the node id xdist rewrites.)
_SHARED_FIXTURE_MODULES = frozenset(
    p.name
    for p in Path(__file__).parent.glob("test_*.py")
    if 'scope="module"' in p.read_text(encoding="utf-8")
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown without it
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleWhereShared(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in _SHARED_FIXTURE_MODULES else nodeid

    return ByModuleWhereShared(config, log)
