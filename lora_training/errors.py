"""Errors raised while turning a creator's audio into a published voice.

    TrainingError                      every error a job can fail with; `retryable` says whether
    │                                  running the same job again may succeed
    ├── InputError (not retryable)     the creator's input is unusable; the message says what to fix
    │   ├── AudioError                 a file cannot be decoded, or its audio is unusable
    │   ├── SpeechAmountError          too little or too much speech in total
    │   │   └── AudioTooLong           more audio than a voice may use (decoding stops at the cap)
    │   ├── TranscriptError            transcripts missing, unreadable or not matching the files
    │   ├── UploadCheckError           the upload checks found blocks (noise, clipping...): all listed
    │   ├── ConsentError               the spoken consent does not say its phrase, or not in the uploads' voice
    │   ├── VoiceExistsError           the tenant already has a voice with that name
    │   └── JobExistsError             a job with that id is still owed or already ended
    ├── ConfigError (not retryable)    this trainer is misconfigured (missing model, ASR backend...)
    ├── JobStopped (not retryable)     the job was cancelled while it ran
    ├── LeaseLost (retryable)          another trainer may own the job now; stop without writing
    ├── ValidationError (not retryable) the trained adapter failed the serving stack's checks
    └── InfrastructureError (retryable) Redis, the validation worker or the disk failed

Foreign errors (soundfile, PyAV, Redis, websockets) are mapped at the module that calls them. Their
own text (server paths, exception names) goes in `detail`, for logs; `message` is for the creator.
"""

from __future__ import annotations


class TrainingError(Exception):
    """Base of every error a training job fails with."""

    code = "training_error"
    retryable = False

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail  # the foreign library's words (paths, exception names): logged, never shown


class InputError(TrainingError):
    code = "bad_input"


class AudioError(InputError):
    code = "bad_audio"


class SpeechAmountError(InputError):
    code = "speech_amount"


class AudioTooLong(SpeechAmountError):
    """More audio than a voice may use, seen in a file's header or while decoding it (decoding stops
    there); `audio_s` is how much was seen when it stopped."""

    code = "audio_too_long"

    def __init__(self, message: str, audio_s: float = 0.0) -> None:
        super().__init__(message)
        self.audio_s = audio_s


class TranscriptError(InputError):
    code = "transcripts"


class ConsentError(InputError):
    """The consent recording does not say the phrase it was issued, or its speaker is not the uploads';
    `check` holds the figures (lora_training.consent.ConsentCheck) when they were measured."""

    code = "consent"

    def __init__(self, message: str, *, check: object | None = None) -> None:
        super().__init__(message)
        self.check = check


class UploadCheckError(InputError):
    """The job's upload checks found blocks (lora_training.quality): the message lists every one,
    with its file and time, in the creator's words; `findings` holds them as `Finding`s."""

    code = "upload_checks"

    def __init__(self, findings: list) -> None:
        shown = " ".join(f.message.rstrip(".") + "." for f in findings)
        super().__init__(f"the recordings cannot make a good clone: {shown}")
        self.findings = list(findings)


class CloneQualityError(InputError):
    """The clone report's scores are under the tenant's gate (report_gate "block"): the message says
    what scored low and what to do; `report` holds the figures."""

    code = "clone_quality"

    def __init__(self, message: str, *, report: dict | None = None) -> None:
        super().__init__(message)
        self.report = report


class VoiceExistsError(InputError):
    code = "voice_exists"


class JobExistsError(InputError):
    code = "job_exists"


class ConfigError(TrainingError):
    code = "config"


class JobStopped(TrainingError):
    code = "cancelled"


class TrainerStopping(TrainingError):
    """The trainer running the job was asked to stop (SIGTERM): the job goes back to the queue."""

    code = "trainer_stopping"
    retryable = True


class LeaseLost(TrainingError):
    code = "lease_lost"
    retryable = True


class ValidationError(TrainingError):
    code = "validation"


class InfrastructureError(TrainingError):
    code = "infrastructure"
    retryable = True
