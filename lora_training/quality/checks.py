"""The upload checks, per file and per upload: measures (quality.signal) held to `CheckThresholds`,
said as `Finding`s a creator understands (what is wrong, where, what to do).

Two stages, so a bad upload is refused before a job is queued and no stage decodes twice:

- cheap (`check_levels`), on what a streamed decode keeps (`lora_training.ingest.inspect`: the 10 ms
  levels, the source rate, the running clipping statistics): sample rate, clipping, long
  silences. The gateway runs them on its bounded decode pool, with `check_upload` (speech amount).
- whole audio (`check_audio`), in the job's preprocessing after `ingest`: SNR, real bandwidth,
  loudness (BS.1770 needs K-weighted samples, which the levels are not).

`check_recording` is both, for one file held whole (the job, tests, the benchmark). `merge`
joins the gateway's findings with the job's without repeating one both made.
Reverberation (quality.rooms.reverb_s) is a warning: its estimate was checked against rooms of a
known decay time (exponentially decaying noise, docs/benchmarks.md), not against real rooms. A voice
talking under the speaker (quality.signal.voice_under) warns, and blocks when that voice is loud.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lora_training.quality.findings import Finding, clock
from lora_training.quality.rooms import reverb_s
from lora_training.quality.signal import gaps, loudness_lufs, rolloff_hz, snr_db, voice_under
from lora_training.quality.thresholds import CheckThresholds

__all__ = ["Clipping", "check_audio", "check_levels", "check_recording", "check_upload", "merge", "record"]

SAMPLE_RATE = 24000  # what ingest converts every file to
LEVEL_FRAME = SAMPLE_RATE // 100


@dataclass(frozen=True)
class Clipping:
    """A file's samples at full scale, counted on its source samples while it decoded (resampling
    smears a flat top, so clipping is only visible before it)."""

    samples: int = 0  # source samples at full scale, all channels
    longest: int = 0  # the longest run, in source frames
    longest_at_s: float = 0.0
    first_s: float = 0.0
    last_s: float = 0.0

    @classmethod
    def of(cls, seen) -> Clipping:
        """From an `ingest.Recording` or `ingest.Inspection` (its `clip`: `ingest.ClipStats`)."""
        stats = seen.clip
        if stats is None or stats.samples == 0:
            return cls()
        return cls(stats.samples, stats.longest, stats.longest_at_s, stats.first_s, stats.last_s)


def _speech_s(regions: list[tuple[int, int]]) -> float:
    return sum(end - start for start, end in regions) / SAMPLE_RATE


def check_levels(name: str, *, source_rate: int, channels: int, samples: int, regions: list[tuple[int, int]],
                 clipping: Clipping, thresholds: CheckThresholds) -> list[Finding]:
    """The cheap checks of one file: no audio needed, only what a streamed decode keeps."""
    th = thresholds
    found: list[Finding] = []
    if source_rate < th.block_sample_rate:
        found.append(Finding("block", "sample_rate", f"{name} is recorded at {source_rate} Hz; {th.block_sample_rate} "
                             "Hz or more is needed: record or export it at 24 kHz or more", name,
                             value=float(source_rate), limit=float(th.block_sample_rate)))
    elif source_rate < th.warn_sample_rate:
        found.append(Finding("warn", "sample_rate", f"{name} is recorded at {source_rate} Hz: it holds nothing above "
                             f"{source_rate / 2000:.0f} kHz and the clone will sound duller; record or export "
                             "at 24 kHz or more if you can", name, value=float(source_rate),
                             limit=float(th.warn_sample_rate)))
    found += _clipping(name, source_rate, channels, regions, clipping, th)
    found += _silences(name, samples, regions, th)
    return found


def _clipping(name: str, rate: int, channels: int, regions: list[tuple[int, int]], clip: Clipping,
              th: CheckThresholds) -> list[Finding]:
    """Block when the clipped samples are a real share of the speech (value and limit in %); warn on
    any run of them (value and limit in samples)."""
    if clip.samples == 0:
        return []
    speech = max(_speech_s(regions) * rate * max(channels, 1), 1.0)
    share = clip.samples / speech
    if share > th.block_clipped_fraction:
        return [Finding("block", "clipping", f"{share:.1%} of the speech in {name} is clipped (distorted at full "
                        f"scale) between {clock(clip.first_s)} and {clock(clip.last_s)}: record it again with the "
                        "input gain lower", name, clip.first_s, clip.last_s, 100 * share,
                        100 * th.block_clipped_fraction)]
    if clip.longest >= th.warn_clipped_run:
        end = clip.longest_at_s + clip.longest / rate
        return [Finding("warn", "clipping", f"{name} clips at {clock(clip.longest_at_s)} ({clip.longest} samples in a "
                        "row at full scale): lower the input gain next time, or cut that moment out",
                        name, clip.longest_at_s, end, float(clip.longest), float(th.warn_clipped_run))]
    return []


def _silences(name: str, samples: int, regions: list[tuple[int, int]], th: CheckThresholds) -> list[Finding]:
    """Long gaps and a mostly silent file: cut before training, so said as `fixed`."""
    found = []
    silent = gaps(regions, samples)
    for start, end in silent:
        a, b = start / SAMPLE_RATE, end / SAMPLE_RATE
        if b - a > th.long_gap_s:
            found.append(Finding("fixed", "long_silence", f"{name} has {b - a:.0f} s without speech at "
                                 f"{clock(a)}–{clock(b)}; it is cut out before training, nothing to do", name, a, b,
                                 b - a, th.long_gap_s))
    share = sum(end - start for start, end in silent) / max(samples, 1)
    if share > th.warn_silence_fraction:
        found.append(Finding("fixed", "silence_share", f"{share:.0%} of {name} is silence; the silences are cut out "
                             "before training (trimming them yourself makes the upload faster)", name, 0.0,
                             samples / SAMPLE_RATE, 100 * share, 100 * th.warn_silence_fraction))
    return found


def check_audio(name: str, audio: np.ndarray, regions: list[tuple[int, int]],
                thresholds: CheckThresholds) -> list[Finding]:
    """The checks that need the whole 24 kHz audio of one file: SNR, real bandwidth, loudness,
    reverberation, a voice under the speaker."""
    th = thresholds
    if not regions:
        return []
    span = (regions[0][0] / SAMPLE_RATE, regions[-1][1] / SAMPLE_RATE)
    found: list[Finding] = []
    snr = snr_db(audio, regions, SAMPLE_RATE).snr_db
    if np.isfinite(snr) and snr < th.warn_snr_db:
        level, limit = ("block", th.block_snr_db) if snr < th.block_snr_db else ("warn", th.warn_snr_db)
        what = "drowns" if level == "block" else "is loud behind"
        found.append(Finding(level, "low_snr", f"background noise {what} the voice in {name} (SNR {snr:.0f} dB; "
                             f"{limit:.0f} dB or more is wanted): record again in a quiet room, away from fans, "
                             "traffic and echoing walls", name, *span, snr, limit))
    rolloff = rolloff_hz(audio, SAMPLE_RATE, regions)
    if rolloff is not None and rolloff < th.warn_rolloff_hz:
        if rolloff < th.block_rolloff_hz:
            found.append(Finding("block", "narrow_band", f"{name} holds nothing above {rolloff / 1000:.1f} kHz, like a "
                                 "phone call or 8 kHz audio converted up: the clone would sound muffled; upload the "
                                 "original recording, made at 24 kHz or more", name, *span, rolloff,
                                 th.block_rolloff_hz))
        else:
            found.append(Finding("warn", "narrow_band", f"{name} holds little above {rolloff / 1000:.1f} kHz (a dull "
                                 "microphone or strong compression): a better microphone or an uncompressed export "
                                 "makes a clearer clone", name, *span, rolloff, th.warn_rolloff_hz))
    lufs = loudness_lufs(audio, SAMPLE_RATE)
    if np.isfinite(lufs):
        if lufs < th.block_loudness_lufs:
            found.append(Finding("block", "loudness", f"the speech in {name} is far too quiet ({lufs:.0f} LUFS): "
                                 "record it again closer to the microphone or with more input gain", name, *span,
                                 lufs, th.block_loudness_lufs))
        elif lufs < th.warn_loudness_low_lufs:
            found.append(Finding("warn", "loudness", f"the speech in {name} is quiet ({lufs:.0f} LUFS; "
                                 f"{th.warn_loudness_low_lufs:.0f} to {th.warn_loudness_high_lufs:.0f} is best): "
                                 "move closer to the microphone next time", name, *span, lufs,
                                 th.warn_loudness_low_lufs))
        elif lufs > th.warn_loudness_high_lufs:
            found.append(Finding("warn", "loudness", f"{name} is very loud ({lufs:.0f} LUFS; "
                                 f"{th.warn_loudness_low_lufs:.0f} to {th.warn_loudness_high_lufs:.0f} is best), "
                                 "often a sign of heavy compression or limiting: lower the gain next time", name,
                                 *span, lufs, th.warn_loudness_high_lufs))
    found += _reverb(name, audio, span, th)
    found += _voice_under(name, audio, th)
    return found


def _reverb(name: str, audio: np.ndarray, span: tuple[float, float], th: CheckThresholds) -> list[Finding]:
    decay = reverb_s(audio, SAMPLE_RATE)
    if not np.isfinite(decay) or decay < th.warn_reverb_s:
        return []
    return [Finding("warn", "reverberation", f"{name} sounds reverberant: the room rings for about {decay:.1f} s after "
                    "the voice stops (a decay time under 0.5 s sounds dry). The clone learns the room's echo too: "
                    "record in a smaller or furnished room, close to the microphone, and record the consent phrase "
                    "in the same room with the same microphone", name, *span, decay, th.warn_reverb_s)]


def _voice_under(name: str, audio: np.ndarray, th: CheckThresholds) -> list[Finding]:
    """One finding for the file, its time the first to the last moment the other voice is heard."""
    under = voice_under(audio, SAMPLE_RATE)
    if under.share < th.warn_voice_under_fraction:
        return []
    heard = under.times_s[under.flags]
    start, end = float(heard[0]), float(heard[-1])
    if under.level_db >= th.block_voice_under_level_db:
        return [Finding("block", "voice_under", f"another voice talks under yours in {name} between {clock(start)} "
                        f"and {clock(end)} (heard in {under.share:.0%} of it, {-under.level_db:.0f} dB under you: "
                        "a conversation or a TV): the clone would learn it too. Record again with nothing else "
                        "speaking in the room", name, start, end, 100 * under.share,
                        100 * th.warn_voice_under_fraction)]
    return [Finding("warn", "voice_under", f"a faint voice talks under yours in {name} between {clock(start)} and "
                    f"{clock(end)} (heard in {under.share:.0%} of it, {-under.level_db:.0f} dB under you: a TV or a "
                    "conversation in another room?): turn it off next time", name, start, end, 100 * under.share,
                    100 * th.warn_voice_under_fraction)]


def check_recording(name: str, audio: np.ndarray, source_rate: int, regions: list[tuple[int, int]],
                    thresholds: CheckThresholds, *, channels: int = 1,
                    clipping: Clipping | None = None) -> list[Finding]:
    """Every per-file check on one file held whole (24 kHz mono `audio`, its speech `regions`):
    the cheap ones and the whole-audio ones. `clipping` from the decode (`Clipping.of(recording)`);
    None: counted here on the 24 kHz samples (right for audio that was never resampled)."""
    if clipping is None:
        from lora_training.quality.signal import clip_runs

        runs = clip_runs(np.abs(audio) >= 0.999)
        clipping = Clipping(runs.count, runs.longest, max(runs.longest_at, 0) / SAMPLE_RATE,
                            max(runs.first_at, 0) / SAMPLE_RATE, max(runs.last_at, 0) / SAMPLE_RATE)
    cheap = check_levels(name, source_rate=source_rate, channels=channels, samples=audio.size, regions=regions,
                         clipping=clipping, thresholds=thresholds)
    return cheap + check_audio(name, audio, regions, thresholds)


def check_upload(speech_s: float, thresholds: CheckThresholds) -> list[Finding]:
    """The whole upload: enough speech for a close clone (DataParams.min_speech_s refuses first)."""
    if speech_s < thresholds.warn_speech_s:
        return [Finding("warn", "speech_amount", f"the uploads hold {speech_s / 60:.1f} minutes of speech; "
                        f"{thresholds.warn_speech_s / 60:.0f} minutes or more makes a closer clone: add recordings "
                        "if you can", None, value=speech_s, limit=thresholds.warn_speech_s)]
    return []


def merge(*stages: list[Finding]) -> list[Finding]:
    """The findings of several stages, in order, each once (the job re-measures what the gateway did)."""
    seen: set[tuple] = set()
    out = []
    for finding in (f for stage in stages for f in stage):
        key = (finding.level, finding.code, finding.file, _r(finding.start_s), _r(finding.end_s))
        if key not in seen:
            seen.add(key)
            out.append(finding)
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def record(*stages: list[dict], thresholds: CheckThresholds | None = None) -> dict:
    """What a voice keeps as `checks`: the stages' findings (dicts, gateway's first) merged, with
    the version of the thresholds they were held to."""
    from lora_training.quality.findings import from_dicts, to_dicts

    merged = merge(*(from_dicts(stage or []) for stage in stages))
    return {"thresholds_version": (thresholds or CheckThresholds()).version, "findings": to_dicts(merged)}
