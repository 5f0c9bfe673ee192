"""Decode speed of the shipped int8 model: the numpy reference vs the JAX step vs one-call generate.

    python benchmarks/int8_decode.py

Measures, in one run, the time per decoded token (with `jax.block_until_ready`):
  (a) the numpy reference, stepping token by token;
  (b) the compiled JAX step, called once per token (the cache goes back and forth);
  (c) `generate`, the whole trace in one compiled call;
  (d) `generate` with tp=2, in a subprocess with two CPU devices (`sm.use_cpu_devices(2)`; the
      model placed on the mesh once, `tp_params`), and the tp=2 step per token both with the
      placed model and with the plain one (`decode_step(..., tp=2)`, whose placement is cached per model).
(a), (b) and (c) are timed together by the shared interleaved timer (`_timing.interleaved`:
shuffled order each round), so machine noise hits them alike. The last line is the budget
line: the per-token speedup of (c) over (a).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

import shapeml as sm  # noqa: E402
from shapeml.apps.int8_sort import tiny_model  # noqa: E402

PROMPT = "fcak>"


def median_time(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(tp: int | None) -> dict[str, float]:
    base = tiny_model()
    # with tp, the tables placed on the mesh once (`tp_params`), not on every call
    m = base if tp is None else base.tp_params(tp)
    prompt = m.encode(PROMPT)
    n = m.ctx - len(prompt) + 1  # fill the context: ctx decode steps
    steps = len(prompt) + n - 1

    def step_loop(m=m):
        cache, seq = m.init_cache(), list(prompt)
        for pos in range(steps):
            _, nxt, cache = m.decode_step(seq[pos], pos, cache, tp=tp)
            if pos + 1 >= len(prompt):
                seq.append(int(nxt))  # greedy: the host needs the token to feed it back
        return seq

    out = {"steps": steps}
    if tp is None:
        assert m.reference_generate(prompt, n)[0] == m.generate(prompt, n)
        # one call of each contender takes about 10-20 ms: 20 generate traces, each waited for
        one_trace = lambda: jax.block_until_ready(m.generate_arrays(prompt, n))
        us = interleaved(
            {
                "reference": lambda: m.reference_generate(prompt, n),
                "step": step_loop,
                "generate": lambda: [one_trace() for _ in range(20)],
            },
            rounds=9,
            number=2,
        )
        out["reference"] = us["reference"] * 1e-6 / steps
        out["step"] = us["step"] * 1e-6 / steps
        out["generate"] = us["generate"] * 1e-6 / (20 * steps)
    else:
        assert m.generate(prompt, n, tp=tp) == base.generate(prompt, n)
        out["generate"] = (
            median_time(
                lambda: jax.block_until_ready(m.generate_arrays(prompt, n, tp=tp)), repeat=50
            )
            / steps
        )
        out["step"] = median_time(step_loop, repeat=5) / steps
        out["step_plain"] = median_time(lambda: step_loop(base), repeat=5) / steps
    return out


def main() -> None:
    if "--child-tp" in sys.argv:
        tp = int(sys.argv[sys.argv.index("--child-tp") + 1])
        sm.use_cpu_devices(tp)  # first, before JAX starts
        r = measure(tp)
        print(f"CHILD {r['generate']} {r['step']} {r['step_plain']}")
        return
    r = measure(None)
    child = subprocess.run(
        [sys.executable, __file__, "--child-tp", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    line = next(ln for ln in child.stdout.splitlines() if ln.startswith("CHILD"))
    tp_gen, tp_step, tp_plain = map(float, line.split()[1:])
    us = lambda s: f"{s * 1e6:8.1f} us/token ({1 / s:8.0f} tokens/s)"
    print(f"shipped model, prompt {PROMPT!r}, {r['steps']} decode steps per trace")
    print(f"(a) numpy reference, token by token : {us(r['reference'])}")
    print(f"(b) JAX step, one call per token    : {us(r['step'])}")
    print(f"(c) generate, one compiled call     : {us(r['generate'])}")
    print(
        f"(d) generate, tp=2 (2 CPU devices)  : {us(tp_gen)}   [tp=2 step per token: "
        f"{tp_step * 1e6:.1f} us placed (tp_params), {tp_plain * 1e6:.1f} us plain]"
    )
    print(f"int8_step_vs_reference: ratio={r['reference'] / r['step']:.2f}")
    print(f"int8_generate_vs_reference: ratio={r['reference'] / r['generate']:.1f} (budget >= 10)")


if __name__ == "__main__":
    main()
