"""The shapeml metadata of a model checkpoint: written from a model, and checked when read.

Every value is a string (safetensors metadata is str -> str); dims, kinds and static fields are
JSON. Reading checks each value's JSON and type before anything uses it, so a malformed or hostile
value (`shapeml.dims = "5"`) is a coded E1302 naming the key, never a raw exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import ShapemlError
from .._io import FileFormatError
from .._validate import integer, shorten
from .._version import __version__
from ._dims import MAX_DIM
from ._introspect import statics, tensors
from ._statics import from_json

if TYPE_CHECKING:
    from ._model import Model

__all__ = ["check_kinds", "model_metadata", "saved_dims", "saved_statics"]


def model_metadata(m: Model) -> dict[str, str]:
    """The metadata `sm.save` writes: format, class, free dims, tensor kinds, statics, version."""
    cls = type(m)
    return {
        "shapeml.format": "model",
        "shapeml.class": f"{cls.__module__}.{cls.__qualname__}",
        "shapeml.dims": json.dumps({n: m.dims[n] for n in m.dims.free}),
        "shapeml.kinds": json.dumps({k: kind for k, (kind, _) in tensors(m).items()}),
        "shapeml.static": json.dumps(statics(m)),
        "shapeml.version": __version__,
    }


def _json_meta(meta: Mapping[str, str], key: str, default: str, source: str, want: str) -> Any:
    """The JSON value of metadata `key`, E1302 naming the key when it is not JSON."""
    raw = meta.get(key, default)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise _bad_meta(source, key, raw, want) from None


def _bad_meta(source: str, key: str, raw: str, want: str) -> FileFormatError:
    return FileFormatError(
        f"`{source}` has unreadable metadata: `{key}` is {shorten(raw)}, not {want}",
        fix="re-save it with sm.save(path, model)",
    )


def saved_dims(meta: Mapping[str, str], source: str) -> dict[str, int]:
    """The free dims the file was saved with (empty when it names none)."""
    want = "a JSON map of dim names to whole numbers"
    saved = _json_meta(meta, "shapeml.dims", "{}", source, want)
    if not isinstance(saved, dict):
        raise _bad_meta(source, "shapeml.dims", meta["shapeml.dims"], want)
    for k, v in saved.items():
        try:
            integer(k, v, low=0, high=MAX_DIM)
        except ShapemlError:
            raise _bad_meta(source, "shapeml.dims", meta["shapeml.dims"], want) from None
    return saved


def check_kinds(meta: Mapping[str, str], source: str) -> None:
    """Checks `shapeml.kinds` names each tensor's kind as "param" or "buffer"."""
    want = 'a JSON map of tensor names to "param" or "buffer"'
    kinds = _json_meta(meta, "shapeml.kinds", "{}", source, want)
    if not isinstance(kinds, dict) or not all(k in ("param", "buffer") for k in kinds.values()):
        raise _bad_meta(source, "shapeml.kinds", meta["shapeml.kinds"], want)


def saved_statics(meta: Mapping[str, str], source: str) -> dict:
    """The static fields the file was saved with, by dotted name (JSON lists as tuples)."""
    want = "a JSON map of static-field names to values"
    saved = _json_meta(meta, "shapeml.static", "{}", source, want)
    if not isinstance(saved, dict):
        raise _bad_meta(source, "shapeml.static", meta["shapeml.static"], want)
    try:
        return {k: from_json(v) for k, v in saved.items()}
    except RecursionError:
        raise _bad_meta(source, "shapeml.static", meta["shapeml.static"], want) from None
