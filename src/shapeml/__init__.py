"""shapeml: models whose every tensor has a declared, checked shape, on JAX.

This file only re-exports the public API; each name lives in the module its folder suggests.
"""

from ._errors import ShapemlError as ShapemlError
from ._errors import ShapemlWarning as ShapemlWarning
from ._errors import explain as explain
from ._version import __version__ as __version__

# --- models (foundation): shapeml.models ---

# --- gradients and optimizers: shapeml._grad, shapeml.optim ---

# --- weights and device-resident state: shapeml.state ---

# --- hoisting: shapeml.hoisting ---

# --- int8 transformer: shapeml.int8 ---
