"""Worker errors. Each maps to a protocol error code; `retryable` tells a client whether another
replica (or a later try) may succeed.

    WorkerError
    ├── BadRequest        (bad_request, not retryable): malformed message, bad options
    │   ├── EmptyText     (empty_text)
    │   └── TextTooLong   (text_too_long)
    ├── UnknownVoice      (unknown_voice, not retryable)
    ├── AdapterError      (bad_adapter, not retryable): the voice's adapter failed validation
    ├── Busy              (busy, retryable): admission limit reached
    ├── SlowConsumer      (slow_consumer, not retryable): client stopped reading
    └── EngineError       (engine_error, retryable): the engine failed mid-request
"""

from __future__ import annotations


class WorkerError(Exception):
    code = "internal"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(WorkerError):
    code = "bad_request"


class EmptyText(BadRequest):
    code = "empty_text"


class TextTooLong(BadRequest):
    code = "text_too_long"


class UnknownVoice(WorkerError):
    code = "unknown_voice"


class AdapterError(WorkerError):
    code = "bad_adapter"


class Busy(WorkerError):
    code = "busy"
    retryable = True


class SlowConsumer(WorkerError):
    code = "slow_consumer"


class EngineError(WorkerError):
    code = "engine_error"
    retryable = True
