"""Past one process: join a job (`initialize`), start one locally (`launch`, `shapeml launch`),
and write and read sharded checkpoints in which every process handles only its own shards
(`CheckpointManager`, on orbax-checkpoint: the optional `distributed` extra). See
`docs/scaling.md`.
"""

from .._job._errors import CollectiveTimeoutError as CollectiveTimeoutError
from .._job._errors import JobSaveError as JobSaveError
from ._checkpoints import CheckpointManager as CheckpointManager
from ._errors import CheckpointDirectoryError as CheckpointDirectoryError
from ._errors import InitializeError as InitializeError
from ._errors import LaunchError as LaunchError
from ._errors import OrbaxMissingError as OrbaxMissingError
from ._errors import ProcessFailedError as ProcessFailedError
from ._errors import SingleFileCheckpointError as SingleFileCheckpointError
from ._init import ProcessInfo as ProcessInfo
from ._init import initialize as initialize
from ._launch import launch as launch

__all__ = [
    "CheckpointDirectoryError",
    "CheckpointManager",
    "CollectiveTimeoutError",
    "InitializeError",
    "JobSaveError",
    "LaunchError",
    "OrbaxMissingError",
    "ProcessFailedError",
    "ProcessInfo",
    "SingleFileCheckpointError",
    "initialize",
    "launch",
]
