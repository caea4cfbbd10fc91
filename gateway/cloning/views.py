"""What the API shows of a voice: the job's state mapped to the API's, progress and ETA, and why it
failed, in words for the tenant (`failure_reason`): the trainer's own error (exception reprs,
paths, worker names) stays in the job record and the trainer's log, for operators."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Final, Literal

from gateway.cloning.records import CloneRecord
from gateway.tenants import TenantVoice
from lora_training.jobs import JobStatus

__all__ = ["ApiState", "CANCELLED_REASON", "JOB_GONE_REASON", "LOAD_FAILED_REASON", "MAX_REASON_CHARS",
           "PLATFORM_REASON", "SUBMIT_GRACE_S", "TENANT_ERROR_CODES", "VoiceView", "base_view", "clone_view",
           "failure_reason"]


ApiState = Literal["queued", "preprocessing", "training", "validating", "ready", "failed"]
SUBMIT_GRACE_S: Final = 60.0  # a voice this young whose job is not there yet is still being submitted
_JOB_STATES: Final[dict[str, ApiState]] = {
    "queued": "queued", "preprocessing": "preprocessing", "training": "training", "validating": "validating",
    "publishing": "validating", "ready": "validating",
}
_RUNNING: Final = frozenset({"preprocessing", "training", "validating"})

# lora_training's InputError codes: their messages are written for the creator (what to fix in the upload)
TENANT_ERROR_CODES: Final = frozenset({"bad_input", "bad_audio", "speech_amount", "audio_too_long", "transcripts"})
MAX_REASON_CHARS: Final = 400
_SUPPORT = "delete the voice and upload again, and contact support quoting the job id if it happens again"
PLATFORM_REASON: Final = f"training failed on the platform's side, not because of your recordings; {_SUPPORT}"
VALIDATION_REASON: Final = ("the trained voice did not pass the quality checks; upload again with clean recordings "
                            "of one speaker (about 10 minutes), and contact support quoting the job id if it fails "
                            "again")
CANCELLED_REASON: Final = "its training job was cancelled by an operator; delete the voice and upload again"
LOAD_FAILED_REASON: Final = f"the trained voice could not be loaded by the workers that serve it; {_SUPPORT}"
JOB_GONE_REASON: Final = ("its training job is gone (the gateway stopped while queueing it, or the queue lost it); "
                          "delete the voice and upload again")
_PATH = re.compile(r"""(?:[A-Za-z]:)?(?:[/\\][^\s'"/\\]+)+[/\\]([^\s'"/\\]+)""")  # a path: keep its file name


def failure_reason(job: JobStatus | None) -> str:
    """Why a clone failed, for the tenant: the trainer's message when it is about the upload (paths
    cut to their file names), a fixed sentence for anything on the platform's side."""
    if job is None:
        return JOB_GONE_REASON
    if job.state == "cancelled" or job.error_code == "cancelled":
        return CANCELLED_REASON
    if job.error_code in TENANT_ERROR_CODES:
        said = (job.error or job.message)[:4 * MAX_REASON_CHARS]
        said = _PATH.sub(r"\1", said).strip()
        if said:
            return said if len(said) <= MAX_REASON_CHARS else said[:MAX_REASON_CHARS - 3] + "..."
    if job.error_code == "validation":
        return VALIDATION_REASON
    return PLATFORM_REASON


@dataclass(frozen=True)
class VoiceView:
    """A voice as GET /v1/voices/{name} shows it."""

    name: str
    type: Literal["base", "clone"]
    state: ApiState
    progress: float  # 0-100
    eta_s: float | None = None  # seconds left, from progress over the time it has run (rough)
    message: str | None = None  # what is happening now
    reason: str | None = None  # why it failed
    created_at: int | None = None
    job_id: str | None = None

    def to_json(self) -> dict:
        return {"id": self.name, "name": self.name, "object": "voice", "type": self.type, "state": self.state,
                "progress": self.progress, "eta_s": self.eta_s, "message": self.message, "reason": self.reason,
                "created_at": self.created_at, "job_id": self.job_id}


def base_view(name: str) -> VoiceView:
    return VoiceView(name, "base", "ready", 100.0, message="a platform voice")


def clone_view(voice: TenantVoice, job: JobStatus | None, record: CloneRecord | None, *,
               now: float | None = None) -> VoiceView:
    """The API's view of a tenant voice: its own state once settled, else its job's."""
    now = time.time() if now is None else now
    created = int(voice.created_at)

    def view(state: ApiState, progress: float, **more) -> VoiceView:
        return VoiceView(voice.name, "clone", state, round(progress, 1), created_at=created, job_id=voice.job_id,
                         **more)

    if voice.state == "ready":
        return view("ready", 100.0, message="ready to speak")
    if voice.state == "failed":
        return view("failed", job.progress if job else 0.0, reason=voice.note or failure_reason(job))
    if voice.state == "warming":
        return view("validating", 99.0, message=voice.note or "published; warming up on its workers")
    if job is None:
        if now - voice.created_at < SUBMIT_GRACE_S:
            return view("queued", 0.0, message="being queued for training")
        return view("failed", 0.0, reason=JOB_GONE_REASON)
    if job.state in ("failed", "cancelled"):
        return view("failed", job.progress, reason=failure_reason(job))
    state = _JOB_STATES.get(job.state, "queued")
    progress = min(job.progress, 99.0)
    eta = None
    started = record.started_at if record is not None else None
    if state in _RUNNING and started is not None and progress > 0:
        elapsed = max(0.0, now - started)
        eta = round(elapsed * (100.0 - progress) / progress, 1)
    message = job.message or None
    if job.state == "ready":
        message = "published; warming up on its workers"
    elif job.state == "queued":
        message = "waiting for a trainer" if not job.error else "waiting to be retried after a failed attempt"
    return view(state, progress, eta_s=eta, message=message)
