"""Pronunciation dictionaries: `POST /v1/pronunciations`, `GET /v1/pronunciations`,
`GET|PUT|DELETE /v1/pronunciations/{name}`, and a voice's defaults:
`GET|PUT /v1/voices/{name}/pronunciations`.

A dictionary is a named list of "sounds-like" rules of the caller's tenant (docs/text.md):

    {"name": "medical", "rules": [{"written": "Nguyen", "spoken": "win"},
                                  {"written": "SQL", "spoken": "sequel", "case_sensitive": true}]}

A speech request (`POST /v1/audio/speech`, or a `/v1/tts/stream` `start`) names up to
`MAX_PRONUNCIATIONS` of them in `pronunciations`; the workers apply them before normalization.
A request that names none uses its voice's defaults (`[]` names none and skips them too).
Storage, bounds and versions: `gateway.tenants.pronunciations`. Bodies are read after the key is
checked, at most `BODY_BYTES` (413 beyond), and parsed here (no route lets FastAPI read a body).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gateway.api.auth import caller, gateway_of
from gateway.api.edge import read_body
from gateway.api.errors import ApiError, from_tenant_error
from gateway.catalog import VoiceNotReady
from gateway.tenants import Tenant, TenantError
from gateway.tenants.pronunciations import MAX_DICTIONARY_BYTES, PronunciationInfo, Pronunciations
from gpu_worker.text import Dictionary

__all__ = ["BODY_BYTES", "router"]

# A stored dictionary is at most MAX_DICTIONARY_BYTES of compact UTF-8 JSON; a request may spell the
# same rules with escapes and spaces: room for four times that.
BODY_BYTES: Final = 4 * MAX_DICTIONARY_BYTES
VOICE_BODY_BYTES: Final = 4096  # a voice's defaults: three names of at most 64 characters, escaped
_RULE_SCHEMA = {"type": "object", "required": ["written", "spoken"], "additionalProperties": False, "properties": {
    "written": {"type": "string", "maxLength": 100, "description": "the word or phrase as written (at most 6 words)"},
    "spoken": {"type": "string", "maxLength": 200, "description": "what to read instead, spelled as it sounds"},
    "case_sensitive": {"type": "boolean", "default": False},
    "whole_word": {"type": "boolean", "default": True}}}
_RULES = {"type": "array", "maxItems": 1000, "items": _RULE_SCHEMA}


def _body_schema(required: list[str]) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": required, "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"},
                       "rules": _RULES}}}}}}


router = APIRouter()


def _store(request: Request) -> Pronunciations:
    return gateway_of(request).pronunciations


def _view(info: PronunciationInfo, dictionary: Dictionary | None = None) -> dict[str, Any]:
    view = {"object": "pronunciation_dictionary", "name": info.name, "version": info.version,
            "rule_count": info.rules, "bytes": info.bytes, "created_at": int(info.created_at),
            "updated_at": int(info.updated_at)}
    if dictionary is not None:
        view["rules"] = dictionary.to_json()["rules"]
    return view


async def _json_body(request: Request, allowed: frozenset[str]) -> dict[str, Any]:
    raw = await read_body(request, BODY_BYTES, timeout_s=gateway_of(request).settings.body_timeout_s)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise ApiError(400, 'send a JSON object {"name": ..., "rules": [{"written": ..., "spoken": ...}]}',
                       code="invalid_json")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {str(unknown[0])[:40]}", param=str(unknown[0])[:40],
                       code="invalid_value")
    if "rules" not in body:
        raise ApiError(400, "send the dictionary's 'rules': a list of {\"written\": ..., \"spoken\": ...}",
                       param="rules", code="missing_field")
    return body


def _error(exc: TenantError) -> ApiError:
    return from_tenant_error(exc, param=getattr(exc, "param", None))


@router.post("/v1/pronunciations", status_code=201, openapi_extra=_body_schema(["name", "rules"]))
async def create_pronunciations(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> JSONResponse:
    """Create a pronunciation dictionary (name + rules); name it in a speech request's `pronunciations`."""
    body = await _json_body(request, frozenset({"name", "rules"}))
    if "name" not in body:
        raise ApiError(400, "send the dictionary's 'name'", param="name", code="missing_field")
    try:
        info = await _store(request).create(tenant, body["name"], body["rules"])
    except TenantError as exc:
        raise _error(exc) from None
    return JSONResponse(_view(info), status_code=201)


@router.get("/v1/pronunciations")
async def list_pronunciations(request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """The tenant's pronunciation dictionaries (without their rules)."""
    try:
        infos = await _store(request).list(tenant)
    except TenantError as exc:
        raise _error(exc) from None
    return {"object": "list", "data": [_view(i) for i in infos]}


@router.get("/v1/pronunciations/{name}")
async def get_pronunciations(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """One dictionary with its rules."""
    try:
        info, dictionary = await _store(request).get(tenant, name)
    except TenantError as exc:
        raise _error(exc) from None
    return _view(info, dictionary)


@router.put("/v1/pronunciations/{name}", openapi_extra=_body_schema(["rules"]))
async def replace_pronunciations(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """Replace a dictionary's rules: a new version, read by the next request that names it."""
    body = await _json_body(request, frozenset({"name", "rules"}))
    if body.get("name", name) != name:
        raise ApiError(400, f"the body names {str(body.get('name'))[:40]!r} but the path {name[:40]!r}; a dictionary "
                       "is not renamed by PUT (create the new name, then delete the old)", param="name",
                       code="invalid_value")
    try:
        info = await _store(request).replace(tenant, name, body["rules"])
    except TenantError as exc:
        raise _error(exc) from None
    return _view(info)


@router.delete("/v1/pronunciations/{name}")
async def delete_pronunciations(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """Delete a dictionary; requests that name it afterwards get 404."""
    try:
        info = await _store(request).delete(tenant, name)
    except TenantError as exc:
        raise _error(exc) from None
    return {"object": "pronunciation_dictionary.deleted", "name": info.name, "deleted": True}


@router.get("/v1/voices/{name}/pronunciations")
async def get_voice_pronunciations(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """The dictionaries a request for this voice uses when it names none."""
    await _known_voice(request, tenant, name)
    try:
        names = await _store(request).voice_default(tenant, name)
    except TenantError as exc:
        raise _error(exc) from None
    return _voice_view(name, names)


@router.put("/v1/voices/{name}/pronunciations", openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"type": "object", "required": ["pronunciations"], "additionalProperties": False,
                                     "properties": {"pronunciations": {"type": "array", "items": {"type": "string"}}}}}}}})
async def set_voice_pronunciations(name: str, request: Request, tenant: Annotated[Tenant, Depends(caller)]) -> dict:
    """Set the voice's default dictionaries (each must exist; `[]` removes the default)."""
    raw = await read_body(request, VOICE_BODY_BYTES, timeout_s=gateway_of(request).settings.body_timeout_s)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict) or set(body) != {"pronunciations"} or not isinstance(body["pronunciations"], list):
        raise ApiError(400, 'send {"pronunciations": ["name", ...]} (an empty list removes the default)',
                       param="pronunciations", code="invalid_value")
    await _known_voice(request, tenant, name)
    try:
        names = await _store(request).set_voice_default(tenant, name, body["pronunciations"])
    except TenantError as exc:
        raise from_tenant_error(exc, param="pronunciations") from None
    return _voice_view(name, names)



async def _known_voice(request: Request, tenant: Tenant, name: str) -> None:
    """A voice of the tenant's (in any state) or a base voice: defaults for a name nobody has are refused."""
    try:
        await gateway_of(request).catalog.resolve(tenant, name)
    except VoiceNotReady:
        return
    except TenantError as exc:
        raise from_tenant_error(exc, param="voice") from None


def _voice_view(name: str, names: tuple[str, ...]) -> dict[str, Any]:
    return {"object": "voice.pronunciations", "voice": name, "pronunciations": list(names)}
