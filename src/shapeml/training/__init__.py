"""Training: the compiled step and the loop (progress, evaluation, checkpoints, resume, data
parallelism). The Spotter job behind `shapeml train` lives in `shapeml.apps.spotter_job`;
`train_spotter` and `evaluate_spotter` here are deprecated aliases of it."""

from ._loop import TrainingDivergedError as TrainingDivergedError
from ._loop import TrainResult as TrainResult
from ._loop import train as train
from ._step import TrainStep as TrainStep
from ._step import make_mesh as make_mesh

__all__ = [
    "TrainResult",
    "TrainStep",
    "TrainingDivergedError",
    "make_mesh",
    "train",
]


def __getattr__(name: str):
    # Deprecated aliases, resolved on first use so that the library never imports its apps.
    if name in ("train_spotter", "evaluate_spotter"):
        from ..apps import spotter_job

        return getattr(spotter_job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
