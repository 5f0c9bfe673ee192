"""Solutions to the exercises of tutorials/06_shape_contracts.ipynb.

Run: python tutorials/solutions/06_shape_contracts.py
"""

from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml.testing import ContractError, check_contract
from shapeml.zoo.spotter import Spotter, forward, predict

# 1. The Spotter's forward and predict, at batch 1, 64 and any batch; then with 2x2 patches.
check_contract(forward, Spotter, sizes={"b": [1, 64, "b"]})
check_contract(predict, Spotter, sizes={"b": [1, 64, "b"]})
small_patches = Spotter.init(seed=0, P=2)
assert small_patches.dims.N == 64  # (16 // 2) ** 2 patches
[record] = check_contract(forward, small_patches, sizes={"b": [3]})
assert record["out"] == (3, 4)


# 2. A transposed result. `(x @ m.w).T` is [E b]: the contract breaks at b=1 and b=5, but b=3 passes,
#    because there [E b] and [b E] are both [3 3]. The symbolic size "b" catches it whatever E is.
class Pair(sm.Model):
    dims = sm.Dims(D=8, E=3)
    w: Float[Array, "D E"] = sm.param(sm.normal())


@sm.shaped
def project(m: Pair, x: Float[Array, "b D"]) -> Float[Array, "b E"]:
    return (x @ m.w).T


def breaks(b) -> bool:
    try:
        check_contract(project, Pair, sizes={"b": [b]})
    except ContractError:
        return True
    return False


assert [breaks(b) for b in (1, 3, 5, "b")] == [True, False, True, True]


@sm.shaped
def project(m: Pair, x: Float[Array, "b D"]) -> Float[Array, "b E"]:  # noqa: F811 - the fix
    return x @ m.w


check_contract(project, Pair, sizes={"b": [1, 3, 5, "b"]})


# 3. Every combination: 3 values of b times 2 of t.
class Tagger(sm.Model):
    dims = sm.Dims(V=50, D=16, C=5)
    emb: Float[Array, "V D"] = sm.param(sm.normal(std=0.1))
    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.25))


@sm.shaped
def scores(m: Tagger, tokens: Int[Array, "b t"]) -> Float[Array, "b t C"]:
    return m.emb[tokens] @ m.w


assert len(check_contract(scores, Tagger, sizes={"b": [1, 2, "b"], "t": [1, "t"]})) == 6
print("06_shape_contracts: all solutions check out")
