"""Training: the compiled step and the loop (progress, evaluation, checkpoints, resume, data
parallelism). The Spotter job behind `shapeml train` lives in `shapeml.apps.spotter_job`."""

from ._evaluate import evaluate as evaluate
from ._loop import TrainingDivergedError as TrainingDivergedError
from ._loop import TrainResult as TrainResult
from ._loop import train as train
from ._precision import Precision as Precision
from ._step import TrainStep as TrainStep

__all__ = [
    "Precision",
    "TrainResult",
    "TrainStep",
    "TrainingDivergedError",
    "evaluate",
    "train",
]
