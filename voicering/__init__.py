"""voicering: real-time serving of cloned Orpheus voices. This package holds only the CLI and version."""

__version__ = "0.1.0"
__all__ = ["__version__"]
