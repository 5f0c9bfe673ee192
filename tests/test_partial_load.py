"""Partial loading for fine-tuning: `sm.load(..., missing=, unexpected=, mismatched=)` loads what
matches, initializes or keeps the rest, and reports what it did; a new head, a longer position
table, a smaller model; without the keywords every load is as strict as before."""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import nn
from shapeml.models import LoadReport, PartialLoadWarning


class Block(sm.Model):
    dims = sm.Dims(D=16, H=2, T=8)
    ln: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    attn: nn.MultiHeadAttention = sm.submodel(
        nn.MultiHeadAttention, causal=True, positions="learned"
    )


class GPT(sm.Model):
    dims = sm.Dims(V=20, D=16, H=2, T=8, L=2)
    emb: nn.Embedding = sm.submodel(nn.Embedding)
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")


class Classifier(GPT):
    """The pretrained GPT's fields, and a new head."""

    dims = sm.Dims(V=20, D=16, H=2, T=8, L=2, C=3)
    head: nn.Linear = sm.submodel(nn.Linear, In="D", Out="C")
    temperature: Float[Array, ""] = sm.buffer(sm.ones)


@pytest.fixture(scope="module")
def pretrained():
    return GPT.init(seed=0)


@pytest.fixture
def path(pretrained, tmp_path):
    return sm.save(tmp_path / "gpt.safetensors", pretrained)


def same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_new_head_is_initialized_as_init_draws_it_and_the_rest_loaded(pretrained, path):
    m, report = sm.load(path, Classifier, missing="init", seed=3, report=True)
    assert type(m) is Classifier and m.dims.C == 3
    fresh = Classifier.init(seed=3)
    for name, value in sm.params(m).items():
        if name.startswith("head."):
            np.testing.assert_allclose(value, sm.params(fresh)[name], rtol=1e-6)
        else:
            same(value, sm.params(pretrained)[name])
    same(m.temperature, 1.0)
    assert report.missing == ("head.w", "head.b", "temperature") and report.filled_from == "init"
    assert len(report.loaded) == len(sm.params(pretrained)) and report.partial


def test_a_longer_position_table_keeps_the_files_rows_and_the_templates_rest(pretrained, path):
    template = GPT.init(seed=1, T=16)
    with pytest.warns(PartialLoadWarning) as caught:
        m = sm.load(path, like=template, missing="keep", mismatched="overlap")
    assert m.dims.T == 16
    for i in range(2):
        same(m.blocks[i].attn.pos[:8], pretrained.blocks[i].attn.pos)
        same(m.blocks[i].attn.pos[8:], template.blocks[i].attn.pos[8:])
    same(m.emb.w, pretrained.emb.w)
    text = str(caught[0].message)
    assert "[W1302]" in text and "loaded 13 of the model's 15 tensors whole" in text
    assert (
        "`blocks.1.attn.pos`: file [8 16], model [16 16]: loaded [:8, :16] from the file, "
        "the rest kept from like=" in text
    )
    assert Path(caught[0].filename).name == Path(__file__).name  # the user's line, not shapeml's
    assert isinstance(caught[0].message.report, LoadReport)


def test_skip_fills_the_whole_field_and_a_smaller_model_ignores_the_rest(pretrained, path):
    m, report = sm.load(path, like=GPT.init(seed=2, T=16), missing="init", mismatched="skip",
                        seed=5, report=True)  # fmt: skip
    fresh = GPT.init(seed=5, T=16)
    np.testing.assert_allclose(m.blocks[0].attn.pos, fresh.blocks[0].attn.pos, rtol=1e-6)
    assert report.overlapped == () and [n for n, _, _ in report.mismatched] == [
        "blocks.0.attn.pos",
        "blocks.1.attn.pos",
    ]
    one, report = sm.load(path, like=GPT.init(seed=2, L=1), unexpected="ignore", report=True)
    same(one.blocks[0].attn.q.w, pretrained.blocks[0].attn.q.w)
    assert len(report.unexpected) == 7 and report.unexpected[0].startswith("blocks.1.")
    assert "ignored, not in the model: `blocks.1." in str(report)


def test_what_the_policies_leave_as_errors_is_one_coded_report(path):
    with pytest.raises(sm.models.CheckpointError) as e:
        sm.load(path, like=Classifier.init(seed=0, T=16), missing="keep")
    text = str(e.value)
    assert "[E1301]" in text and "2 problem(s) that the load's policies leave as errors" in text
    assert "wrong shape or dtype: `blocks.0.attn.pos` expected [16 16] float32" in text
    assert 'mismatched="skip" or "overlap"' in text


def test_without_the_keywords_a_load_is_as_strict_as_before(path):
    with pytest.raises(sm.ShapemlError, match="E1303"):
        sm.load(path, Classifier)
    with pytest.raises(sm.ShapemlError, match="E1303"):
        sm.load(path, like=GPT.init(seed=0, T=16))
    m, report = sm.load(path, GPT, report=True)
    assert not report.partial and len(report.loaded) == len(sm.params(m))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a load that loads everything never warns
        sm.load(path, like=m, missing="keep", unexpected="ignore", mismatched="overlap")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"missing": "zeros"}, "`missing` is 'zeros'"),
        ({"unexpected": False}, "`unexpected` is False"),
        ({"missing": "keep"}, 'missing="keep" keeps the fields the file lacks from a model'),
        ({"mismatched": "overlap"}, 'but missing="error"'),
        ({"missing": "init", "seed": 1.5}, "seed"),
        ({"report": "yes"}, "`report` must be True or False"),
    ],
)
def test_bad_policies_are_refused_before_the_file_is_read(tmp_path, kwargs, match):
    with pytest.raises(sm.ShapemlError, match=match):
        sm.load(tmp_path / "not-there.safetensors", GPT, **kwargs)


def test_a_partial_load_onto_a_mesh_places_every_field(path):
    mesh = jax.make_mesh((1,), ("data",))
    m, report = sm.load(path, Classifier, mesh=mesh, rules={"D": "data"}, missing="init",
                        report=True)  # fmt: skip
    assert report.missing[0] == "head.w"
    assert all(leaf.sharding.mesh.axis_names == ("data",) for leaf in jax.tree.leaves(m))
    assert m.head.w.sharding.spec == P("data", None)  # the filled head is placed by the rules
    assert m.emb.w.sharding.spec == P(None, "data")
    with pytest.warns(PartialLoadWarning):
        sm.load(path, Classifier, mesh=mesh, missing="init")
