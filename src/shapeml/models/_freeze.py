"""`freeze`: a model whose params are held but never trained, as if each were declared a buffer:
no gradient, no optimizer state, no update. The pretrained base of a LoRA model is one."""

from __future__ import annotations

import typing

from .._traceback import api_boundary
from .._validate import instance
from ._model import Model
from ._stacked import is_stacked

__all__ = ["freeze", "frozen_copy"]


def frozen_copy(m: Model, frozen: bool = True) -> Model:
    """`m` itself (not its sub-models) with its own params frozen (or unfrozen)."""
    if m._frozen is frozen:
        return m
    new = object.__new__(type(m))
    new.__dict__.update(m.__dict__)
    object.__setattr__(new, "_frozen", frozen)
    return new


def _map(m: Model, fn) -> Model:
    """`fn` applied to every model of the tree under `m`, children first."""
    changes = {}
    for name, spec in type(m).__shapeml_fields__.items():
        value = getattr(m, name)
        if spec.kind == "submodel" or (spec.kind == "submodels" and is_stacked(spec, value)):
            changes[name] = _map(value, fn)
        elif spec.kind == "submodels":
            changes[name] = tuple(_map(child, fn) for child in value)
    new = object.__new__(type(m))
    new.__dict__.update(m.__dict__)
    for name, value in changes.items():
        object.__setattr__(new, name, value)
    return fn(new)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def freeze(m: Model, frozen: bool = True) -> Model:
    """`m` with every param of it and its sub-models frozen: held and saved like a buffer, so
    `sm.value_and_grad`, the optimizers and `TrainStep` leave it out (no gradient, no optimizer
    state), and training never changes it. The values are the same arrays; `freeze(m, False)`
    makes every param trainable again.

    Args:
        m: the model.
        frozen: False to unfreeze.

    Returns:
        The frozen (or unfrozen) model, of the same class and dims.

    Example:
        >>> base = sm.models.freeze(llama.from_hf("ckpt/"))
        >>> sm.params(base)
        {}
    """
    instance("m", m, Model, "an sm.Model")
    instance("frozen", frozen, bool, "True or False")
    return _map(m, lambda x: frozen_copy(x, frozen))
