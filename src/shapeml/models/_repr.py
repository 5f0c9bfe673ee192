"""The table a model prints as: kind, name, shape in dims, shape in numbers, dtype per field."""

from __future__ import annotations

from ._checks import dims_str
from ._stacked import count_of, is_stacked

__all__ = ["repr_lines"]


def repr_lines(m, indent: str) -> list[str]:
    cls = type(m)
    lines = [f"{cls.__name__}({dims_str(m.dims)})"]
    rows = []
    for name, spec in cls.__shapeml_fields__.items():
        value = m.__dict__.get(name)
        if spec.kind == "submodel":
            sub = repr_lines(value, indent + "  ")
            lines.append(f"{indent}  {name}: {sub[0]}")
            lines.extend(sub[1:])
        elif spec.kind == "submodels" and is_stacked(spec, value):
            sub = repr_lines(value, indent + "  ")
            count = count_of(value, spec.count_in(m.dims))
            lines.append(f"{indent}  {name}: {count} x {sub[0]}, stacked")
            lines.extend(sub[1:])
        elif spec.kind == "submodels":
            for i, child in enumerate(value or ()):
                sub = repr_lines(child, indent + "  ")
                lines.append(f"{indent}  {name}.{i}: {sub[0]}")
                lines.extend(sub[1:])
        elif value is not None or not spec.optional:  # an absent optional tensor is no row
            shape = " ".join(map(str, getattr(value, "shape", ())))
            dtype = getattr(getattr(value, "dtype", None), "name", "?")
            rows.append((spec.kind, name, f"[{spec.shape_str}]", f"[{shape}]", dtype))
    if rows:
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        table = [
            f"{indent}  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows
        ]
        lines[1:1] = table
    for name in cls.__shapeml_statics__:
        text = repr(m.__dict__.get(name))
        lines.insert(
            1, f"{indent}  static  {name} = {text if len(text) <= 60 else text[:57] + '...'}"
        )
    return lines
