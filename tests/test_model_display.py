"""How a model shows itself in a notebook: `_repr_html_`, the field table as HTML."""

from __future__ import annotations

import html.parser

from jaxtyping import Array, Float, Int

import shapeml as sm


class Block(sm.Model):
    dims = sm.Dims(D=8, F=16)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.1))
    w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.1))


class Net(sm.Model):
    dims = sm.Dims(D=8, F=16, L=2, V=11, T="2 * D")
    emb: Float[Array, "V D"] = sm.param(sm.normal(std=0.02))
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    count: Int[Array, " T"] = sm.buffer(sm.full(3))
    name: str = sm.static("<net & co>")


class _Table(html.parser.HTMLParser):
    """The rows of the first table, each a list of cell texts."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.tables = 0
        self.in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables += 1
        if tag == "tr" and self.tables == 1:
            self.rows.append([])
        if tag in ("td", "th") and self.tables == 1:
            self.rows[-1].append("")
            self.in_cell = True

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.in_cell = False

    def handle_data(self, data):
        if self.in_cell:
            self.rows[-1][-1] += data


def test_a_model_shows_as_an_html_table_of_its_fields():
    m = Net.init(seed=0)
    text = m._repr_html_()
    parser = _Table()
    parser.feed(text)
    assert parser.rows[0] == ["kind", "field", "shape in dims", "shape", "dtype"]
    assert ["param", "emb", "[V D]", "[11 8]", "float32"] in parser.rows
    assert ["buffer", "count", "[T]", "[16]", "int32"] in parser.rows
    assert ["static", "name", "'<net & co>'"] in parser.rows  # escaped in the HTML, shown as is
    assert "&lt;net &amp; co&gt;" in text and "<net" not in text
    assert f"{sm.count_params(m):,} params" in text  # 88 + 2 * 256
    assert text.count("<details>") == 2 and "<samp>blocks.1</samp>: <b>Block</b>(D=8 F=16)" in text
    assert repr(m).startswith("Net(D=8 F=16 L=2 V=11 T=16)")  # the text form is unchanged
