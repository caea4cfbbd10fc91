"""Trimming leading and trailing silence from clips for datasets: arrays, files, folders.

The cut keeps `margin_ms` of silence before the first and after the last speech sample and
fades that margin in and out (raised cosine, `fade_ms`, never longer than the margin), so no
click is introduced and no speech sample is changed. Every other kept sample is bit-identical to
the input. A clip with no speech is returned unchanged; its report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from silence_trim.audio_io import read_audio, write_audio
from silence_trim.detect import make_detector
from silence_trim.energy import EnergyParams
from silence_trim.errors import InvalidOptionsError, SilenceTrimError
from silence_trim.pcm import apply_fade, check_audio, check_sample_rate, to_mono_float
from silence_trim.report import DetectorName, SilenceReport
from silence_trim.vad import SileroVad
from silence_trim.vad_detector import VadParams

AUDIO_SUFFIXES = (".wav", ".flac")


def ms_to_samples(ms: float, sample_rate: int) -> int:
    return round(ms * sample_rate / 1000.0)


def check_margins(margin_ms: float, fade_ms: float, what: str = "margin_ms") -> None:
    if margin_ms < 0 or fade_ms < 0:
        raise InvalidOptionsError(f"{what} ({margin_ms}) and fade_ms ({fade_ms}) must be >= 0")
    if fade_ms > margin_ms:
        raise InvalidOptionsError(
            f"fade_ms ({fade_ms}) must not exceed {what} ({margin_ms}): the fade would reach into speech"
        )


@dataclass(frozen=True)
class TrimOptions:
    """How to trim a clip. `tail_margin_ms=None` uses `margin_ms` at both ends."""

    detector: DetectorName = "energy"
    margin_ms: float = 20.0
    tail_margin_ms: float | None = None
    fade_ms: float = 5.0
    head: bool = True
    tail: bool = True
    downmix: bool = False  # measure multi-channel audio on its mix (all channels are cut)
    energy_params: EnergyParams = field(default_factory=EnergyParams)
    vad_params: VadParams = field(default_factory=VadParams)

    def __post_init__(self) -> None:
        check_margins(self.margin_ms, self.fade_ms)
        check_margins(self.tail_margin, self.fade_ms, "tail_margin_ms")

    @property
    def tail_margin(self) -> float:
        return self.margin_ms if self.tail_margin_ms is None else self.tail_margin_ms


@dataclass(frozen=True)
class TrimResult:
    """The trimmed audio (same dtype and channels as the input) and what was removed."""

    audio: np.ndarray
    sample_rate: int
    report: SilenceReport  # of the input
    start: int  # first input sample kept
    end: int  # one past the last input sample kept
    input_samples: int

    @property
    def removed_head_ms(self) -> float:
        return round(1000.0 * self.start / self.sample_rate, 3)

    @property
    def removed_tail_ms(self) -> float:
        return round(1000.0 * (self.input_samples - self.end) / self.sample_rate, 3)

    @property
    def duration_ms(self) -> float:
        return round(1000.0 * (self.end - self.start) / self.sample_rate, 3)


def cut(samples: np.ndarray, start: int, end: int, fade_len: int) -> np.ndarray:
    """samples[start:end], faded in when something was cut before and out when something was cut after."""
    out = samples[start:end]
    if start > 0:
        out = apply_fade(out, fade_len, rising=True)
    if end < samples.shape[0]:
        out = apply_fade(out, fade_len, rising=False)
    return out


def trim(
    audio: np.ndarray, sample_rate: int, options: TrimOptions | None = None, *, vad: SileroVad | None = None
) -> TrimResult:
    """Trim leading and/or trailing silence of one clip, never inside speech."""
    options = options or TrimOptions()
    sample_rate = check_sample_rate(sample_rate)
    samples = check_audio(audio, downmix=options.downmix)
    x = to_mono_float(samples, downmix=options.downmix)
    detector = make_detector(
        options.detector, sample_rate, vad=vad, energy_params=options.energy_params, vad_params=options.vad_params
    )
    detector.push(x)
    span = detector.span()
    report = SilenceReport.from_span(detector.name, sample_rate, x.size, span)
    start, end = 0, x.size
    if span is not None:
        if options.head:
            start = max(0, span[0] - ms_to_samples(options.margin_ms, sample_rate))
        if options.tail:
            end = min(x.size, span[1] + ms_to_samples(options.tail_margin, sample_rate))
    trimmed = cut(samples, start, end, ms_to_samples(options.fade_ms, sample_rate))
    return TrimResult(audio=trimmed, sample_rate=sample_rate, report=report, start=start, end=end, input_samples=x.size)


@dataclass(frozen=True)
class FileTrim:
    """Outcome for one file of a batch: a report and what was cut, or the error that stopped it."""

    source: Path
    target: Path | None
    report: SilenceReport | None
    removed_head_ms: float = 0.0
    removed_tail_ms: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict:
        return {
            "source": str(self.source),
            "target": str(self.target) if self.target else None,
            "report": self.report.to_dict() if self.report else None,
            "removed_head_ms": self.removed_head_ms,
            "removed_tail_ms": self.removed_tail_ms,
            "error": self.error,
        }


def trim_file(
    source: str | Path, target: str | Path, options: TrimOptions | None = None, *, vad: SileroVad | None = None
) -> FileTrim:
    """Trim one file into `target` (format from its suffix; the sample format is kept when possible)."""
    source, target = Path(source), Path(target)
    decoded = read_audio(source)
    result = trim(decoded.samples, decoded.sample_rate, options, vad=vad)
    write_audio(target, result.audio, decoded.sample_rate, subtype=decoded.subtype)
    return FileTrim(source, target, result.report, result.removed_head_ms, result.removed_tail_ms)


def trim_folder(
    source_dir: str | Path,
    target_dir: str | Path,
    options: TrimOptions | None = None,
    *,
    vad: SileroVad | None = None,
    suffixes: tuple[str, ...] = AUDIO_SUFFIXES,
) -> list[FileTrim]:
    """Trim every audio file under `source_dir` into the same relative path under `target_dir`.

    A file that cannot be read or trimmed is reported with its error; the batch goes on.
    """
    options = options or TrimOptions()
    source_dir, target_dir = Path(source_dir), Path(target_dir)
    if source_dir.resolve() == target_dir.resolve():
        raise InvalidOptionsError(f"target folder {target_dir} is the source folder: choose another one")
    if options.detector == "vad" and vad is None:
        vad = SileroVad()  # one session for the whole batch
    outcomes = []
    for source in sorted(p for p in source_dir.rglob("*") if p.is_file() and p.suffix.lower() in suffixes):
        target = target_dir / source.relative_to(source_dir)
        try:
            outcomes.append(trim_file(source, target, options, vad=vad))
        except SilenceTrimError as err:
            outcomes.append(FileTrim(source, None, None, error=str(err)))
    return outcomes


def summarize(outcomes: list[FileTrim]) -> dict:
    """Totals over a batch: files, failures, clips without speech, silence removed."""
    done = [o for o in outcomes if o.error is None and o.report is not None]
    removed_head = [o.removed_head_ms for o in done]
    return {
        "files": len(outcomes),
        "trimmed": len(done),
        "failed": len(outcomes) - len(done),
        "no_speech": sum(1 for o in done if not o.report.has_speech),
        "removed_head_ms_total": round(sum(removed_head), 3),
        "removed_tail_ms_total": round(sum(o.removed_tail_ms for o in done), 3),
        "removed_head_ms_mean": round(float(np.mean(removed_head)), 3) if removed_head else 0.0,
        "leading_silence_ms_max": max((o.report.leading_silence_ms for o in done), default=0.0),
    }
