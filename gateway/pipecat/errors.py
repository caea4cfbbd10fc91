"""The gateway's errors as Pipecat sees them: one exception carrying the gateway's code and
message, and the `ErrorCategory` that tells Pipecat whether the service can go on.

    VoiceringError(code, message, retryable, context_id)  .category -> pipecat ErrorCategory

A permanent category (credentials, a voice or request every turn would repeat) makes Pipecat stop
giving the service work (its `ProcessorUnusablePolicy` decides the rest); everything else costs one
turn. Codes: docs/api.md and docs/protocol.md.
"""

from __future__ import annotations

import json

from pipecat.utils.errors import ErrorCategory, classify_http_status_code

__all__ = ["VoiceringError", "category_of", "from_status"]

_CATEGORIES: dict[str, ErrorCategory] = {
    # the same for every turn until the key, voice or settings change
    "invalid_api_key": ErrorCategory.AUTHENTICATION,
    "unauthorized": ErrorCategory.AUTHENTICATION,
    "voice_not_found": ErrorCategory.INVALID_REQUEST,
    "unknown_voice": ErrorCategory.INVALID_REQUEST,
    "bad_adapter": ErrorCategory.INVALID_REQUEST,
    "bad_request": ErrorCategory.INVALID_REQUEST,
    "pronunciation_not_found": ErrorCategory.INVALID_REQUEST,
    "alignment_unavailable": ErrorCategory.INVALID_REQUEST,
    "pronunciations_unavailable": ErrorCategory.INVALID_REQUEST,
    # this turn's text
    "text_too_long": ErrorCategory.APPLICATION,
    "empty_text": ErrorCategory.APPLICATION,
    "backlog_full": ErrorCategory.APPLICATION,
    "idle_timeout": ErrorCategory.APPLICATION,
    # the tenant's limits
    "streams_limit_exceeded": ErrorCategory.RATE_LIMIT,
    "requests_limit_exceeded": ErrorCategory.RATE_LIMIT,
    # the fleet, now
    "busy": ErrorCategory.SERVER,
    "no_worker": ErrorCategory.SERVER,
    "no_worker_available": ErrorCategory.SERVER,
    "worker_timeout": ErrorCategory.SERVER,
    "worker_lost": ErrorCategory.SERVER,
    "engine_error": ErrorCategory.SERVER,
    "internal": ErrorCategory.SERVER,
    "unavailable": ErrorCategory.SERVER,
    "gateway_busy": ErrorCategory.SERVER,
    "tenant_store_error": ErrorCategory.SERVER,
    "going_away": ErrorCategory.SERVER,
    "connection_lost": ErrorCategory.CONNECTIVITY,
    "no_gateway": ErrorCategory.CONNECTIVITY,
}


def category_of(code: str) -> ErrorCategory:
    """A gateway code's category; UNKNOWN (never permanent) for a code this version does not know,
    e.g. `voice_not_ready` (a clone still training: it will speak once trained)."""
    return _CATEGORIES.get(code, ErrorCategory.UNKNOWN)


class VoiceringError(Exception):
    """The gateway refused or ended a context (``context_id``), or the connection itself
    (``context_id`` None). ``code`` and ``message`` are the gateway's own."""

    def __init__(self, code: str, message: str, retryable: bool = False, context_id: str | None = None,
                 category: ErrorCategory | None = None) -> None:
        super().__init__(f"voicering {code}: {message}")
        self.code, self.message, self.retryable, self.context_id = code, message, retryable, context_id
        self.category = category or category_of(code)


def from_status(url: str, status: int, body: bytes) -> VoiceringError:
    """A handshake the gateway refused with an HTTP status (401 bad key, 429 limits, 503 ...):
    its JSON error's code and message where it sent one."""
    code, message = "unauthorized" if status == 401 else "gateway_refused", "no reason given"
    try:
        error = json.loads(body)["error"]
        code, message = error.get("code") or code, error["message"]
    except Exception:  # not the gateway's JSON error: the status says what there is to say
        pass
    return VoiceringError(code, f"the gateway at {url} refused the connection (HTTP {status}): {message}",
                          status >= 500 or status == 429, category=classify_http_status_code(status))
