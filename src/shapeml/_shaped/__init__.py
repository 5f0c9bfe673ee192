"""`@sm.shaped`: shape-checked functions (the decorator, the array-likes it accepts, the report a
failed check prints)."""

from ._check import ShapeCheckError as ShapeCheckError
from ._check import shaped as shaped
