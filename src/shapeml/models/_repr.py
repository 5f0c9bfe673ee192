"""The table a model shows as: kind, name, shape in dims, shape in numbers, dtype per field; as
text (`repr`) and as HTML in a notebook (`_repr_html_`)."""

from __future__ import annotations

import html

import numpy as np

from ._checks import dims_str
from ._stacked import count_of, is_stacked

__all__ = ["repr_html", "repr_lines"]


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
            kind = "frozen" if m._frozen and spec.kind == "param" else spec.kind
            rows.append((kind, name, f"[{spec.shape_str}]", f"[{shape}]", dtype))
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


def _rows(m) -> tuple[list[tuple], list[tuple[str, object]]]:
    """The model's own tensor rows (kind, name, shape in dims, shape, dtype, size) and its
    sub-models (dotted name, model)."""
    rows, subs = [], []
    for name, spec in type(m).__shapeml_fields__.items():
        value = m.__dict__.get(name)
        if spec.kind == "submodel":
            subs.append((name, value))
        elif spec.kind == "submodels":
            subs += [(f"{name}.{i}", child) for i, child in enumerate(value or ())]
        elif value is not None or not spec.optional:
            shape = tuple(getattr(value, "shape", ()))
            dtype = getattr(getattr(value, "dtype", None), "name", "?")
            trained = spec.kind == "param" and not m._frozen
            size = int(np.prod(shape)) if trained else 0
            kind = "frozen" if m._frozen and spec.kind == "param" else spec.kind
            rows.append((kind, name, spec.shape_str, " ".join(map(str, shape)), dtype, size))
    return rows, subs


def _param_count(m) -> int:
    rows, subs = _rows(m)
    return sum(r[5] for r in rows) + sum(_param_count(child) for _, child in subs)


def repr_html(m) -> str:
    """The model as a notebook shows it: its class, dims and param count, then a table of its
    fields (kind, name, shape in dims, shape in numbers, dtype) and options, and each sub-model
    folded under its name. Names are `<samp>`, not `<code>`: the docs site links inline code
    that names an API object, and a field may be called `norm`."""
    head, body = _html_parts(m)
    return f'<div class="shapeml-model"><p>{head}</p>{body}</div>'


def _html_parts(m) -> tuple[str, str]:
    """The model's heading (class, dims, param count) and body (its table, its sub-models)."""
    cls, esc = type(m), html.escape
    head = (
        f"<b>{esc(cls.__name__)}</b>({esc(dims_str(m.dims))}) &middot; {_param_count(m):,} params"
    )
    rows, subs = _rows(m)
    cells = [
        f"<tr><td>{esc(kind)}</td><td><samp>{esc(field)}</samp></td><td>[{esc(dims)}]</td>"
        f"<td>[{esc(shape)}]</td><td>{esc(dtype)}</td></tr>"
        for kind, field, dims, shape, dtype, _ in rows
    ]
    for static in cls.__shapeml_statics__:
        text = repr(m.__dict__.get(static))
        text = text if len(text) <= 60 else text[:57] + "..."
        cells.append(
            f"<tr><td>static</td><td><samp>{esc(static)}</samp></td>"
            f'<td colspan="3">{esc(text)}</td></tr>'
        )
    body = ""
    if cells:
        header = "".join(
            f"<th>{h}</th>" for h in ("kind", "field", "shape in dims", "shape", "dtype")
        )
        # a class of its own: no page theme styles it as prose (the docs theme pads such tables)
        body = (
            f'<table class="shapeml-fields"><thead><tr>{header}</tr></thead>'
            f"<tbody>{''.join(cells)}</tbody></table>"
        )
    for name, child in subs:
        sub_head, sub_body = _html_parts(child)
        body += (
            f"<details><summary><samp>{esc(name)}</samp>: {sub_head}</summary>"
            f'<div style="margin-left: 1.5em">{sub_body}</div></details>'
        )
    return head, body
