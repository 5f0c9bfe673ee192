"""Deprecated alias of `shapeml.zoo.spotter`: the zoo moved out of the core. Import `shapeml.zoo.spotter`.

This module is replaced by that one on import, so both names give the same objects.
"""

import sys

from ..zoo import spotter as _moved

sys.modules[__name__] = _moved
