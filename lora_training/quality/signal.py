"""The signal measures of the upload checks: small pure numpy functions over 24 kHz mono float audio
(or its 10 ms levels), each saying in its docstring why it measures what it does.

No model, no state: the same call on the same samples gives the same figure, in the gateway and
in the job alike. Regions are speech runs [start, end) in samples (lora_training.segment).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

__all__ = ["ClipRuns", "FloorSnr", "VoiceUnder", "clip_runs", "gaps", "loudness_lufs", "region_mask", "rolloff_hz",
           "snr_db", "voice_under", "voiced_share", "wada_snr_db"]

FRAME = 240  # 10 ms at 24 kHz: the frames lora_training.segment reads speech from

SNR_CAP_DB = 100.0  # digital silence in the pauses: "no measurable noise"
ROLLOFF_SHARE = 0.999  # the real bandwidth: where all but the last 0.1 % of the speech energy lies
FFT = 1024  # 43 ms at 24 kHz: 23 Hz bins, enough to place a 4 kHz edge


def region_mask(regions: list[tuple[int, int]], total: int) -> np.ndarray:
    """[total] bool: True inside the speech regions."""
    mask = np.zeros(total, bool)
    for start, end in regions:
        mask[start:end] = True
    return mask


# -- clipping ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClipRuns:
    """Samples at full scale in one stretch of audio: how many, the longest run and where runs lie
    (sample indices of the stretch), and the run still open at its end (to carry into the next)."""

    count: int
    longest: int
    longest_at: int  # first sample of the longest run (-1: none)
    first_at: int  # first clipped sample (-1: none)
    last_at: int  # last clipped sample (-1: none)
    open_run: int  # clipped samples at the very end (a run that may go on in the next block)


def clip_runs(at_full_scale: np.ndarray, carried: int = 0) -> ClipRuns:
    """Runs of samples at full scale. Why runs: a converter that saturates holds the rail for
    several consecutive samples, while a loud but clean peak touches it for one; so a run of
    three or more is clipping even where the share of clipped samples is tiny. `carried` is a
    run that ended the previous block: it continues into this one (streamed decodes)."""
    hit = np.asarray(at_full_scale, bool)
    if not hit.any():
        return ClipRuns(0, 0, -1, -1, -1, 0)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], hit, [False]]).astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]  # [R] each
    lengths = ends - starts
    if carried and starts[0] == 0:
        lengths = lengths.copy()
        lengths[0] += carried
    k = int(np.argmax(lengths))
    open_run = int(lengths[-1]) if ends[-1] == hit.size else 0
    at = int(starts[k]) - (carried if k == 0 and starts[0] == 0 else 0)
    return ClipRuns(int(hit.sum()), int(lengths[k]), at, int(starts[0]), int(ends[-1] - 1), open_run)


# -- loudness ---------------------------------------------------------------------------------------


def loudness_lufs(audio: np.ndarray, sample_rate: int) -> float:
    """ITU-R BS.1770 integrated loudness (pyloudnorm): K-weighted and gated over 400 ms blocks, so
    pauses do not pull it down and it matches what an editor's loudness meter shows. -inf when
    the audio is shorter than one block or silent."""
    import pyloudnorm

    audio = np.asarray(audio, np.float64)
    if audio.size < int(0.4 * sample_rate):
        return float("-inf")
    with np.errstate(divide="ignore"):
        return float(pyloudnorm.Meter(sample_rate).integrated_loudness(audio))


# -- bandwidth --------------------------------------------------------------------------------------


def rolloff_hz(audio: np.ndarray, sample_rate: int, regions: list[tuple[int, int]],
               share: float = ROLLOFF_SHARE) -> float | None:
    """The frequency below which `share` of the speech's energy lies, from the mean power spectrum
    of the speech frames. Why: a file's sample rate says what it could hold, not what it holds;
    phone audio or 8 kHz audio upsampled has nothing above ~4 kHz whatever its rate, and that is
    what makes a clone sound muffled. Pauses are left out (their noise is not the voice). Why
    99.9 % and not the textbook 99 %: voiced speech holds its energy low, so clean wideband espeak-ng
    speech reaches 99 % at ~5.3 kHz (under the 7 kHz warning) but 99.9 % at ~8.4 kHz, while 8 kHz
    audio upsampled stays at ~3.7 kHz either way. None when there is under one FFT frame of speech."""
    x = np.asarray(audio, np.float64)
    starts = [s for start, end in regions for s in range(start, end - FFT + 1, FFT)]
    if not starts:
        return None
    window = np.hanning(FFT)
    frames = np.stack([x[s:s + FFT] for s in starts]) * window  # [F, FFT]
    power = (np.abs(np.fft.rfft(frames, axis=1)) ** 2).mean(axis=0)  # [FFT/2 + 1]
    power[0] = 0.0  # DC is not voice
    total = power.sum()
    if total <= 0:
        return None
    k = int(np.searchsorted(np.cumsum(power) / total, share))
    return float(min(k, power.size - 1) * sample_rate / FFT)


# -- SNR --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloorSnr:
    """The SNR figure and how it was read: `floor` (speech power over the pauses' noise power) or
    `wada` (the amplitude distribution of the speech, for files with too little pause)."""

    snr_db: float
    method: str
    noise_dbfs: float


def snr_db(audio: np.ndarray, regions: list[tuple[int, int]], sample_rate: int = 24000) -> FloorSnr:
    """SNR of a recording's speech, in dB, the larger of two estimates that both err low. The level
    noise floor: noise power is the mean of the quietest tenth of the 10 ms frames (the floor
    lora_training.segment finds speech against), speech power what the speech regions hold above it
    (power adds for independent noise); exact for read speech with pauses, too low for a file with
    no pause at all (its quietest frames are speech). WADA-SNR reads the noise from the speech's own
    amplitude distribution instead; close at low SNR, too low at high SNR for voices far from its
    Gamma model (espeak-ng saturates near 20 dB). Each rises with the true SNR, so their maximum does."""
    x = np.asarray(audio, np.float64)
    inside = region_mask(regions, x.size)
    frames = x.size // FRAME
    if not inside.any() or frames < 10:
        return FloorSnr(float("nan"), "none", float("nan"))
    power = np.mean(x[:frames * FRAME].reshape(frames, FRAME) ** 2, axis=1)  # [F]
    noise = float(np.mean(power[power <= np.percentile(power, 10)]))
    noise_dbfs = float(10 * np.log10(noise)) if noise > 0 else float("-inf")
    if noise <= 1e-12:  # digital silence in the pauses: no measurable noise
        return FloorSnr(SNR_CAP_DB, "floor", noise_dbfs)
    speech = max(float(np.mean(x[inside] ** 2)) - noise, 1e-3 * noise)
    floor = float(min(10 * np.log10(speech / noise), SNR_CAP_DB))
    wada = wada_snr_db(x[inside])
    if np.isfinite(wada) and wada > floor:
        return FloorSnr(wada, "wada", noise_dbfs)
    return FloorSnr(floor, "floor", noise_dbfs)


def wada_snr_db(x: np.ndarray) -> float:
    """WADA-SNR (Kim and Stern, Interspeech 2008): clean speech amplitudes follow a Gamma
    distribution (shape 0.4), noise is Gaussian, and the gap between log of the mean amplitude and
    mean of the log amplitude moves monotonically with the SNR of their sum. The table mapping that
    gap to dB is computed here, once, from those two distributions (seeded simulation)."""
    a = np.abs(np.asarray(x, np.float64))
    a = a[a > 0]
    if a.size < 1000:
        return float("nan")
    g = float(np.log(a.mean()) - np.log(a).mean())
    snrs, gs = _wada_table()
    return float(np.interp(g, gs, snrs))  # gs rises with SNR


@lru_cache(maxsize=1)
def _wada_table() -> tuple[np.ndarray, np.ndarray]:
    """(SNR dB [K], gap [K]) for -10...60 dB from Gamma(0.4) speech plus unit Gaussian noise."""
    rng = np.random.default_rng(21)
    n = 200_000
    speech = rng.gamma(0.4, 1.0, n) * rng.choice((-1.0, 1.0), n)
    speech /= np.sqrt(np.mean(speech ** 2))
    noise = rng.standard_normal(n)
    snrs = np.arange(-10.0, 61.0, 1.0)
    gs = []
    for snr in snrs:
        a = np.abs(speech * 10 ** (snr / 20) + noise)
        gs.append(np.log(a.mean()) - np.log(a).mean())
    return snrs, np.maximum.accumulate(np.array(gs))


# -- silences ---------------------------------------------------------------------------------------


def gaps(regions: list[tuple[int, int]], total: int) -> list[tuple[int, int]]:
    """The stretches without speech [start, end) in samples, the file's head and tail included.
    Why: long silences and a file that is mostly silence are trimmed before training (the clips
    are cut at pauses), so they cost the creator nothing but upload time: they are said as fixed."""
    out, at = [], 0
    for start, end in regions:
        if start > at:
            out.append((at, start))
        at = end
    if at < total:
        out.append((at, total))
    return out


VOICING_FRAME_S = 0.04  # two pitch periods at 50 Hz
VOICING_PEAK = 0.5  # normalised autocorrelation a voiced frame reaches at its pitch period


def voiced_share(audio: np.ndarray, sample_rate: int = 24000) -> float:
    """Share of the (non-silent) 40 ms frames that are voiced: their normalised autocorrelation
    peaks above VOICING_PEAK at a lag in the pitch range 60-400 Hz. Speech is voiced a good part of
    the time, even under noise; broadband or low-passed noise never is. 0.0 for audio too short."""
    n, hop = int(VOICING_FRAME_S * sample_rate), int(VOICING_FRAME_S * sample_rate / 2)
    if audio.size < n:
        return 0.0
    frames = np.lib.stride_tricks.sliding_window_view(np.asarray(audio, dtype=np.float64), n)[::hop]  # [F, n]
    frames = frames - frames.mean(axis=1, keepdims=True)
    energy = np.einsum("ij,ij->i", frames, frames)
    frames = frames[energy > energy.max() * 1e-3]
    if not len(frames):
        return 0.0
    power = np.abs(np.fft.rfft(frames, 2 * n, axis=1)) ** 2
    ac = np.fft.irfft(power, axis=1)[:, :n]  # [F, n] autocorrelation by lag
    lo, hi = int(sample_rate / 400), int(sample_rate / 60)
    peak = ac[:, lo:hi].max(axis=1) / np.maximum(ac[:, 0], 1e-12)
    return float(np.mean(peak > VOICING_PEAK))


# -- a voice under the voice ------------------------------------------------------------------------

UNDER_BELOW_DB = 15.0  # a 40 ms frame this far under the speech's loud level (95th percentile) is "quiet"
UNDER_SPAN_DB = 60.0  # ...and no further under it (digital silence and a faint floor are not a voice)
UNDER_HIGHPASS_HZ = 150.0  # mains hum (50/60 Hz) is periodic too: its band is left out of the pitch test
TAIL_RISE_DB = 1.0  # a room's echo after the voice only falls: a rise of this much ends it


@dataclass(frozen=True)
class VoiceUnder:
    """Where a quieter voice is heard in a recording's quiet moments: `share` of the recording's
    40 ms frames (hop 20 ms) that are quiet and voiced, and the frames' times (s) [F] and flags [F]."""

    share: float
    level_db: float  # the voice's median level against the speaker's loud level (dB, negative); -inf: none
    times_s: np.ndarray
    flags: np.ndarray


def voice_under(audio: np.ndarray, sample_rate: int = 24000) -> VoiceUnder:
    """A second voice underneath the speaker (a conversation, a TV), heard where the speaker is
    quiet: between words and sentences the level falls UNDER_BELOW_DB or more; in a clean take, or
    one with steady noise, those moments hold silence, breath or noise, which are not voiced; a
    voice talking underneath fills them with voiced sound (a pitch peak in 60-400 Hz above
    VOICING_PEAK, hum's band left out). The echo of the speaker's own voice in a reverberant room
    is quiet and voiced too, but only falls after the voice stops: those frames are left out
    (`_tails`). Measured on espeak-ng mixtures (docs/benchmarks.md, "Clone checks"): clean, white
    noise at 10-30 dB, hum and reverberant speech <= 0.063; a voice 20-30 dB under the speaker
    0.135-0.21, 12 dB under 0.048-0.092 (seen in some takes). A voice as loud as the speaker
    (0-6 dB) leaves no quiet moment and reads like a clean take: this measure does not see it."""
    x = np.asarray(audio, np.float64)
    n, hop = int(VOICING_FRAME_S * sample_rate), int(VOICING_FRAME_S * sample_rate / 2)
    if x.size < n:
        return VoiceUnder(0.0, float("-inf"), np.zeros(0), np.zeros(0, bool))
    frames = np.lib.stride_tricks.sliding_window_view(x, n)[::hop]  # [F, n]
    frames = frames - frames.mean(axis=1, keepdims=True)
    level = 10 * np.log10(np.einsum("ij,ij->i", frames, frames) / n + 1e-20)  # [F] dB
    loud = float(np.percentile(level, 95))
    quiet = (level < loud - UNDER_BELOW_DB) & (level > loud - UNDER_SPAN_DB)
    spectrum = np.fft.rfft(frames, 2 * n, axis=1)  # [F, n + 1]
    spectrum[:, :int(UNDER_HIGHPASS_HZ * 2 * n / sample_rate) + 1] = 0.0
    ac = np.fft.irfft(np.abs(spectrum) ** 2, axis=1)[:, :n]  # [F, n] autocorrelation by lag
    lo, hi = int(sample_rate / 400), int(sample_rate / 60)
    voiced = ac[:, lo:hi].max(axis=1) / np.maximum(ac[:, 0], 1e-20) > VOICING_PEAK
    flags = quiet & voiced & ~_tails(level, loud - UNDER_BELOW_DB)
    times = (np.arange(frames.shape[0]) * hop + n / 2) / sample_rate
    under = float(np.median(level[flags]) - loud) if flags.any() else float("-inf")
    return VoiceUnder(float(np.mean(flags)), under, times, flags)


def _tails(level: np.ndarray, loud_from: float) -> np.ndarray:
    """[F] True for the frames of a room's echo: those after a loud frame (level >= `loud_from`)
    whose level has only fallen since (no rise of TAIL_RISE_DB). A reverberant room's tail of the
    speaker's own voice is quiet and voiced, like a voice underneath, but never rises again."""
    tail = np.zeros(level.size, bool)
    for i in range(1, level.size):
        if level[i] < loud_from and (level[i - 1] >= loud_from or tail[i - 1]):
            tail[i] = level[i] < level[i - 1] + TAIL_RISE_DB
    return tail
