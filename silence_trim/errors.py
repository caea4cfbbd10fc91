"""Errors raised by silence_trim.

    SilenceTrimError (ValueError)
     ├── InvalidAudioError        the samples cannot be read as PCM audio
     │    ├── UnsupportedDtypeError   dtype is not int16, int32, float32 or float64
     │    ├── ChannelLayoutError      more than one channel without downmix=True, or a bad shape
     │    └── NonFiniteAudioError     NaN or infinite samples
     ├── AudioFileError           a file cannot be read or written (missing, corrupt, unknown format)
     ├── InvalidOptionsError      an option is out of range (negative margin, fade longer than margin...)
     ├── StreamClosedError        a stream trimmer was pushed to after flush()
     └── VadUnavailableError      the silero-vad model file or onnxruntime is not installed

All of them are ValueErrors: bad input, never worth retrying with the same input.
Foreign errors (soundfile, onnxruntime) are mapped here at the I/O boundary.
"""

from __future__ import annotations


class SilenceTrimError(ValueError):
    """Base class of every error silence_trim raises."""


class InvalidAudioError(SilenceTrimError):
    """The samples cannot be interpreted as PCM audio."""


class UnsupportedDtypeError(InvalidAudioError):
    """The array dtype is not one of int16, int32, float32, float64."""


class ChannelLayoutError(InvalidAudioError):
    """Multi-channel audio without downmix=True, or an array that is not (samples,) / (samples, channels)."""


class NonFiniteAudioError(InvalidAudioError):
    """The audio holds NaN or infinite samples."""


class AudioFileError(SilenceTrimError):
    """An audio file cannot be read or written."""


class InvalidOptionsError(SilenceTrimError):
    """An option is out of its valid range."""


class VadUnavailableError(SilenceTrimError):
    """The silero-vad model file or onnxruntime is missing."""


class StreamClosedError(SilenceTrimError):
    """A stream trimmer was used after flush()."""
