"""Training: the compiled step, the loop (progress, evaluation, checkpoints, resume, data
parallelism) and the Spotter job behind `shapeml train`."""

from ._loop import TrainingDivergedError as TrainingDivergedError
from ._loop import TrainResult as TrainResult
from ._loop import train as train
from ._spotter import evaluate_spotter as evaluate_spotter
from ._spotter import train_spotter as train_spotter
from ._step import TrainStep as TrainStep
from ._step import make_mesh as make_mesh

__all__ = [
    "TrainResult",
    "TrainStep",
    "TrainingDivergedError",
    "evaluate_spotter",
    "make_mesh",
    "train",
    "train_spotter",
]
