"""What the tenant layer stores: tenants with their limits, tenant voices, the grammars of names,
ids and keys, and how each record is written to and read from Redis."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from gateway.tenants.errors import InvalidLimits, InvalidName, StoreError, TenantError
from hashring.records import VOICE_ID, check_voice_id, shown_voice_id

__all__ = [
    "API_KEY", "MAX_CONSENT_CHARS", "TENANT_ID", "TENANT_NAME", "Tenant", "TenantLimits", "TenantVoice",
    "VOICE_UPDATABLE", "VoiceState", "check_job_id", "check_tenant_name", "key_digest", "new_key",
    "new_tenant_id", "pairs", "tenant_fields", "tenant_from", "voice_from", "voice_id_of",
]

API_KEY: Final = re.compile(r"\Avr_[A-Za-z0-9_-]{43}\Z")  # token_urlsafe(32): 43 characters
TENANT_ID: Final = re.compile(r"\At_[a-z2-7]{10}\Z")  # fits VOICE_ID's first part: "t_x/voice" is a voice id
# Lowercase so "Acme" and "acme" cannot both exist; never "t_...", so a name is never read as an id.
TENANT_NAME: Final = re.compile(r"\A(?!t_)[a-z0-9][a-z0-9._-]{0,62}\Z")
MAX_CONSENT_CHARS: Final = 4096
_MAX_JOB_ID_CHARS: Final = 128


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may use at once (streams, training jobs), per minute, per upload and in total."""

    max_streams: int = 8  # concurrent speech streams
    requests_per_minute: int = 120
    max_upload_bytes: int = 200 * 1024 * 1024  # per upload
    max_voices: int = 20
    max_training_jobs: int = 2  # at once

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidLimits(f"{f.name} must be a positive whole number, not {value!r}")

    def replace(self, **changes: int) -> TenantLimits:
        """A copy with `changes` applied; unknown names are refused with the list of known ones."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise InvalidLimits(f"unknown limit(s) {', '.join(unknown)}; the limits are {', '.join(self.names())}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True, slots=True)
class Tenant:
    """One customer of the platform. `id` is the stable handle (it prefixes the tenant's voice ids)."""

    id: str
    name: str
    limits: TenantLimits
    created_at: float  # unix seconds
    revoked: bool = False


VoiceState = Literal["training", "warming", "ready", "failed"]


@dataclass(frozen=True, slots=True)
class TenantVoice:
    """A tenant's name for one cloned voice and the global id the workers know it by."""

    name: str
    voice_id: str  # f"{tenant.id}/{name}"
    consent: str  # the speaker's consent record (a statement or a reference to one)
    created_at: float  # unix seconds
    job_id: str | None = None  # the training job that builds it
    note: str | None = None  # free text, e.g. the state of its training
    state: VoiceState = "ready"  # the gateway's lifecycle; while "training", the job's own state says more


VOICE_UPDATABLE: Final = frozenset({"job_id", "note", "state"})


def key_digest(key: str) -> str:
    """sha256 hex of an API key: the only form of a key Redis ever sees."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_tenant_id() -> str:
    return "t_" + base64.b32encode(secrets.token_bytes(10)).decode("ascii").lower()[:10]


def new_key() -> str:
    return "vr_" + secrets.token_urlsafe(32)


def check_tenant_name(name: str) -> str:
    """Return `name` if it can name a tenant, else InvalidName saying what is allowed."""
    if not isinstance(name, str) or not TENANT_NAME.match(name):
        raise InvalidName(f"tenant name {shown_voice_id(str(name))} is not usable: use 1-63 lowercase letters, "
                          "digits or '._-', starting with a letter or digit (and not with 't_')")
    return name


def check_job_id(job_id: str) -> str:
    """Return `job_id` unless it is empty, too long or not text."""
    if not isinstance(job_id, str) or not job_id or len(job_id) > _MAX_JOB_ID_CHARS:
        raise TenantError(f"a job id must be 1-{_MAX_JOB_ID_CHARS} characters")
    return job_id


def voice_id_of(tenant: Tenant, name: str) -> str:
    """The global voice id of `name`, or InvalidName when the name breaks the adapter grammar."""
    voice_id = f"{tenant.id}/{name}"
    if not isinstance(name, str) or "/" in name or not VOICE_ID.match(voice_id):
        raise InvalidName(f"voice name {shown_voice_id(str(name))} is not usable: use 1-128 letters, digits "
                          "or '._-', starting with a letter or digit")
    return check_voice_id(voice_id)


def tenant_fields(tenant: Tenant) -> dict[str, str]:
    """The tenant's Redis hash: id, name, created_at, revoked, one field per limit."""
    limits = {name: str(getattr(tenant.limits, name)) for name in TenantLimits.names()}
    return {"id": tenant.id, "name": tenant.name, "created_at": repr(tenant.created_at),
            "revoked": "1" if tenant.revoked else "0", **limits}


def tenant_from(fields: Mapping[str, str]) -> Tenant:
    try:
        limits = TenantLimits(**{name: int(fields[name]) for name in TenantLimits.names()})
        return Tenant(fields["id"], fields["name"], limits, float(fields["created_at"]), fields["revoked"] == "1")
    except (KeyError, ValueError, InvalidLimits) as exc:
        raise StoreError(f"the record of tenant {fields.get('id', '?')!r} in Redis is damaged ({exc!r}); "
                         "fix it with `voicering tenant limits` or redis-cli") from None


def voice_from(raw: str) -> TenantVoice:
    data = json.loads(raw)
    return TenantVoice(**{f.name: data[f.name] for f in dataclasses.fields(TenantVoice) if f.name in data})


def pairs(flat: list[str]) -> dict[str, str]:
    """HGETALL's flat [field, value, ...] reply (as a Lua script returns it) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))
