"""voicering: real-time serving of cloned Orpheus voices. This package holds the CLI, the version and `voicering status`."""

__version__ = "0.1.0"
__all__ = ["__version__"]
