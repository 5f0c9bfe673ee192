"""Rule tables by the names the user wrote: a rule on a parent's dim reaches the fields of every
layer mapped to it, at any depth; the outermost spelling with a rule wins; a rule that places
nothing is refused. Specs need no devices; `sm.shard` runs on 4 forced host devices."""

from __future__ import annotations

import textwrap

import jax
import pytest
from _forced_devices import result_of
from jax.sharding import PartitionSpec as P

import shapeml as sm
from shapeml import nn, sharding


class Block(sm.Model):
    dims = sm.Dims(D=8, H=2, T=4)
    attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention, causal=True)
    mlp: nn.MLP = sm.submodel(nn.MLP, F="2 * D")


class Tower(sm.Model):
    """Two levels of mapping: the tower's `W` is the block's `D`, the MLP's `D`, the Linear's
    `In` (and `Out`)."""

    dims = sm.Dims(W=8, L=2)
    blocks: tuple[Block, ...] = sm.submodels(Block, "L", D="W")


def _split(m, rules) -> dict:
    """The partition spec of every field some axis of which is split, by dotted name."""
    specs = sm.partition_specs(m, rules)
    leaves = jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, P))
    named = {jax.tree_util.keystr(p, simple=True, separator="."): s for p, s in leaves}
    return {k: tuple(s) for k, s in named.items() if any(a is not None for a in s)}


def test_a_rule_on_the_mlp_width_splits_exactly_the_axes_mapped_to_it():
    mlp = nn.MLP.init(seed=0, D=8, F=16)
    # `up = Linear.of(In="D", Out="F")`, `down = Linear.of(In="F", Out="D")`: every axis spelled
    # `F` (up's w and b along `Out`, down's w along `In`), and no other
    assert _split(mlp, {"F": "model"}) == {
        "up.w": (None, "model"),
        "up.b": ("model",),
        "down.w": ("model", None),
    }
    mesh = sharding.make_mesh("model=1")
    report = sm.memory_report(mlp, mesh, {"F": "model"}, file=None)
    assert {r.name: r.rules for r in report.rows} == {
        "up.w": "F",
        "up.b": "F",
        "down.w": "F",
        "down.b": "",
    }
    text = str(report).splitlines()
    assert "rule" in text[0] and text[1].split()[0] == "up.w" and " F " in text[1]


def test_a_layers_own_names_keep_working_and_the_outermost_spelling_wins():
    m = Block.init(seed=0)
    # `Out` reaches the output axis of every Linear, attention's and the MLP's
    assert _split(m, {"Out": "x"}) == {
        **{f"attn.{p}.w": (None, "x") for p in "qkvo"},
        "mlp.up.w": (None, "x"),
        "mlp.up.b": ("x",),
        "mlp.down.w": (None, "x"),
        "mlp.down.b": ("x",),
    }
    # the MLP's `F` is spelled outside the Linears: it wins over their `Out`
    both = _split(m, {"F": "model", "Out": "x"})
    assert both["mlp.up.w"] == (None, "model") and both["mlp.down.w"] == ("model", "x")
    assert both["attn.q.w"] == (None, "x")
    # FSDP by the block's `D`, tensor parallel by heads: attention's projections are spelled
    # `D -> H * Dh`, so the two rules split their two axes
    split = _split(m, {"D": "data", "H": "model"})
    assert split["attn.q.w"] == ("data", "model") and split["attn.o.w"] == ("model", "data")
    assert split["mlp.up.w"] == ("data", None)  # `2 * D` is an expression: not `D`
    assert _split(m, {"2 * D": "model"})["mlp.up.w"] == (None, "model")


def test_a_nested_mapping_is_reached_by_the_outermost_names():
    t = Tower.init(seed=0)
    split = _split(t, {"W": "data"})
    for i in range(2):
        assert split[f"blocks.{i}.attn.q.w"] == ("data", None)
        assert split[f"blocks.{i}.mlp.up.w"] == ("data", None)
        assert split[f"blocks.{i}.mlp.down.w"] == (None, "data")
    assert _split(t, {"2 * W": "m"})["blocks.1.mlp.up.w"] == (None, "m")
    # the block's `D` is the tower's `W`: spelled `W` outside, so a rule on `D` never wins
    with pytest.raises(sharding.UnknownRuleDimError, match="E1901") as e:
        sm.partition_specs(t, {"W": "data", "D": "model"})
    assert "placed by the rule for an outer spelling (`W`)" in str(e.value)
    assert _split(t, {"D": "model"}) == _split(t, {"W": "model"})


class Pair(sm.Model):
    dims = sm.Dims(D=4, E=6, T=3)
    a: nn.Linear = sm.submodel(nn.Linear, In="D", Out="E")
    b: nn.Linear = sm.submodel(nn.Linear, In="D", Out="E", bias=False)


@pytest.mark.parametrize(
    "rules, words",
    [
        ({"Q": "x"}, ["`Q`", "neither declares", "(dims: D, E, In, Out, T)"]),
        ({"Ee": "x"}, ["a spelling with a similar name exists: `E`"]),
        ({"T": "x"}, ["`T`", "no field's axis is spelled with"]),
        ({"D": "x", "In": "y"}, ["`In`", "outer spelling (`D`)", "e.g. in `a.w`"]),
    ],
)
def test_a_rule_that_places_nothing_is_refused_naming_what_it_could_mean(rules, words):
    with pytest.raises(sharding.UnknownRuleDimError) as info:
        sm.partition_specs(Pair.init(seed=0), rules)
    assert info.value.code == "E1901"
    for w in words:
        assert w in str(info.value)


def test_two_axes_mapped_onto_one_name_cannot_share_a_mesh_axis():
    class Square(sm.Model):
        dims = sm.Dims(D=4)
        proj: nn.Linear = sm.submodel(nn.Linear, In="D", Out="D")

    with pytest.raises(sharding.AxisReusedError, match="both spelled `D`"):
        sm.partition_specs(Square.init(seed=0), {"D": "x"})


SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import shapeml as sm
    from shapeml import nn, sharding

    class Block(sm.Model):
        dims = sm.Dims(D=8, H=2, T=4)
        attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention, causal=True)
        mlp: nn.MLP = sm.submodel(nn.MLP, F="2 * D")

    def forward(m, x):
        x = x + m.attn(x)
        return x + m.mlp(x)

    m = Block.init(seed=0)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 4, 8)), jnp.float32)
    mesh = sharding.make_mesh("data=2,model=2")
    placed = sm.shard(m, mesh, {"D": "data", "F": "model", "H": "model"})
    out = {
        "up": list(placed.mlp.up.w.sharding.spec),
        "down": list(placed.mlp.down.w.sharding.spec),
        "q": list(placed.attn.q.w.sharding.spec),
        "up_block": list(placed.mlp.up.w.addressable_shards[0].data.shape),
        "diff": float(jnp.max(jnp.abs(jax.jit(forward)(placed, x) - forward(m, x)))),
    }
    print("RESULT" + json.dumps(out))
    """
)


def test_shard_places_layer_fields_by_the_parents_names_on_four_devices():
    out = result_of(SCRIPT, 4)
    assert out["up"] == ["data", "model"] and out["down"] == ["model", "data"]
    assert out["q"] == ["data", "model"] and out["up_block"] == [4, 8]
    assert out["diff"] < 1e-5
