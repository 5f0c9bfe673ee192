"""The one shell for stateful compiled steps (`Shell`): a pure step, compiled as one donated
`jax.jit` program, and the values it carries between calls."""

from ._inputs import StepInputError as StepInputError
from ._program import CarryChangedError as CarryChangedError
from ._shell import Shell as Shell
