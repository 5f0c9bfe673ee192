"""`sm.Model`: an immutable equinox module whose fields are declared params, buffers and sub-models.

Shapes are checked whenever a model is built from arrays (`init`, direct construction, `replace`,
`load`), never when JAX rebuilds it from leaves inside a transformation, so checks cost nothing per
step under `jax.jit`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._errors import ArgumentTypeError, ShapemlError, similar
from .._traceback import api_boundary
from .._validate import shorten
from ._annotations import read_declarations
from ._checks import check_fields, dims_str, key_of, statics_of
from ._dims import Dims, DimsError
from ._fields import FieldDeclarationError, FieldSpec
from ._initializers import resolve_init
from ._limits import check_size, max_bytes_of
from ._mapped import Mapped, child_dims, map_model
from ._repr import repr_html, repr_lines
from ._statics import check_static

__all__ = [
    "FrozenModelError",
    "Model",
    "ShapeMismatchError",
    "UnknownFieldError",
    "field_hash",
]


class UnknownFieldError(
    ShapemlError,
    AttributeError,
    code="E0901",
    title="no such field",
    explanation="""
Code read, replaced or passed a field that the model does not declare. Field names are
case-sensitive; the message lists the model's fields and, when one is close, suggests it:

    m.W                   # E0901: `M` has no field `W`; a field with a similar name exists: `w`
    m.replace(W=...)      # same error
    M(dims=..., W=...)    # same error

Fields of sub-models use dotted names in name-based APIs (`blocks.0.w1`).
""",
):
    pass


class ShapeMismatchError(
    ShapemlError,
    ValueError,
    code="E0902",
    title="shape or dtype mismatch",
    explanation="""
A model was built from tensors whose shapes or dtypes differ from the field declarations. Every
mismatch is listed at once, each with the declared shape in dims and in numbers:

    tw1: expected [L N Dt] = [2 16 64] float32, got [2 16 32] float32

Check the dims the model was built with (`m.dims`), or override them: `Spotter.init(seed=0, Dt=32)`.
Numpy arrays are converted to the declared dtype when only the precision differs (float64 ->
float32); JAX arrays must have the declared dtype.
""",
):
    pass


class FrozenModelError(
    ShapemlError,
    dataclasses.FrozenInstanceError,
    code="E1102",
    title="models are immutable",
    explanation="""
A field of a model was assigned (`m.w_h = m.w_h * 0.0`). Models are immutable values, so JAX
transformations and caches can rely on them; a change makes a new model:

    m = m.replace(w_h=m.w_h * 0.0)

A training step returns the new model and optimizer state: `m, opt = optim.update(m, opt, g)`.
""",
):
    pass


def field_hash(name: str) -> int:
    """A stable 31-bit hash of a dotted field name (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") & 0x7FFFFFFF


class _DimsAccess:
    """`Model.dims` is the class's declaration; `m.dims` is the instance's resolved dims."""

    def __get__(self, obj, cls):
        if obj is None:
            return cls.__dict__.get("__dims_decl__", Dims())
        return obj._dims


class _ModelType(type(eqx.Module)):
    """`Model`'s metaclass, equinox's with its call an API boundary: an error building a model
    (`Head(dims=..., W=...)`) shows without the frame equinox's metaclass adds around `__init__`."""

    __call__ = api_boundary(type(eqx.Module).__call__)


@api_boundary
class Model(eqx.Module, metaclass=_ModelType):
    """Base class of shapeml models: subclass it, declare `dims` and fields.

    Example:
        >>> class Head(sm.Model):
        ...     dims = sm.Dims(D=32, C=4)
        ...     w: Float[Array, "D C"] = sm.param(sm.normal(std=0.18))
        >>> m = Head.init(seed=0, D=8)
        >>> m.w.shape, m.dims.D
        ((8, 4), 8)
    """

    _dims: Dims = eqx.field(static=True)
    # True for a frozen instance (`freeze`): its own params count as buffers, never trained.
    _frozen: bool = eqx.field(static=True)
    dims = _DimsAccess()
    __shapeml_fields__: ClassVar[dict[str, FieldSpec]] = {}
    # Static configuration fields (`sm.static()`): name -> default (`dataclasses.MISSING` if none).
    __shapeml_statics__: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        decl = cls.__dict__.get("dims")
        if decl is not None:
            if not isinstance(decl, Dims):
                raise DimsError(
                    f"`{cls.__name__}.dims` is {decl!r}, not an sm.Dims",
                    fix=f"declare `dims = sm.Dims(D=32, ...)` in `{cls.__name__}`",
                )
            type.__delattr__(cls, "dims")
        else:
            decl = next(
                (b.__dims_decl__ for b in cls.__mro__[1:] if "__dims_decl__" in vars(b)), Dims()
            )
        cls.__dims_decl__ = decl
        fields, statics = read_declarations(
            cls, decl, cls.__shapeml_fields__, cls.__shapeml_statics__
        )
        cls.__shapeml_fields__ = fields
        cls.__shapeml_statics__ = statics

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(self, *, dims: Dims | Mapping[str, int] | None = None, **values: Any):
        cls = type(self)
        object.__setattr__(self, "_frozen", False)
        specs = cls.__shapeml_fields__
        decl: Dims = cls.dims
        if dims is None:
            dims = decl
        elif isinstance(dims, Mapping) and not isinstance(dims, Dims):
            if not all(isinstance(k, str) for k in dims):
                raise ArgumentTypeError(
                    f"`dims` of `{cls.__name__}` must be named by str, got {shorten(dict(dims))}",
                    fix=f"pass dims={{'D': 32}} or dims={cls.__name__}.dims.resolve(D=32)",
                )
            dims = decl.resolve(**dict(dims))
        elif not isinstance(dims, Dims):
            raise ArgumentTypeError(
                f"`dims` of `{cls.__name__}` must be an sm.Dims or a mapping, got "
                f"{shorten(dims)} ({type(dims).__name__})",
                fix=f"pass dims={cls.__name__}.dims.resolve(D=32), or leave it out",
            )
        elif dims.declarations().keys() != decl.declarations().keys():
            raise DimsError(
                f"`{cls.__name__}` declares dims {list(decl)}, but was given {list(dims)}",
                fix=f"pass dims=`{cls.__name__}.dims.resolve(...)`",
            )
        statics = cls.__shapeml_statics__
        unknown = [k for k in values if k not in specs and k not in statics]
        if unknown:
            known = [*specs, *statics]
            raise UnknownFieldError(
                f"`{cls.__name__}` has no field {', '.join(f'`{k}`' for k in unknown)} "
                f"(fields: {', '.join(known) or 'none'})",
                fix=similar(unknown[0], known),
            )
        own: dict[str, Any] = {}
        problems: list[str] = []
        for name, default in statics.items():
            value = values.get(name, default)
            if value is dataclasses.MISSING:
                problems.append(f"{name}: missing (static configuration, no default)")
                continue
            own[name] = check_static(cls.__name__, name, value)
            object.__setattr__(self, name, own[name])
        stored, more = check_fields(cls, dims, values, own)
        for name, value in stored.items():
            object.__setattr__(self, name, value)
        problems += more
        if problems:
            raise ShapeMismatchError(
                f"`{cls.__name__}` ({dims_str(dims)}) was given {len(problems)} field(s) that do "
                "not match their declarations:\n    " + "\n    ".join(problems),
                fix="check the dims the model was built with, or build it with the dims that "
                "match: e.g. `init(seed=0, D=64)`"
                + (
                    "; an optional tensor is None exactly when the model's options make it absent"
                    if any(": absent (" in p or ": None given" in p for p in problems)
                    else ""
                ),
            )
        object.__setattr__(self, "_dims", dims)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(cls, seed: int | jax.Array = 0, *, max_bytes: int | None = None, **dims: Any):
        """A new model whose every field is drawn by its initializer.

        Field `f` draws from `fold_in(key(seed), h(f))` with `h` a stable hash of its dotted name,
        so the same seed gives the same model, and adding a field changes no other.

        Args:
            seed: a whole number, a `jax.random.key`, or an int array (so `jax.vmap(M.init)`
                over seeds builds an ensemble, each member with a leading axis).
            max_bytes: the most the model may hold, checked from the declarations before anything
                is allocated (default 16 GiB: `shapeml.models.DEFAULT_MAX_BYTES`).
            **dims: overrides of free dims (`D=64`), and values of static fields (`sm.static()`);
                a static field not given takes its default.

        Raises:
            DimsOverrideError: (E0904) for an unknown or derived dim, or a bad value.
            ModelTooLargeError: (E0906) for a field or model larger than `max_bytes`.
            ArgumentTypeError: (E0003) for a seed that is not an integer or a key.
        """
        key = key_of(seed)
        limit = max_bytes_of(max_bytes)
        statics = {k: dims.pop(k) for k in list(dims) if k in cls.__shapeml_statics__}
        statics = tuple((k, check_static(cls.__name__, k, v)) for k, v in sorted(statics.items()))
        resolved = cls.dims.resolve(**dims)
        check_size(cls, resolved, limit, f"`{cls.__name__}.init`", dict(statics))
        return _init(cls, resolved, statics, key)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def of(cls, **dims_and_options: Any) -> Mapped:
        """This model as a parent's field declares it: dims mapped to the parent's names, options
        set. `sm.submodel(Cls, **dims_and_options)` is the same declaration.

        Args:
            **dims_and_options: an own free dim mapped to a parent dim's name (`In="D"`), to an
                expression of parent dims (`Out="4 * D"`) or to a whole number (`In=64`); and
                values of static fields (`bias=False`).

        Returns:
            A `Mapped` value (plain data: it compares, hashes and pickles); the sub-model built
            from it is an instance of this class, with its own dim names.

        Raises:
            FieldDeclarationError: (E0905) for a name that is neither a dim nor a static field,
                a derived dim, or a target that is not a name, an expression or a whole number.
        """
        errors = {"dims_error": FieldDeclarationError, "option_error": FieldDeclarationError}
        return map_model(cls, dims_and_options, **errors)

    @classmethod
    def _init_at(
        cls,
        key: jax.Array,
        dims: Dims,
        prefix: str,
        statics: tuple = (),
        inits: Mapping | None = None,
    ):
        """Draws every field; `inits` maps dotted names below this model to initializers that
        override the declared ones (from a parent's declaration, already resolved)."""
        values = dict(statics)
        own = statics_of(cls, values)
        inits = inits or {}
        for name, spec in cls.__shapeml_fields__.items():
            path = prefix + name
            if spec.kind in ("submodel", "submodels"):
                sub = child_dims(spec, dims)
                where = f"`{cls.__name__}.{name}`"
                # the nearer declaration first, so a parent further up has the last word
                below = {k: resolve_init(v, dims, where) for k, v in spec.mapped.inits}
                lead = name + "."
                below.update({k[len(lead) :]: v for k, v in inits.items() if k.startswith(lead)})
                options = spec.mapped.options_in(own)
                if spec.kind == "submodel":
                    values[name] = spec.model._init_at(key, sub, path + ".", options, below)
                else:
                    values[name] = tuple(
                        spec.model._init_at(key, sub, f"{path}.{i}.", options, below)
                        for i in range(spec.count_in(dims))
                    )
            elif not spec.present(own):
                values[name] = None
            else:
                shape = spec.shape_in(dims, f"`{cls.__name__}.{name}`")
                field_key = jax.random.fold_in(key, field_hash(path))
                init = inits.get(name, spec.init)
                init = resolve_init(init, dims, f"`{cls.__name__}.{name}`")
                values[name] = jnp.asarray(init(field_key, shape, spec.dtype), spec.dtype)
        return cls(dims=dims, **values)

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def replace(self, **changes: Any):
        """A new model with some fields replaced, each checked against its declaration.

        Raises:
            UnknownFieldError: (E0901) for a name the model does not declare.
            ShapeMismatchError: (E0902) for a wrong shape or dtype.
        """
        cls = type(self)
        specs = [*cls.__shapeml_fields__, *cls.__shapeml_statics__]
        values = {name: getattr(self, name) for name in specs}
        for name in changes:
            if name not in specs:
                raise UnknownFieldError(
                    f"`{cls.__name__}` has no field `{name}` to replace "
                    f"(fields: {', '.join(specs)})",
                    fix=similar(name, specs),
                )
        new = type(self)(dims=self._dims, **{**values, **changes})
        object.__setattr__(new, "_frozen", self._frozen)  # a frozen model stays frozen
        return new

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        specs = [*type(self).__shapeml_fields__, *type(self).__shapeml_statics__]
        raise UnknownFieldError(
            f"`{type(self).__name__}` has no field `{name}` (fields: {', '.join(specs) or 'none'})",
            fix=similar(name, list(specs) + ["dims"]),
        )

    def __setattr__(self, name: str, value: Any):
        cls = type(self).__name__
        known = name in type(self).__shapeml_fields__ or name in type(self).__shapeml_statics__
        raise FrozenModelError(
            f"`{cls}` is immutable: `m.{name} = ...` cannot change it"
            + ("" if known else f" (and `{cls}` has no field `{name}`)"),
            fix=f"make a new model instead: `m = m.replace({name}=...)`",
        )

    def __delattr__(self, name: str):
        self.__setattr__(name, None)

    def __repr__(self) -> str:
        return "\n".join(repr_lines(self, ""))

    _repr_html_ = repr_html  # a notebook shows the field table as HTML


# One compiled program draws every field: far faster than one eager dispatch per field. The class,
# its dims and its statics are static arguments, so jax.jit compiles it once per model layout.
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _init(cls: type[Model], dims: Dims, statics: tuple, key: jax.Array) -> Model:
    return cls._init_at(key, dims, "", statics)
