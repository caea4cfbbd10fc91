"""The worker's HTTP routes beside the websocket, on the same port: ``GET /health`` (liveness and
load counts; cheap, no store walk, open to probes), ``GET /metrics`` (Prometheus text),
``GET /prewarm?voice=a&voice=b`` (starts loading voices in the background, 202 with an operation
id) and ``GET /prewarm/<id>`` (its per-voice status). With a cluster token set, every route but
/health (and the websocket handshake) needs ``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from gpu_worker.admission import Admission
from gpu_worker.context import ContextDeps
from gpu_worker.prewarm import PrewarmBusy, Prewarms
from gpu_worker.protocol import MAX_VOICE_ID_BYTES
from gpu_worker.settings import WorkerSettings
from hashring.records import RingView

__all__ = ["MAX_PREWARM", "SideRoutes"]

MAX_PREWARM = 256


class SideRoutes:
    """Answers the HTTP requests on the websocket port (`process_request`); None lets a websocket
    handshake through. ``view``: the ring as this worker sees it, once it has joined."""

    def __init__(self, settings: WorkerSettings, deps: ContextDeps, admission: Admission) -> None:
        self.settings = settings
        self.deps = deps
        self.admission = admission
        self.view: Callable[[], RingView] | None = None
        self.prewarms = Prewarms(deps.adapters.prewarm) if deps.adapters is not None else None

    def health(self) -> dict:
        """Liveness and load as counts: cheap enough for every probe, and no voice ids to anyone."""
        engine = self.deps.engine
        adapters = self.deps.adapters
        alive = getattr(engine, "alive", None)
        status = "ok" if alive is None or alive() else "engine_dead"
        return {"status": status, "worker_id": self.settings.worker_id, "active_streams": self.admission.active,
                "relayed_streams": self.admission.relayed,
                "max_streams": self.settings.max_streams, "engine_requests": engine.unfinished_requests(),
                "engine_waiting": getattr(engine, "waiting", None),
                "codec_policy": getattr(self.deps.runner, "policy", None),
                "adapters_resident": len(adapters.resident) if adapters is not None else 0,
                **self._ring_health()}

    def _ring_health(self) -> dict:
        """The ring as this worker sees it (epoch, size, summed heartbeat loads): a stale view shows
        as an old epoch, and the load as this worker's routing sees it."""
        if self.view is None:
            return {}
        view = self.view()
        return {"ring_epoch": view.epoch, "ring_workers": len(view.ring), "ring_load": sum(view.loads.values())}

    def authorized(self, request: Request) -> bool:
        """With a cluster token set, every request but /health must carry it (constant-time compare)."""
        token = self.settings.cluster_token
        if not token:
            return True
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlsplit(request.path)
        if url.path == "/health":
            health = self.health()
            return json_response(HTTPStatus.OK if health["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE, health)
        if not self.authorized(request):
            return json_response(HTTPStatus.UNAUTHORIZED, {"error": "this worker needs its cluster token: "
                                                                    "'Authorization: Bearer <token>'"})
        if url.path == "/metrics":
            if self.deps.metrics is None:
                return response(HTTPStatus.NOT_FOUND, b"metrics are off on this worker\n", "text/plain")
            return response(HTTPStatus.OK, self.deps.metrics.render(), self.deps.metrics.content_type)
        if url.path == "/prewarm" or url.path.startswith("/prewarm/"):
            return self._prewarm(url.path, parse_qs(url.query).get("voice", []))
        return None

    def _prewarm(self, path: str, voices: list[str]) -> Response:
        if self.prewarms is None:
            return json_response(HTTPStatus.NOT_FOUND, {"error": "this worker has no adapter cache to prewarm"})
        if path != "/prewarm":
            op = self.prewarms.get(path.removeprefix("/prewarm/"))
            if op is None:
                return json_response(HTTPStatus.NOT_FOUND,
                                     {"error": "no such prewarm operation (finished ones are kept a while)"})
            return json_response(HTTPStatus.OK, op.report())
        if (not voices or len(voices) > MAX_PREWARM
                or any(len(v.encode(errors="replace")) > MAX_VOICE_ID_BYTES for v in voices)):
            return json_response(HTTPStatus.BAD_REQUEST,
                                 {"error": f"give 1..{MAX_PREWARM} voices as /prewarm?voice=a&voice=b"})
        try:
            op = self.prewarms.start(voices)
        except PrewarmBusy as exc:
            return json_response(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}, retry_after=1)
        return json_response(HTTPStatus.ACCEPTED, {**op.report(), "status_url": f"/prewarm/{op.id}"})

    async def aclose(self) -> None:
        if self.prewarms is not None:
            await self.prewarms.aclose()


def response(status: HTTPStatus, body: bytes, content_type: str, *, retry_after: int | None = None) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body))})
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return Response(status.value, status.phrase, headers, body)


def json_response(status: HTTPStatus, body: dict, *, retry_after: int | None = None) -> Response:
    return response(status, json.dumps(body).encode(), "application/json", retry_after=retry_after)
