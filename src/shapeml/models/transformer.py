"""Deprecated alias of `shapeml.zoo.transformer`: the zoo moved out of the core. Import `shapeml.zoo.transformer`.

This module is replaced by that one on import, so both names give the same objects.
"""

import sys

from ..zoo import transformer as _moved

sys.modules[__name__] = _moved
