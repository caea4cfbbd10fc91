"""Uploads -> training clips: decode, check, transcribe, segment, trim, check the totals.

Files with a transcript are cut by aligning its sentences to the pauses (`segment.align`);
files without one are cut at pauses (`segment.pack`) and each piece is transcribed by the ASR
backend; a piece it is unsure of (`asr.doubt`, thresholds in DataParams) is dropped and counted
in the report (`asr_dropped`), not trained on. The result is cached under a key made of the
uploads' content, the transcripts, the data parameters and the ASR model's hash, so a retried
job (or a resumed one) never decodes or transcribes again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpu_worker.orpheus import SAMPLE_RATE
from lora_training import transcripts as transcript_io
from lora_training.asr import AsrBackend, AsrModel, doubt
from lora_training.clips import Clip, ClipSet, cut
from lora_training.errors import AudioError, ConfigError, SpeechAmountError
from lora_training.ingest import Check, check_speech_total, file_digest, ingest, max_audio_s
from lora_training.quality.job import JobChecks
from lora_training.quality.thresholds import CheckThresholds
from lora_training.segment import Piece, align, pack, speech_regions
from lora_training.settings import DataParams
from lora_training.text import normalize, sentences

Progress = Callable[[float, str], None]  # fraction done in [0, 1], what is happening
AsrFactory = Callable[[], AsrBackend]  # loads the backend the first time a file needs it


def cache_key(audio_paths: list[Path], transcripts: Path | None, data: DataParams, asr: AsrModel | None) -> str:
    """The uploads' content, their transcripts, `data` (the ASR thresholds among it), the ASR
    model's hash and the upload checks' thresholds: what decides the clips and their findings."""
    h = hashlib.sha256()
    for path in audio_paths:
        h.update(path.name.encode() + b"\0" + file_digest(path).encode() + b"\0")
    if transcripts is not None:
        h.update(b"transcripts\0" + file_digest(transcripts).encode())
    h.update(json.dumps(data.model_dump(), sort_keys=True).encode())
    h.update(b"asr\0" + json.dumps(asr.identity() if asr else None, sort_keys=True).encode())
    h.update(b"checks\0" + CheckThresholds().model_dump_json().encode())
    return h.hexdigest()[:20]


def preprocess(
    audio_paths: list[Path],
    transcripts: Path | None,
    data: DataParams,
    *,
    asr: AsrFactory | None,
    asr_model: AsrModel | None = None,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
    check: Check | None = None,
) -> ClipSet:
    """Clips for a job, from the cache when the same inputs were already prepared.

    `asr` is None when no ASR is configured: then every file needs a given transcript; else
    `asr_model` names the model it loads (the cache key and the report carry its hash). `check` is
    called before each file and each transcribed piece: what it raises ends the work there.
    """
    if not audio_paths:
        raise AudioError("no audio files were given: upload about 10 minutes of speech")
    for path in audio_paths:
        if not path.is_file():
            raise AudioError(f"{path.name}: file not found")
    cached_at = None
    if cache_dir is not None:
        cached_at = cache_dir / f"clips-{cache_key(audio_paths, transcripts, data, asr_model if asr else None)}"
        cached = ClipSet.load(cached_at)
        if cached is not None:
            return cached
    clip_set = _build(audio_paths, transcripts, data, asr, asr_model, progress or (lambda *_: None),
                      check or (lambda: None))
    if cached_at is not None:
        clip_set.save(cached_at)
    return clip_set


def _build(audio_paths: list[Path], transcripts: Path | None, data: DataParams, asr_factory: AsrFactory | None,
           asr_model: AsrModel | None, progress: Progress, check: Check) -> ClipSet:
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
    checks = JobChecks(speakers=True)  # the upload checks (lora_training.quality, a second speaker too): blocks fail the job
    asr_dropped: dict[str, dict] = {}  # file -> pieces the ASR was unsure of: count and seconds of speech
    for i, path in enumerate(audio_paths):
        check()
        progress(i / len(audio_paths), f"reading {path.name}")
        recording = ingest(path, data)
        audio_s += recording.duration_s
        regions = speech_regions(recording.audio, data)
        if not regions:
            raise AudioError(f"{path.name}: no speech was found in it (only silence or steady noise)")
        checks.file(recording, regions)
        if audio_s > max_audio_s(data):  # clearly too much: refuse before any more work
            raise SpeechAmountError(f"the uploads hold over {audio_s / 60:.0f} minutes of audio; the limit is "
                                    f"{data.max_speech_s / 60:.0f} minutes of speech: upload fewer files")
        text = matched.texts.get(path.name)
        if text is not None:
            pieces = align(sentences(normalize(text)), regions, recording.audio.size, data, name=path.name)
        else:
            progress(i / len(audio_paths), f"transcribing {path.name}")
            asr = asr or asr_factory()
            pieces, unsure = _transcribed(pack(regions, recording.audio.size, data), recording.audio, asr, data,
                                          path.name, check)
            dropped.extend(unsure)
            if unsure:
                seconds = round(sum(x["speech_s"] for x in unsure), 2)
                asr_dropped[path.name] = {"pieces": len(unsure), "seconds": seconds}
        made, left_out = cut(recording.audio, path.name, pieces, data, vad=vad)
        clips.extend(made)
        dropped.extend(left_out)
    speech_s = sum(c.duration_s for c in clips)
    try:
        check_speech_total(speech_s, data)
    except SpeechAmountError as err:
        if not asr_dropped:
            raise
        unsure_s = sum(x["seconds"] for x in asr_dropped.values())
        under = [f for f in checks.findings if f.code == "voice_under" and f.file in asr_dropped]
        if under:  # the ASR was unsure because two people talk at once: transcripts would not help
            raise SpeechAmountError(f"{err.message} ({unsure_s:.0f} s were left out because the ASR could not make "
                                    f"out the words, in {', '.join(asr_dropped)}; "
                                    + "; ".join(f.message for f in under) + ")") from None
        raise SpeechAmountError(f"{err.message} ({unsure_s:.0f} s were left out because the ASR was unsure of "
                                f"them, in {', '.join(asr_dropped)}: send transcripts for those files)") from None
    if len(clips) < 2:
        raise SpeechAmountError(f"only {len(clips)} usable clip(s) were found; record more sentences with pauses between them")
    found = checks.finish(speech_s)
    progress(1.0, f"{len(clips)} clips")
    report = {
        "checks": found,
        "files": len(audio_paths),
        "audio_minutes": round(audio_s / 60.0, 3),
        "speech_minutes": round(speech_s / 60.0, 3),
        "clips": len(clips),
        "dropped": dropped,
        "transcribed_files": list(matched.missing),
        "asr_dropped": asr_dropped,
        "asr_model": asr_model.identity() if asr_factory is not None and asr_model is not None else None,
        "preprocess_s": round(time.perf_counter() - started, 3),
    }
    return ClipSet(tuple(clips), report)


def _transcribed(pieces: list[Piece], audio, asr: AsrBackend, data: DataParams, name: str,
                 check: Check) -> tuple[list[Piece], list[dict]]:
    """The pieces with the ASR's text, and those it was unsure of (where and why, as `dropped` lists them)."""
    heard, unsure = [], []
    for piece in pieces:
        check()
        transcript = asr.transcribe(audio[piece.first:piece.last])
        reason = doubt(transcript, data)
        if reason is None:
            heard.append(replace(piece, text=normalize(transcript.text)))
        else:
            unsure.append({"file": name, "start_s": round(piece.start / SAMPLE_RATE, 2),
                           "end_s": round(piece.end / SAMPLE_RATE, 2), "speech_s": round(piece.speech_s, 2),
                           "reason": reason})
    return heard, unsure
