"""The gateway's FastAPI app: OpenAI-compatible speech, the text-in streaming websocket, voices
and cloning, usage, models, health, metrics and the web page.

    app = create_app(settings)            # opens its Gateway (Redis, pool, queue) in the lifespan
    app = create_app(settings, gateway)   # or serves one the caller opened (tests, benches)

Every error leaves in OpenAI's shape (`errors.py`); every route but `/`, `/health`,
`/openapi.json` and `/docs` needs `Authorization: Bearer <API key>`, checked before any byte of
the body is read (`edge.py`: no route lets FastAPI parse its body). The metrics are not here: the
internal metrics server serves them (`metrics.py`, `gateway.serve`); `/metrics` here is a 404.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse
from starlette.routing import Match

from gateway.api import errors, pronunciations, speech, stream, voices
from gateway.api.auth import caller, gateway_of
from gateway.api.edge import RequestEdge
from gateway.api.state import Gateway, open_gateway
from gateway.settings import GatewaySettings
from gateway.tenants import Tenant, TenantError

__all__ = ["create_app"]

WEB = Path(__file__).parent / "web"


def _version() -> str:
    """The installed distribution's version (the gateway does not import the CLI package above it)."""
    try:
        return version("voicering")
    except PackageNotFoundError:
        return "unknown"


__version__ = _version()


def create_app(settings: GatewaySettings | None = None, gateway: Gateway | None = None) -> FastAPI:
    settings = settings or (gateway.settings if gateway else GatewaySettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if gateway is not None:
            app.state.gateway = gateway
            async with voices.lifecycle(gateway):
                yield
            return
        async with open_gateway(settings) as opened:
            app.state.gateway = opened
            async with voices.lifecycle(opened):
                yield

    app = FastAPI(title="voicering", version=__version__, lifespan=lifespan,
                  description="Real-time cloned voices: OpenAI-compatible speech, streaming text-in TTS, voice cloning.")
    errors.install(app)
    app.include_router(speech.router)
    app.include_router(stream.router)
    app.include_router(voices.router)
    app.include_router(pronunciations.router)

    def count(scope, status: int) -> None:
        request = Request(scope)
        gateway_of(request).metrics.requests.labels(_route_of(request), str(status)).inc()

    app.add_middleware(RequestEdge, count=count)

    @app.get("/health", include_in_schema=False)
    async def health(request: Request) -> JSONResponse:
        gw = gateway_of(request)
        view = gw.watcher.view if gw.watcher is not None else None
        return JSONResponse({"status": "ok", "version": __version__,
                             "workers": len(view.ring) if view is not None else len(gw.settings.workers),
                             "ring_epoch": view.epoch if view is not None else None,
                             "ring_load": sum(view.loads.values()) if view is not None else None})

    @app.get("/v1/models")
    async def list_models(tenant: Annotated[Tenant, Depends(caller)]) -> dict:
        created = int(time.time())
        return {"object": "list", "data": [{"id": m, "object": "model", "created": created, "owned_by": "voicering"}
                                           for m in speech.MODELS]}

    @app.get("/v1/usage")
    async def usage(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
        try:
            used = await gateway_of(request).meter.usage(tenant)
        except TenantError as exc:
            raise errors.from_tenant_error(exc) from None
        return {"object": "usage", "tenant": tenant.name, "audio_seconds": round(used.audio_seconds, 3),
                "training_minutes": round(used.training_minutes, 3), "requests": used.requests}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(WEB / "index.html", media_type="text/html")

    def openapi() -> dict:
        """FastAPI's schema, plus the JSON bodies the routes read themselves (`edge.read_body`)."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(speech.body_schemas())
            # this gateway's own limit (a setting), so clients such as the web page can check before sending
            text = schema["components"]["schemas"]["SpeechRequest"]["properties"]["input"]
            text["maxLength"] = settings.max_input_chars
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _route_of(request: Request) -> str:
    """The route's path template (bounded label values), or "other"."""
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match == Match.FULL:
            return getattr(route, "path", "other")
    return "other"
