"""The version of shapeml, as checkpoints record it in their metadata."""

__version__ = "0.1.0"
