"""`sm.save` / `sm.load` of a ~100 MB model vs the bare `safetensors` library on the same arrays.

shapeml's file layer is the library plus an atomic write (temp folder, fsync, rename), dtype and
NaN checks, and the model's own checks on load; the ratios say what those cost. The baselines
write with `safetensors.numpy.save_file` (no fsync) and read with `safetensors.numpy.load_file`
(mmap), then build the model the same way (`Model.replace`).
Run: python benchmarks/checkpoint_io.py
"""

import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
from jaxtyping import Array, BFloat16, Float

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

import shapeml as sm  # noqa: E402


class Big(sm.Model):
    """104 MiB: float32 matrices and one bfloat16 one."""

    dims = sm.Dims(V=8192, D=1024, F=4096)
    emb: Float[Array, "V D"] = sm.param(sm.normal(std=0.02))
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.02))
    w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.02))
    w3: Float[Array, "D F"] = sm.param(sm.normal(std=0.02))
    w4: Float[Array, "F D"] = sm.param(sm.normal(std=0.02))
    w5: BFloat16[Array, "D F"] = sm.param(sm.normal(std=0.02), dtype=jnp.bfloat16)


def main() -> None:
    m = Big.init(seed=0)
    arrays = {k: np.asarray(v) for k, v in sm.params(m).items()}
    mib = sum(a.nbytes for a in arrays.values()) / 2**20
    folder = Path(tempfile.mkdtemp(prefix="shapeml-bench-"))
    ours, theirs = folder / "ours.safetensors", folder / "theirs.safetensors"
    sm.save(ours, m)
    safetensors.numpy.save_file(arrays, theirs)

    def library_load():
        loaded = safetensors.numpy.load_file(theirs)
        return m.replace(**{k: jnp.asarray(v) for k, v in loaded.items()})

    t = interleaved(
        {
            "save": lambda: sm.save(ours, m),
            "library_save": lambda: safetensors.numpy.save_file(arrays, theirs),
            "load": lambda: jax.tree.leaves(sm.load(ours, Big)),
            "library_load": lambda: jax.tree.leaves(library_load()),
        },
        rounds=9,
        number=1,
    )
    print(f"checkpoint of {mib:.0f} MiB")
    for what in ("save", "load"):
        ms, base = t[what] / 1e3, t[f"library_{what}"] / 1e3
        print(f"checkpoint_{what}: {ms:.1f} ms, library {base:.1f} ms, ratio={ms / base:.2f}")


if __name__ == "__main__":
    main()
