"""The errors of cloning, each with the `code`, `param` and HTTP status the API answers with."""

from __future__ import annotations

from typing import Literal

__all__ = ["BadUpload", "CloneError", "CloneUnavailable", "DecodesBusy", "NotDeletable", "SampleNotFound",
           "UploadTimeout", "UploadTooLarge"]


class CloneError(Exception):
    """Base of the errors of a clone request; `code` and `param` are what the API answers with."""

    code = "clone_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.param = param
        self.detail = detail  # a library's own words (server paths, exception names): logged, never answered


class BadUpload(CloneError):
    """The upload cannot make a voice (a field missing, a file unusable); the message says what to fix.
    `findings`: for `upload_checks`, every block the quality checks found (Finding dicts: file, time
    range, the sentence for the creator), all in the one 400."""

    code = "invalid_upload"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 findings: list[dict] | None = None, detail: str = "") -> None:
        super().__init__(message, code=code, param=param, detail=detail)
        self.findings = findings or []


class UploadTooLarge(CloneError):
    """The upload passed the tenant's `max_upload_bytes`."""

    code = "upload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the upload is larger than your limit of {limit} bytes (the whole request body); "
                         "send fewer or shorter files (about 10 minutes of speech is enough), or compress them "
                         "(flac, mp3, ogg/opus)", param="files")
        self.limit = limit


class UploadTimeout(CloneError):
    """The body stalled (nothing for `idle_s`) or took longer than `total_s` in all; HTTP 408."""

    code = "request_timeout"


class DecodesBusy(CloneError):
    """Every upload decode the gateway runs at once is taken (`scope` "gateway": HTTP 503), or every one
    a tenant may run (`scope` "tenant": HTTP 429); retry after `retry_after_s`."""

    code = "decodes_busy"

    def __init__(self, message: str, *, scope: Literal["gateway", "tenant"], retry_after_s: float) -> None:
        super().__init__(message, code="decodes_busy" if scope == "gateway" else "decodes_limit_exceeded",
                         param="files")
        self.scope = scope
        self.retry_after_s = retry_after_s


class NotDeletable(CloneError):
    """Base voices belong to the platform."""

    code = "base_voice"


class SampleNotFound(CloneError):
    """The voice's clone report has no sample audio of that name (not published yet, or none kept)."""

    code = "sample_not_found"


class CloneUnavailable(CloneError):
    """The training queue cannot be reached; retry shortly."""

    code = "training_queue_unavailable"
