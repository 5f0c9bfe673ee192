"""Per-fusion time of a compiled JAX program on CPU, and per-op time of a PyTorch step.

`xla_fusions(compiled, run)` traces `run()` with `jax.profiler`, reads the trace back with
`jax.profiler.ProfileData` (no TensorBoard needed) and sums the busy time of each HLO op (a
fusion, a dot, a copy) over all of XLA's threads, naming each by its kind and output shape from the
compiled program's text. `torch_ops(run)` does the same for PyTorch with `torch.profiler`.
"""

from __future__ import annotations

import collections
import glob
import re
import tempfile

import jax

_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+(?: \S+)*?) (\w[\w-]*)\((.*)$")


def _describe(hlo_text: str) -> dict[str, str]:
    """`op name -> "kind shape (calls ...)"` for every instruction of the entry computation and
    every fusion's root, from the optimized HLO text."""
    out: dict[str, str] = {}
    roots: dict[str, str] = {}
    comp = None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            comp = head.group(1)
            continue
        m = re.match(r"^\s*(ROOT )?%?([\w.\-]+) = (.+?) ([\w-]+)\((.*)$", line)
        if not m:
            continue
        is_root, name, shape, opcode, rest = m.groups()
        if is_root and comp:
            roots[comp] = f"{opcode}"
        kind = re.search(r"kind=(\w+)", rest)
        calls = re.search(r"calls=%?([\w.\-]+)", rest)
        desc = opcode + (f"/{kind.group(1)}" if kind else "")
        out[name] = (desc, shape.split("{")[0], calls.group(1) if calls else None)
    return {
        k: f"{d} {s}" + (f" root={roots.get(c, '?')}" if c else "") for k, (d, s, c) in out.items()
    }


def xla_fusions(compiled, run, *, steps: int = 10) -> tuple[float, list[tuple[str, float, str]]]:
    """`(wall us per step, [(op, busy us per step, description)])`, busiest first."""
    import time

    desc = _describe(compiled.as_text())
    jax.block_until_ready(run())
    d = tempfile.mkdtemp()
    with jax.profiler.trace(d):
        start = time.perf_counter()
        for _ in range(steps):
            out = run()
        jax.block_until_ready(out)
        wall = (time.perf_counter() - start) / steps * 1e6
    (path,) = glob.glob(d + "/**/*.xplane.pb", recursive=True)
    busy: dict[str, float] = collections.defaultdict(float)
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for ev in line.events:
                stats = dict(ev.stats)
                op = stats.get("hlo_op")
                if op is not None:
                    busy[op] += ev.duration_ns / 1e3 / steps
    rows = sorted(busy.items(), key=lambda kv: -kv[1])
    return wall, [(k, v, desc.get(k, "")) for k, v in rows]


def torch_ops(run, *, steps: int = 10) -> tuple[float, list[tuple[str, float, str]]]:
    """`(wall us per step, [(op, self CPU us per step, "")])` of a PyTorch step, busiest first."""
    import time

    import torch

    run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        wall = (time.perf_counter() - start) / steps * 1e6
    rows = [(e.key, e.self_cpu_time_total / steps, "") for e in prof.key_averages()]
    return wall, sorted(rows, key=lambda r: -r[1])


def table(title: str, wall: float, rows, top: int = 25) -> str:
    total = sum(r[1] for r in rows)
    lines = [
        f"## {title}: {wall:,.0f} us per step (wall), {total:,.0f} us busy summed over threads"
    ]
    for name, us, d in rows[:top]:
        lines.append(f"{us:9,.0f} us {100 * us / total:5.1f}%  {name:28s} {d}")
    return "\n".join(lines)
