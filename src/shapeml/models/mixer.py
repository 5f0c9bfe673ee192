"""Deprecated alias of `shapeml.zoo.mixer`: the zoo moved out of the core. Import `shapeml.zoo.mixer`.

This module is replaced by that one on import, so both names give the same objects.
"""

import sys

from ..zoo import mixer as _moved

sys.modules[__name__] = _moved
