"""PCM sample arrays: validation, conversion to float for analysis, and fades.

Analysis always runs on mono float64 in [-1, 1]; the audio that is written or streamed keeps its
own dtype and layout, so samples that are kept are kept bit for bit.
"""

from __future__ import annotations

import numpy as np

from silence_trim.errors import ChannelLayoutError, InvalidAudioError, NonFiniteAudioError, UnsupportedDtypeError

# Full-scale divisor per integer dtype; float audio is already in [-1, 1].
_INT_SCALE = {np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0}
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_MAX_CHANNELS = 64


def check_sample_rate(sample_rate: int) -> int:
    """Return `sample_rate` as an int, or raise InvalidAudioError when it is not a positive integer."""
    if isinstance(sample_rate, bool) or not float(sample_rate).is_integer() or sample_rate <= 0:
        raise InvalidAudioError(f"sample rate must be a positive integer number of Hz, got {sample_rate!r}")
    return int(sample_rate)


def check_audio(audio: np.ndarray, *, downmix: bool = False) -> np.ndarray:
    """Validate a sample array and return it unchanged (as an ndarray).

    Accepts int16 or int32 PCM and float32/float64 samples, shaped (samples,) or
    (samples, channels) as soundfile returns them. More than one channel needs downmix=True.
    """
    a = np.asarray(audio)
    if a.dtype not in _INT_SCALE and a.dtype not in _FLOAT_DTYPES:
        raise UnsupportedDtypeError(
            f"audio dtype {a.dtype} is not supported: pass int16 or int32 PCM, or float32/float64 samples in [-1, 1]"
        )
    if a.ndim == 0 or a.ndim > 2:
        raise ChannelLayoutError(f"audio must be 1-D (samples,) or 2-D (samples, channels), got shape {a.shape}")
    if a.ndim == 2:
        channels = a.shape[1]
        if channels > _MAX_CHANNELS:
            raise ChannelLayoutError(
                f"2-D audio must be (samples, channels) as soundfile returns it; got shape {a.shape}: pass audio.T"
            )
        if channels > 1 and not downmix:
            kind = "stereo" if channels == 2 else f"{channels}-channel"
            raise ChannelLayoutError(f"audio is {kind}: pass mono or set downmix=True")
    if a.dtype in _FLOAT_DTYPES and a.size:
        finite = np.isfinite(a)
        if not finite.all():
            bad = np.flatnonzero(~finite.reshape(a.shape[0], -1).all(axis=1))
            raise NonFiniteAudioError(
                f"audio has {bad.size} sample(s) that are NaN or infinite (first at sample {bad[0]}): "
                "clean the source before measuring or trimming"
            )
    return a


def to_mono_float(audio: np.ndarray, *, downmix: bool = False) -> np.ndarray:
    """Validated audio as mono float64 in [-1, 1]; channels are averaged when downmix=True."""
    a = check_audio(audio, downmix=downmix)
    x = a.astype(np.float64)
    if a.dtype in _INT_SCALE:
        x /= _INT_SCALE[a.dtype]
    if x.ndim == 2:
        x = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    return np.ascontiguousarray(x)


def fade_gains(length: int) -> np.ndarray:
    """Raised-cosine gains rising from just above 0 to just below 1 over `length` samples."""
    if length <= 0:
        return np.ones(0)
    return 0.5 - 0.5 * np.cos(np.pi * (np.arange(length) + 0.5) / length)


def apply_fade(samples: np.ndarray, length: int, *, rising: bool) -> np.ndarray:
    """A copy of `samples` ((n,) or (n, channels)) with a fade over its first (rising) or last samples.

    Integer PCM is faded in float and rounded back, so only the faded samples change.
    """
    out = np.array(samples, copy=True)
    length = min(length, out.shape[0])
    if length == 0:
        return out
    gains = fade_gains(length) if rising else fade_gains(length)[::-1]
    if out.ndim == 2:
        gains = gains[:, None]
    region = slice(0, length) if rising else slice(out.shape[0] - length, out.shape[0])
    faded = out[region].astype(np.float64) * gains
    if out.dtype in _INT_SCALE:
        info = np.iinfo(out.dtype)
        faded = np.clip(np.rint(faded), info.min, info.max)
    out[region] = faded.astype(out.dtype)
    return out
