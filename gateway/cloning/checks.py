"""The quick checks of an upload before any job is queued (name, consent, lora_training's own
ingest checks, transcripts): a bad upload is a clear 400 in seconds, not a failed job an hour later."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import field
from pathlib import Path
from typing import Final

from gateway.cloning.errors import BadUpload
from gateway.cloning.uploads import Upload
from gateway.tenants import Tenant
from gpu_worker.orpheus import SAMPLE_RATE
from hashring.records import shown_voice_id, valid_voice_id
from lora_training.errors import InputError, TranscriptError
from lora_training.settings import DataParams

__all__ = ["MAX_CONSENT_CHARS", "SIDECAR_SUFFIX", "TRANSCRIPT_SUFFIXES", "check_consent", "check_name", "check_uploads"]


MAX_CONSENT_CHARS: Final = 4096  # what the tenant layer stores
TRANSCRIPT_SUFFIXES: Final = (".json", ".csv", ".tsv", ".txt")
SIDECAR_SUFFIX: Final = ".txt"


def check_name(tenant: Tenant, name: str | None, base_voices: Iterable[str]) -> str:
    """`name` if it can name one of the tenant's voices, else BadUpload saying what is allowed."""
    if name is None or not name.strip():
        raise BadUpload("give the voice a name: the form field 'name'", code="missing_field", param="name")
    if "/" in name or not valid_voice_id(f"{tenant.id}/{name}"):
        raise BadUpload(f"voice name {shown_voice_id(name)} is not usable: use 1-128 letters, digits or '._-', "
                        "starting with a letter or digit", code="invalid_name", param="name")
    if name in tuple(base_voices):
        raise BadUpload(f"{name!r} is a base voice of the platform; pick another name for your clone",
                        code="reserved_name", param="name")
    return name


def check_consent(consent: str | None) -> str:
    if consent is None or not consent.strip():
        raise BadUpload("a clone needs the speaker's consent: send the form field 'consent' with their statement "
                        "(or a reference to the signed record)", code="consent_required", param="consent")
    if len(consent) > MAX_CONSENT_CHARS:
        raise BadUpload(f"the consent statement is {len(consent)} characters; the most is {MAX_CONSENT_CHARS}: "
                        "store the full record elsewhere and send a reference to it", code="consent_too_long",
                        param="consent")
    return consent


def check_uploads(upload: Upload, data: DataParams, *, asr: bool) -> float:
    """lora_training's own checks on the files, quickly and before anything is queued: every audio file
    decodes, has a usable sample rate, is not clipped or near-silent and holds speech; the speech in
    all of them is within `data`'s bounds; the transcripts parse and match the files (every file has
    one unless the trainers run ASR). Blocking (decoding): run it in a thread. Returns the seconds
    of speech found; raises BadUpload with lora_training's message."""
    from lora_training import transcripts as transcript_io
    from lora_training.ingest import check_speech_total, ingest
    from lora_training.segment import speech_regions

    if not upload.audio:
        raise BadUpload("no audio was uploaded: send the recordings as form field 'files' (one or more)",
                        code="missing_field", param="files")
    audio_names = {p.stem: p.name for p in upload.audio}
    stray = [p.name for p in upload.sidecars if p.stem not in audio_names]
    if stray:
        raise BadUpload(f"{', '.join(stray)} names no uploaded audio file: a transcript sent among the files is "
                        "named after its audio file (take1.wav -> take1.txt)", code="transcripts",
                        param="files")
    try:
        matched = transcript_io.load(upload.transcripts, upload.audio, allow_missing=True)
        if matched.missing and not asr:
            raise TranscriptError(
                f"audio files without a transcript: {', '.join(matched.missing[:5])}"
                f"{' and more' if len(matched.missing) > 5 else ''}. Send 'transcripts': a JSON manifest "
                '({"take1.wav": "what is said"}), a CSV (audio,text), or send take1.txt beside take1.wav '
                "among the files")
        _check_declared_length(upload.audio, data)
        speech_s = audio_s = 0.0
        for path in upload.audio:
            recording = ingest(path, data)
            audio_s += recording.duration_s
            if audio_s > data.max_speech_s * 1.5:
                raise _too_long(audio_s, data)
            regions = speech_regions(recording.audio, data)
            if not regions:
                raise _no_speech(path.name)
            speech_s += sum(end - start for start, end in regions) / SAMPLE_RATE
        check_speech_total(speech_s, data)
    except InputError as err:
        raise BadUpload(err.message, code=err.code, param="transcripts" if isinstance(err, TranscriptError)
                        else "files") from None
    return speech_s


def _check_declared_length(paths: list[Path], data: DataParams) -> None:
    """Refuse, from the file headers alone, uploads that would decode to far more audio than a voice
    may use (a small compressed file can hold hours of silence; decoding it would fill memory)."""
    import soundfile as sf

    total = 0.0
    for path in paths:
        try:
            total += sf.info(str(path)).duration
        except Exception:  # not a libsndfile format (m4a...) or unreadable: decoding will say
            continue
    if total > data.max_speech_s * 1.5:
        raise _too_long(total, data)


def _too_long(audio_s: float, data: DataParams) -> InputError:
    from lora_training.errors import SpeechAmountError

    return SpeechAmountError(f"the uploads hold over {audio_s / 60:.0f} minutes of audio; the limit is "
                             f"{data.max_speech_s / 60:.0f} minutes of speech: upload fewer files")


def _no_speech(name: str) -> InputError:
    from lora_training.errors import AudioError

    return AudioError(f"{name}: no speech was found in it (only silence or steady noise); upload recordings of "
                      "the speaker talking")
