"""Uploads -> training clips: decode, check, transcribe, segment, trim, check the totals.

Files with a transcript are cut by aligning its sentences to the pauses (`segment.align`);
files without one are cut at pauses (`segment.pack`) and each piece is transcribed by the ASR
backend. The result is cached under a key made of the uploads' content, the transcripts and the
data parameters, so a retried job (or a resumed one) never decodes or transcribes again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path

from lora_training import transcripts as transcript_io
from lora_training.asr import AsrBackend
from lora_training.clips import Clip, ClipSet, cut
from lora_training.errors import AudioError, ConfigError, SpeechAmountError
from lora_training.ingest import Check, check_speech_total, file_digest, ingest, max_audio_s
from lora_training.segment import Piece, align, pack, speech_regions
from lora_training.settings import DataParams
from lora_training.text import normalize, sentences

Progress = Callable[[float, str], None]  # fraction done in [0, 1], what is happening
AsrFactory = Callable[[], AsrBackend]  # loads the backend the first time a file needs it


def cache_key(audio_paths: list[Path], transcripts: Path | None, data: DataParams, asr_name: str | None) -> str:
    h = hashlib.sha256()
    for path in audio_paths:
        h.update(path.name.encode() + b"\0" + file_digest(path).encode() + b"\0")
    if transcripts is not None:
        h.update(b"transcripts\0" + file_digest(transcripts).encode())
    h.update(json.dumps(data.model_dump(), sort_keys=True).encode())
    h.update(f"asr={asr_name}".encode())
    return h.hexdigest()[:20]


def preprocess(
    audio_paths: list[Path],
    transcripts: Path | None,
    data: DataParams,
    *,
    asr: AsrFactory | None,
    asr_name: str | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    check: Check | None = None,
) -> ClipSet:
    """Clips for a job, from the cache when the same inputs were already prepared.

    `asr` is None when no ASR is configured: then every file needs a given transcript. `check` is
    called before each file and each transcribed piece: what it raises ends the work there.
    """
    if not audio_paths:
        raise AudioError("no audio files were given: upload about 10 minutes of speech")
    for path in audio_paths:
        if not path.is_file():
            raise AudioError(f"{path.name}: file not found")
    cached_at = None
    if cache_dir is not None:
        cached_at = cache_dir / f"clips-{cache_key(audio_paths, transcripts, data, asr_name if asr else None)}"
        cached = ClipSet.load(cached_at)
        if cached is not None:
            return cached
    clip_set = _build(audio_paths, transcripts, data, asr, progress or (lambda *_: None), check or (lambda: None))
    if cached_at is not None:
        clip_set.save(cached_at)
    return clip_set


def _build(audio_paths: list[Path], transcripts: Path | None, data: DataParams, asr_factory: AsrFactory | None,
           progress: Progress, check: Check) -> ClipSet:
    started = time.perf_counter()
    matched = transcript_io.load(transcripts, audio_paths, allow_missing=asr_factory is not None)
    asr: AsrBackend | None = None
    vad = None
    if data.trim_detector == "vad":
        from silence_trim.errors import VadUnavailableError
        from silence_trim.vad import SileroVad

        try:
            vad = SileroVad()  # one onnxruntime session for every clip
        except VadUnavailableError as err:
            raise ConfigError(f"trim_detector 'vad' is unavailable here: {err}") from None
    clips: list[Clip] = []
    audio_s = 0.0
    dropped: list[dict] = []
    for i, path in enumerate(audio_paths):
        check()
        progress(i / len(audio_paths), f"reading {path.name}")
        recording = ingest(path, data)
        audio_s += recording.duration_s
        regions = speech_regions(recording.audio, data)
        if not regions:
            raise AudioError(f"{path.name}: no speech was found in it (only silence or steady noise)")
        if audio_s > max_audio_s(data):  # clearly too much: refuse before any more work
            raise SpeechAmountError(f"the uploads hold over {audio_s / 60:.0f} minutes of audio; the limit is "
                                    f"{data.max_speech_s / 60:.0f} minutes of speech: upload fewer files")
        text = matched.texts.get(path.name)
        if text is not None:
            pieces = align(sentences(normalize(text)), regions, recording.audio.size, data, name=path.name)
        else:
            asr = asr or asr_factory()
            pieces = []
            for piece in pack(regions, recording.audio.size, data):
                check()
                pieces.append(_transcribed(piece, recording.audio, asr))
        made, left_out = cut(recording.audio, path.name, pieces, data, vad=vad)
        clips.extend(made)
        dropped.extend(left_out)
    speech_s = sum(c.duration_s for c in clips)
    check_speech_total(speech_s, data)
    if len(clips) < 2:
        raise SpeechAmountError(f"only {len(clips)} usable clip(s) were found; record more sentences with pauses between them")
    progress(1.0, f"{len(clips)} clips")
    report = {
        "files": len(audio_paths),
        "audio_minutes": round(audio_s / 60.0, 3),
        "speech_minutes": round(speech_s / 60.0, 3),
        "clips": len(clips),
        "dropped": dropped,
        "transcribed_files": list(matched.missing),
        "preprocess_s": round(time.perf_counter() - started, 3),
    }
    return ClipSet(tuple(clips), report)


def _transcribed(piece: Piece, audio, asr: AsrBackend) -> Piece:
    text = normalize(asr.transcribe(audio[piece.first:piece.last]))
    return Piece(piece.start, piece.end, piece.first, piece.last, text or None)
