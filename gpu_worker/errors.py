"""Worker errors. Each maps to a protocol error code; `retryable` tells a client whether another
replica (or a later try) may succeed.

    WorkerError
    ├── BadRequest        (bad_request, not retryable): malformed message, bad options
    │   ├── BadMessage    (bad_request): a message that could not be parsed; carries what was read of it
    │   ├── EmptyText     (empty_text)
    │   ├── TextTooLong   (text_too_long): over the character limit, or a piece no engine request can hold
    │   └── BacklogFull   (backlog_full): more text waiting to be spoken than a context/connection may queue
    ├── IdleTimeout       (idle_timeout, not retryable): a context sent no text for too long
    ├── UnknownVoice      (unknown_voice, not retryable)
    ├── PronunciationNotFound (pronunciation_not_found, not retryable): a named dictionary is gone
    ├── PronunciationsUnavailable (pronunciations_unavailable): the worker cannot read dictionaries
    │                     (no Redis configured: not retryable; Redis unreachable: retryable)
    ├── AlignmentUnavailable (alignment_unavailable, not retryable): word timings asked of a worker
    │                     that has no aligner (libespeak-ng missing, or turned off)
    ├── AdapterError      (bad_adapter, not retryable): the voice's adapter failed validation
    ├── Busy              (busy, retryable): admission limit reached; `limit` says which one
    ├── SlowConsumer      (slow_consumer, not retryable): client stopped reading
    └── EngineError       (engine_error, retryable): the engine (or codec) failed mid-request
"""

from __future__ import annotations

from typing import Literal

# Which limit a `busy` answer hit (sent as `Error.limit`, see gpu_worker.protocol). Only `connection`
# is a property of the connection it came on (a pool learns it as that link's limit); `capacity` and
# `relay` say the worker is full now, `share` that it prefers another owner (ADMISSION.md: "say
# which limit refused").
BusyLimit = Literal["capacity", "share", "connection", "relay"]


class WorkerError(Exception):
    code = "internal"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(WorkerError):
    code = "bad_request"


class BadMessage(BadRequest):
    """A client message refused while parsing; ``message_type``/``context_id`` are what could be read
    of it (None when unreadable), so the server can tell a refused `start` from a refused follow-up."""

    def __init__(self, message: str, *, message_type: str | None = None, context_id: str | None = None) -> None:
        super().__init__(message)
        self.message_type = message_type
        self.context_id = context_id


class EmptyText(BadRequest):
    code = "empty_text"


class TextTooLong(BadRequest):
    code = "text_too_long"


class BacklogFull(BadRequest):
    code = "backlog_full"


class IdleTimeout(WorkerError):
    code = "idle_timeout"


class UnknownVoice(WorkerError):
    code = "unknown_voice"


class PronunciationNotFound(WorkerError):
    code = "pronunciation_not_found"


class PronunciationsUnavailable(WorkerError):
    code = "pronunciations_unavailable"

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class AlignmentUnavailable(WorkerError):
    code = "alignment_unavailable"
    retryable = False


class AdapterError(WorkerError):
    code = "bad_adapter"


class Busy(WorkerError):
    code = "busy"
    retryable = True

    def __init__(self, message: str, limit: BusyLimit | None = None) -> None:
        super().__init__(message)
        self.limit = limit  # which limit refused (sent on `busy` to version-2 clients)


class SlowConsumer(WorkerError):
    code = "slow_consumer"


class EngineError(WorkerError):
    code = "engine_error"
    retryable = True
