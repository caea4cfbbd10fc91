"""The quick checks of an upload before any job is queued (name, consent, lora_training's own
ingest checks, transcripts, and the cheap upload checks of lora_training.quality: sample rate,
clipping, long silences, speech amount): a bad upload is a clear 400 in seconds, not a failed job
an hour later. Every quality block of an upload is in that one 400 (`upload_checks`, with
`findings`); its warnings and fixes travel with the job (JobSpec.upload_checks)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from gateway.cloning.errors import BadUpload
from gateway.cloning.uploads import Upload
from gateway.tenants import Tenant
from gpu_worker.protocol import SAMPLE_RATE
from hashring.records import shown_voice_id, valid_voice_id
from lora_training.consent import MAX_CONSENT_AUDIO_S
from lora_training.errors import InputError, TranscriptError
from lora_training.quality.findings import Finding, blocks, to_dicts
from lora_training.quality.thresholds import CheckThresholds
from lora_training.settings import DataParams

if TYPE_CHECKING:
    from lora_training.ingest import Check  # called between decoded blocks; raises to stop there

__all__ = ["MAX_CONSENT_AUDIO_S", "MAX_CONSENT_CHARS", "SIDECAR_SUFFIX", "TRANSCRIPT_SUFFIXES", "UploadChecked",
           "check_consent", "check_consent_audio", "check_name", "check_spoken_consent", "check_uploads"]


MAX_CONSENT_CHARS: Final = 4096  # what the tenant layer stores
TRANSCRIPT_SUFFIXES: Final = (".json", ".csv", ".tsv", ".txt")
SIDECAR_SUFFIX: Final = ".txt"


@dataclass(frozen=True)
class UploadChecked:
    """What the gateway's checks found in an upload that passed them: its speech, and the warnings
    and fixes (no blocks) the job carries on (JobSpec.upload_checks)."""

    speech_s: float
    findings: tuple[Finding, ...] = ()

    def to_dicts(self) -> list[dict]:
        return to_dicts(list(self.findings))


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


def check_spoken_consent(upload: Upload) -> str:
    """The upload's consent_id, if it sent the fields spoken consent needs, else BadUpload saying which."""
    if upload.consent is not None:
        raise BadUpload("your account's consent policy is spoken: instead of a typed 'consent', send 'consent_audio' "
                        "(the speaker reading the text_to_read of POST /v1/voices/consent) and 'consent_id'",
                        code="consent_policy", param="consent")
    if upload.consent_audio is None:
        raise BadUpload("a clone needs the speaker's spoken consent: ask POST /v1/voices/consent for a phrase, record "
                        "the speaker reading its text_to_read and send it as the file 'consent_audio' with "
                        "'consent_id'", code="consent_required", param="consent_audio")
    if not upload.consent_id:
        raise BadUpload("send 'consent_id' (from POST /v1/voices/consent) with the consent recording",
                        code="consent_required", param="consent_id")
    return upload.consent_id


def check_consent_audio(upload: Upload, data: DataParams, check: Check | None = None) -> float:
    """The consent recording decodes and is usable (lora_training's ingest checks: rate, clipping,
    level), holds speech, and is at most MAX_CONSENT_AUDIO_S long (refused from its header, else the
    moment decoding passes it). Blocking: on the DecodePool, like check_uploads. Returns its seconds
    of speech. Whether it says the phrase in the uploads' voice is the training job's check."""
    from lora_training.errors import AudioTooLong
    from lora_training.ingest import inspect
    from lora_training.segment import active_frames, regions_of

    path = upload.consent_audio
    if path is None:
        return 0.0
    try:
        seen = inspect(path, data, max_s=MAX_CONSENT_AUDIO_S, check=check)
    except AudioTooLong:
        raise BadUpload(f"the consent recording is over {MAX_CONSENT_AUDIO_S:g} s: record only the text_to_read "
                        "of the consent phrase", code="consent_audio_too_long", param="consent_audio") from None
    except InputError as err:
        raise BadUpload(f"the consent recording: {err.message.replace(path.name + ': ', '')}", code=err.code,
                        param="consent_audio", detail=err.detail) from None
    regions = regions_of(active_frames(seen.levels), seen.samples, data)
    if not regions:
        raise BadUpload("the consent recording holds no speech (only silence or steady noise): record the speaker "
                        "reading the text_to_read", code="bad_audio", param="consent_audio")
    return sum(end - start for start, end in regions) / SAMPLE_RATE


def check_uploads(upload: Upload, data: DataParams, *, asr: bool, check: Check | None = None,
                  thresholds: CheckThresholds | None = None) -> UploadChecked:
    """lora_training's own checks on the files, quickly and before anything is queued: every audio file
    decodes, has a usable sample rate, is not clipped or near-silent and holds speech; the speech in
    all of them is within `data`'s bounds; the transcripts parse and match the files (every file has
    one unless the trainers run ASR). The audio of the whole upload is capped at `max_audio_s(data)`
    seconds: refused from the headers when they declare more, else the moment decoding passes it;
    each file is streamed, keeping only its 10 ms levels. Blocking (decoding): run it on the
    gateway's DecodePool, which passes `check` (called between blocks; it raises to stop). Then the
    cheap quality checks (`lora_training.quality.checks.check_levels` per file, `check_upload`):
    any block is one BadUpload `upload_checks` listing them all. Returns the seconds of speech found
    and the other findings; raises BadUpload with lora_training's message."""
    from lora_training import transcripts as transcript_io
    from lora_training.errors import AudioTooLong
    from lora_training.ingest import check_speech_total, inspect, max_audio_s
    from lora_training.quality.checks import Clipping, check_levels, check_upload
    from lora_training.segment import active_frames, regions_of

    thresholds = thresholds or CheckThresholds()
    findings: list[Finding] = []

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
            findings += check_levels(path.name, source_rate=seen.source_rate, channels=seen.channels,
                                     samples=seen.samples, regions=regions, clipping=Clipping.of(seen),
                                     thresholds=thresholds)
        check_speech_total(speech_s, data)
        findings += check_upload(speech_s, thresholds)
    except InputError as err:
        raise BadUpload(err.message, code=err.code, param="transcripts" if isinstance(err, TranscriptError)
                        else "files", detail=err.detail) from None
    refused = blocks(findings)
    if refused:
        raise BadUpload(_blocks_message(refused), code="upload_checks", param="files", findings=to_dicts(refused))
    return UploadChecked(speech_s, tuple(findings))


def _blocks_message(refused: list[Finding]) -> str:
    """One sentence per block, the first few in full: `findings` holds every one."""
    shown = " ".join(f.message.rstrip(".") + "." for f in refused[:3])
    more = f" ({len(refused) - 3} more in 'findings')" if len(refused) > 3 else ""
    return f"the recordings cannot make a good clone: {shown}{more}"


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
