"""The quick checks of an upload before any job is queued (name, consent, lora_training's own
ingest checks, transcripts): a bad upload is a clear 400 in seconds, not a failed job an hour later."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from gateway.cloning.errors import BadUpload
from gateway.cloning.uploads import Upload
from gateway.tenants import Tenant
from gpu_worker.orpheus import SAMPLE_RATE
from hashring.records import shown_voice_id, valid_voice_id
from lora_training.errors import InputError, TranscriptError
from lora_training.settings import DataParams

if TYPE_CHECKING:
    from lora_training.ingest import Check  # called between decoded blocks; raises to stop there

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


def check_uploads(upload: Upload, data: DataParams, *, asr: bool, check: Check | None = None) -> float:
    """lora_training's own checks on the files, quickly and before anything is queued: every audio file
    decodes, has a usable sample rate, is not clipped or near-silent and holds speech; the speech in
    all of them is within `data`'s bounds; the transcripts parse and match the files (every file has
    one unless the trainers run ASR). The audio of the whole upload is capped at `max_audio_s(data)`
    seconds: refused from the headers when they declare more, else the moment decoding passes it;
    each file is streamed, keeping only its 10 ms levels. Blocking (decoding): run it on the
    gateway's DecodePool, which passes `check` (called between blocks; it raises to stop). Returns
    the seconds of speech found; raises BadUpload with lora_training's message."""
    from lora_training import transcripts as transcript_io
    from lora_training.errors import AudioTooLong
    from lora_training.ingest import check_speech_total, inspect, max_audio_s
    from lora_training.segment import active_frames, regions_of

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
        budget_s = max_audio_s(data)
        _check_declared_length(upload.audio, budget_s, data)
        speech_s = audio_s = 0.0
        for path in upload.audio:
            try:
                seen = inspect(path, data, max_s=budget_s - audio_s, check=check)
            except AudioTooLong as err:  # this file passed what the upload has left
                raise _too_long(audio_s + err.audio_s, data) from None
            audio_s += seen.duration_s
            regions = regions_of(active_frames(seen.levels), seen.samples, data)
            if not regions:
                raise _no_speech(path.name)
            speech_s += sum(end - start for start, end in regions) / SAMPLE_RATE
        check_speech_total(speech_s, data)
    except InputError as err:
        raise BadUpload(err.message, code=err.code, param="transcripts" if isinstance(err, TranscriptError)
                        else "files") from None
    return speech_s


def _check_declared_length(paths: list[Path], budget_s: float, data: DataParams) -> None:
    """Refuse, from the file headers alone, uploads that would decode to more audio than a voice may
    use (a small compressed file can hold hours of silence), before any file is decoded."""
    from lora_training.ingest import declared_duration_s

    total = sum(declared_duration_s(path) or 0.0 for path in paths)  # a file that declares nothing: decoding caps it
    if total > budget_s:
        raise _too_long(total, data)


def _too_long(audio_s: float, data: DataParams) -> InputError:
    from lora_training.errors import AudioTooLong
    from lora_training.ingest import max_audio_s

    return AudioTooLong(f"the uploads hold over {audio_s / 60:.0f} minutes of audio; the limit is "
                        f"{data.max_speech_s / 60:.0f} minutes of speech ({max_audio_s(data):.0f} s of audio per "
                        "upload, pauses included): upload fewer or shorter files", audio_s)


def _no_speech(name: str) -> InputError:
    from lora_training.errors import AudioError

    return AudioError(f"{name}: no speech was found in it (only silence or steady noise); upload recordings of "
                      "the speaker talking")
