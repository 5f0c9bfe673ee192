"""Every core a device, and pacing: the char GPT's `TrainStep` on every CPU device
(`sm.use_cpu_devices()`, one step at a time), the same without pacing, and on one device,
interleaved in one run.

Pacing (`shapeml/_step/_devices.py`) makes a step on several CPU devices wait for the previous one
before it is queued; the unpaced contender turns that off on its own shell, to measure its cost.
Run: python benchmarks/gpt_cores.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import jax  # noqa: E402
from _timing import interleaved  # noqa: E402
from gpt_step import GPT, SMALL, _tokens, shapeml_step  # noqa: E402

import shapeml as sm  # noqa: E402


def main() -> None:
    made = sm.use_cpu_devices()  # first, before JAX starts
    rounds = 3 if "--quick" in sys.argv else 9
    print(f"devices: {made} CPU devices ({jax.local_device_count()} seen by JAX)")
    for b, t in ((8, 64), (32, 64)):
        m = GPT.init(seed=0, T=t, **SMALL)
        tokens = _tokens(b, t, seed=1)
        paced, unpaced, one = shapeml_step(m), shapeml_step(m), shapeml_step(m, devices=1)
        unpaced._shell._paced = False  # the measured switch: no public knob, on purpose
        steps = {"every_core_paced": paced, "every_core_unpaced": unpaced, "one_device": one}
        times = interleaved(
            {k: (lambda s=s, x=tokens: s(x)) for k, s in steps.items()},
            rounds=rounds,
            number=max(2, 128 // b),
        )
        print(f"b={b} T={t}: " + ", ".join(f"{k} {v:,.0f} us" for k, v in times.items()))
        ratio = times["every_core_paced"] / times["one_device"]
        print(f"gpt_every_core_vs_one_device[b={b},T={t}]: ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
