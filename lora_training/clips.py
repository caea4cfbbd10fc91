"""Training clips: pieces of a recording with their text, head and tail silence trimmed.

Trimming is silence_trim's (its energy detector by default, or its silero VAD for noisy
recordings: `trim_detector`; `trim_margin_ms` kept at each end, faded), so a
clone learns to start speaking at once: base Orpheus voices open with ~600 ms of silence, and
a voice trained on trimmed clips does not. Head silence is measured before and after trimming
with the same detector and kept with each clip (it goes into the voice's metadata and the bench).

A `ClipSet` is saved as float32 wav files plus `clips.json`, written to a temporary directory
and renamed into place, so a reader sees either the whole set or none of it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training.segment import Piece
from lora_training.settings import DataParams
from silence_trim.detect import measure
from silence_trim.trim import TrimOptions, trim
from silence_trim.vad import SileroVad

INDEX = "clips.json"


@dataclass(frozen=True)
class Clip:
    clip_id: str
    source: str  # upload file name
    text: str  # normalized
    audio: np.ndarray = field(repr=False)  # [n] float32, 24 kHz, trimmed
    head_silence_before_ms: float
    head_silence_after_ms: float

    @property
    def duration_s(self) -> float:
        return self.audio.size / SAMPLE_RATE

    def meta(self) -> dict:
        out = asdict(self)
        out.pop("audio")
        out["samples"] = int(self.audio.size)
        return out


@dataclass(frozen=True)
class TrimmedAudio:
    audio: np.ndarray
    head_before_ms: float
    head_after_ms: float
    has_speech: bool


def trim_clip(audio: np.ndarray, data: DataParams, *, vad: SileroVad | None = None) -> TrimmedAudio:
    """Cut head and tail silence down to the margin; measure head silence before and after.

    `vad`: one SileroVad shared by all clips when data.trim_detector is "vad".
    """
    options = TrimOptions(detector=data.trim_detector, margin_ms=data.trim_margin_ms, fade_ms=data.trim_fade_ms)
    result = trim(audio, SAMPLE_RATE, options, vad=vad)
    after = (measure(result.audio, SAMPLE_RATE, data.trim_detector, vad=vad) if result.report.has_speech
             else result.report)
    return TrimmedAudio(np.ascontiguousarray(result.audio, dtype=np.float32), result.report.leading_silence_ms,
                        after.leading_silence_ms, result.report.has_speech)


def cut(audio: np.ndarray, source: str, pieces: Iterable[Piece], data: DataParams, *,
        vad: SileroVad | None = None) -> tuple[list[Clip], list[dict]]:
    """Trimmed clips of the pieces, and the pieces dropped with the reason (no text, no speech,
    too short to learn from, or longer than clip_max_s)."""
    stem = Path(source).stem
    clips, dropped = [], []
    for i, piece in enumerate(pieces):
        where = {"file": source, "start_s": round(piece.start / SAMPLE_RATE, 2), "end_s": round(piece.end / SAMPLE_RATE, 2)}
        if not piece.text:
            dropped.append({**where, "reason": "no transcript"})
            continue
        trimmed = trim_clip(audio[piece.start:piece.end], data, vad=vad)
        seconds = trimmed.audio.size / SAMPLE_RATE
        if not trimmed.has_speech or seconds < data.clip_drop_s:
            dropped.append({**where, "reason": f"no speech or shorter than {data.clip_drop_s} s"})
        elif seconds > data.clip_max_s + 2 * data.trim_margin_ms / 1000.0:
            dropped.append({**where, "reason": f"one sentence of {seconds:.0f} s, over clip_max_s ({data.clip_max_s:.0f} s)"})
        else:
            clips.append(Clip(f"{stem}-{i:04d}", source, piece.text, trimmed.audio, trimmed.head_before_ms,
                              trimmed.head_after_ms))
    return clips, dropped


@dataclass(frozen=True)
class ClipSet:
    clips: tuple[Clip, ...]
    report: dict  # what preprocessing found: files, minutes, dropped pieces, transcripts source

    @property
    def speech_s(self) -> float:
        return sum(c.duration_s for c in self.clips)

    def save(self, directory: Path) -> None:
        """Write atomically: a temporary sibling directory renamed to `directory`."""
        import soundfile as sf

        tmp = directory.with_name(f".{directory.name}.{uuid.uuid4().hex[:8]}")
        (tmp / "audio").mkdir(parents=True)
        try:
            for clip in self.clips:
                sf.write(str(tmp / "audio" / f"{clip.clip_id}.wav"), clip.audio, SAMPLE_RATE, subtype="FLOAT")
            index = {"clips": [c.meta() for c in self.clips], "report": self.report}
            (tmp / INDEX).write_text(json.dumps(index, indent=1))
            if directory.exists():
                shutil.rmtree(directory)
            os.rename(tmp, directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, directory: Path) -> ClipSet | None:
        """A saved set, or None when there is none (or it is incomplete)."""
        import soundfile as sf

        try:
            index = json.loads((directory / INDEX).read_text())
            clips = []
            for meta in index["clips"]:
                audio, rate = sf.read(str(directory / "audio" / f"{meta['clip_id']}.wav"), dtype="float32")
                if rate != SAMPLE_RATE or audio.size != meta["samples"]:
                    return None
                clips.append(Clip(meta["clip_id"], meta["source"], meta["text"], audio,
                                  meta["head_silence_before_ms"], meta["head_silence_after_ms"]))
        except (OSError, KeyError, ValueError, sf.SoundFileError):
            return None
        return cls(tuple(clips), index["report"])
