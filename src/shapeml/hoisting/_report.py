"""What hoisting did to one program, in numbers a user can check (`Hoisted.report()`)."""

from __future__ import annotations

import dataclasses

from .._traceback import api_boundary
from ._split import Boundary, Split


@api_boundary
@dataclasses.dataclass(frozen=True)
class HoistReport:
    """What was moved out of the per-call path.

    Attributes:
        prepare_ops: primitive name -> count of equations run once per set of weights.
        main_ops: primitive name -> count of equations run on every call.
        boundary: the tensors main reads from prepare (computed, passed-through weights, consts).
        prepared_bytes: bytes of tensors prepare computed and the cache holds (beyond the weights).
        weight_bytes: bytes of the weight arrays themselves.
        cut_broadcasts: boundary tensors that were broadcasts, left to main to expand.
        over_budget: prepare equations moved to main to stay within `max_prepared_bytes`.
        prepare_runs: how many times prepare ran (once per new set of weight arrays).
        traces: how many programs were traced (once per new structure or shapes).
    """

    prepare_ops: dict[str, int]
    main_ops: dict[str, int]
    boundary: tuple[Boundary, ...]
    prepared_bytes: int
    weight_bytes: int
    cut_broadcasts: int
    over_budget: int
    prepare_runs: int
    traces: int

    @classmethod
    def of(cls, s: Split, weight_bytes: int, prepare_runs: int, traces: int) -> HoistReport:
        prepared = sum(b.nbytes for b in s.boundary if b.source == "prepared")
        return cls(
            prepare_ops=dict(sorted(s.prepare_ops.items())),
            main_ops=dict(sorted(s.main_ops.items())),
            boundary=s.boundary,
            prepared_bytes=prepared,
            weight_bytes=weight_bytes,
            cut_broadcasts=s.cut_broadcasts,
            over_budget=s.over_budget,
            prepare_runs=prepare_runs,
            traces=traces,
        )

    @property
    def hoisted_ops(self) -> int:
        """Equations no longer run per call."""
        return sum(self.prepare_ops.values())

    def __str__(self) -> str:
        def ops(d):
            return ", ".join(f"{k} x{v}" for k, v in d.items()) or "(none)"

        lines = [
            f"hoisted {self.hoisted_ops} ops out of the per-call path: {ops(self.prepare_ops)}",
            f"per call: {sum(self.main_ops.values())} ops: {ops(self.main_ops)}",
            f"prepared {_mb(self.prepared_bytes)} for {_mb(self.weight_bytes)} of weights "
            f"({self.prepare_runs} prepare runs, {self.traces} traces)",
        ]
        if self.cut_broadcasts:
            lines.append(f"{self.cut_broadcasts} broadcasts left to main (cache the small tensor)")
        if self.over_budget:
            lines.append(f"{self.over_budget} ops left in main by max_prepared_bytes")
        for b in self.boundary:
            shape = "x".join(map(str, b.shape)) or "scalar"
            lines.append(f"  {b.source:8s} {b.dtype}[{shape}] {_mb(b.nbytes)} from {b.producer}")
        return "\n".join(lines)


def _mb(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"
