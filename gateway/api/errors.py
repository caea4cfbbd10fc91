"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the status code
OpenAI would use, and `Retry-After` on 429 and 503, so the official clients raise the exception
class they already handle (BadRequestError, AuthenticationError, NotFoundError, RateLimitError...).

Errors of the layers below are mapped here, once, at the HTTP boundary:

    TenantError (gateway.tenants)      Unauthorized 401, VoiceNotFound and PronunciationNotFound 404,
                                       PronunciationExists and PronunciationInUse 409, QuotaExceeded 429,
                                       Unavailable 503 (Redis unreachable or refusing for now),
                                       Busy 503 gateway_busy (this process's Redis pool stayed full),
                                       StoreError 500 (never Redis's own text), anything else of
                                       the caller's 400
    WorkerRequestError (gpu_worker)    the worker's code: busy/no_worker 503, unknown_voice 404,
                                       pronunciation_not_found 404 (deleted meanwhile),
                                       caller mistakes 400, worker_lost 502, the rest 500
                                       VoiceExists, VoiceNotReady 409
    RequestValidationError (FastAPI)   400 invalid_request_error, `param` names the field
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from gateway.catalog import VoiceNotReady
from gateway.tenants import (
    Busy,
    PronunciationExists,
    PronunciationInUse,
    PronunciationNotFound,
    QuotaExceeded,
    StoreError,
    TenantError,
    Unauthorized,
    Unavailable,
    VoiceExists,
    VoiceNotFound,
)
from gpu_worker.client import NoWorkerServing, WorkerRequestError

__all__ = ["ApiError", "ErrorType", "error_body", "from_tenant_error", "from_worker_error", "install"]

ErrorType = Literal["invalid_request_error", "authentication_error", "not_found_error", "rate_limit_error",
                    "server_error", "service_unavailable"]

_CALLER_CODES = frozenset({"bad_request", "text_too_long", "backlog_full", "idle_timeout"})
_RETRY_AFTER_S = 1


class ApiError(Exception):
    """One error answer: status, OpenAI error body, and when to retry (429/503)."""

    def __init__(self, status: int, message: str, *, type: ErrorType = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after_s: float | None = None,
                 retryable: bool = True, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.details = details or {}  # more fields of the error object (upload_checks: its `findings`)
        if retry_after_s is None and retryable and status in (429, 503):
            retry_after_s = _RETRY_AFTER_S
        self.retry_after_s = retry_after_s
        self.trace_id: str | None = None  # set where the gateway logged more than it answers: quote it to find that

    def body(self) -> dict[str, Any]:
        body = error_body(self.message, self.type, self.param, self.code)
        body["error"].update(self.details)
        return body

    def headers(self) -> dict[str, str]:
        headers = {} if self.trace_id is None else {"x-voicering-trace-id": self.trace_id}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return headers

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers())


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_tenant_error(exc: TenantError, *, param: str | None = None) -> ApiError:
    if isinstance(exc, Unauthorized):
        return ApiError(401, exc.message, type="authentication_error", code="invalid_api_key")
    if isinstance(exc, VoiceNotFound):
        return ApiError(404, exc.message, type="not_found_error", param=param or "voice", code="voice_not_found")
    if isinstance(exc, PronunciationNotFound):
        return ApiError(404, exc.message, type="not_found_error", param=param or "name",
                        code="pronunciation_not_found")
    if isinstance(exc, PronunciationExists):
        return ApiError(409, exc.message, param=param or "name", code="pronunciation_exists")
    if isinstance(exc, PronunciationInUse):
        return ApiError(409, exc.message, param=param or "name", code="pronunciation_in_use")
    if isinstance(exc, QuotaExceeded):
        return ApiError(429, exc.message, type="rate_limit_error", code=f"{exc.limit}_limit_exceeded",
                        retry_after_s=exc.retry_after_s, retryable=exc.retryable)
    if isinstance(exc, VoiceNotReady):
        return ApiError(409, exc.message, type="invalid_request_error", param=param or "voice", code="voice_not_ready",
                        retryable=False)
    if isinstance(exc, VoiceExists):
        return ApiError(409, exc.message, param=param or "name", code="voice_exists")
    if isinstance(exc, Unavailable):
        return ApiError(503, exc.message, type="service_unavailable", code="unavailable")
    if isinstance(exc, Busy):
        return ApiError(503, exc.message, type="service_unavailable", code="gateway_busy")
    if isinstance(exc, StoreError):
        return ApiError(500, "the gateway's tenant store failed; retry later or tell the operator",
                        type="server_error", code="tenant_store_error")
    return ApiError(400, exc.message, param=param, code=_snake(type(exc).__name__))


def _snake(name: str) -> str:
    """InvalidName -> invalid_name: an API code, not the gateway's class name."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def from_worker_error(exc: WorkerRequestError) -> ApiError:
    error = exc.error
    if isinstance(exc, NoWorkerServing):
        return ApiError(503, "no worker is serving right now (the fleet is starting up or draining); retry shortly",
                        type="service_unavailable", code="no_worker_available")
    if error.code in ("busy", "no_worker"):
        return ApiError(503, "every worker that can speak this voice is busy; retry shortly", type="service_unavailable",
                        code="no_worker_available")
    if error.code == "unknown_voice":
        return ApiError(404, error.message, type="not_found_error", param="voice", code="voice_not_found")
    if error.code == "pronunciation_not_found":
        return ApiError(404, error.message, type="not_found_error", param="pronunciations", code=error.code)
    if error.code in _CALLER_CODES:
        return ApiError(400, error.message, param="input", code=error.code)
    if error.code == "worker_lost":
        return ApiError(502, error.message, type="server_error", code="worker_lost")
    return ApiError(503 if exc.retryable else 500, error.message,
                    type="service_unavailable" if exc.retryable else "server_error", code=error.code)


def _param(loc: tuple[Any, ...]) -> str | None:
    fields = [str(part) for part in loc if part not in ("body", "query", "path", "header")]
    return ".".join(fields) or None


async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
    param = _param(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") in ("json_invalid", "model_attributes_type", "model_type"):
        message = "We could not parse the JSON body of your request: send a JSON object"
    else:
        message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}" if param else str(first.get("msg"))
    return ApiError(400, message, param=param, code="invalid_value").response()


async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
    return exc.response()


async def _http(_: Request, exc: HTTPException) -> JSONResponse:
    kind: ErrorType = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return ApiError(exc.status_code, str(exc.detail), type=kind).response()


def install(app: FastAPI) -> None:
    """Every error the app answers goes out in OpenAI's shape."""
    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http)  # type: ignore[arg-type]
