__version__ = "0.1.0"
"""The version of shapeml, as checkpoints record it in their metadata."""
