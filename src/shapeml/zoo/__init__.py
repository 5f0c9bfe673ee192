"""The model zoo: complete models built on the core (`sm.Model`, `shapeml.state`), used by the
demo jobs in `shapeml.apps` and by the tutorials. The core never imports this package."""

from . import gpt2 as gpt2
from . import mixer as mixer
from . import spotter as spotter
from . import transformer as transformer

__all__ = ["gpt2", "mixer", "spotter", "transformer"]
