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

from gateway.tenants.errors import InvalidLimits, InvalidName, InvalidPolicy, StoreError, TenantError
from hashring.records import VOICE_ID, check_voice_id, shown_voice_id

__all__ = [
    "API_KEY", "MAX_CONSENT_CHARS", "MAX_RETENTION_DAYS", "TENANT_ID", "TENANT_NAME", "ConsentMode", "ReportGate",
    "Tenant", "TenantLimits", "TenantPolicy", "TenantVoice", "VOICE_UPDATABLE", "VoiceState", "check_job_id",
    "check_tenant_name", "key_digest", "new_key",
    "new_tenant_id", "pairs", "tenant_fields", "tenant_from", "voice_from", "voice_id_of",
]

API_KEY: Final = re.compile(r"\Avr_[A-Za-z0-9_-]{43}\Z")  # token_urlsafe(32): 43 characters
TENANT_ID: Final = re.compile(r"\At_[a-z2-7]{10}\Z")  # fits VOICE_ID's first part: "t_x/voice" is a voice id
# Lowercase so "Acme" and "acme" cannot both exist; never "t_...", so a name is never read as an id.
TENANT_NAME: Final = re.compile(r"\A(?!t_)[a-z0-9][a-z0-9._-]{0,62}\Z")
MAX_CONSENT_CHARS: Final = 4096
_MAX_JOB_ID_CHARS: Final = 128
MAX_RETENTION_DAYS: Final = 3650  # ten years: longer is "keep while the voice exists" (None)


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


ConsentMode = Literal["spoken", "statement"]
ReportGate = Literal["off", "warn", "block"]
_CONSENT_MODES: Final = ("spoken", "statement")
_REPORT_GATES: Final = ("off", "warn", "block")
_KEEP: Final = "none"  # retention_days' stored and typed form of None


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """How the tenant's clones are made and what is kept of them, set by its operator.

    consent         "spoken": a recording of a one-time phrase, checked against the voice (new tenants);
                    "statement": a typed consent record (the operator keeps its own consent records)
    report_gate     what a poor clone report does to publishing: "off", "warn" (published, flagged) or "block"
    retention_days  None: uploads and consent recording are kept while the voice exists; N: deleted N days
                    after the voice is ready, or failed (or with the voice, if that comes first)
    """

    consent: ConsentMode = "spoken"
    report_gate: ReportGate = "warn"
    retention_days: int | None = None

    def __post_init__(self) -> None:
        if self.consent not in _CONSENT_MODES:
            raise InvalidPolicy(f"consent must be one of {', '.join(_CONSENT_MODES)}, not {self.consent!r}")
        if self.report_gate not in _REPORT_GATES:
            raise InvalidPolicy(f"report_gate must be one of {', '.join(_REPORT_GATES)}, not {self.report_gate!r}")
        days = self.retention_days
        if days is not None and (isinstance(days, bool) or not isinstance(days, int)
                                 or not 0 <= days <= MAX_RETENTION_DAYS):
            raise InvalidPolicy(f"retention_days must be a whole number of days from 0 to {MAX_RETENTION_DAYS}, "
                                f"or {_KEEP!r} to keep recordings while the voice exists; not {days!r}")

    def replace(self, **changes: object) -> TenantPolicy:
        """A copy with `changes` applied; unknown names are refused with the list of known ones."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise InvalidPolicy(f"unknown policy field(s) {', '.join(unknown)}; "
                                f"the policy fields are {', '.join(self.names())}")
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @staticmethod
    def parse_retention_days(text: str) -> int | None:
        """"none" (any case) -> None, digits -> that many days; anything else InvalidPolicy."""
        if text.strip().lower() == _KEEP:
            return None
        if not text.strip().isdigit():
            raise InvalidPolicy(f"retention_days must be a whole number of days from 0 to {MAX_RETENTION_DAYS}, "
                                f"or {_KEEP!r} to keep recordings while the voice exists; not {text!r}")
        return int(text)

    def fields(self) -> dict[str, str]:
        """The policy's Redis hash fields."""
        days = _KEEP if self.retention_days is None else str(self.retention_days)
        return {"consent": self.consent, "report_gate": self.report_gate, "retention_days": days}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> TenantPolicy:
        """Read from a tenant hash. A tenant stored before policies existed has none of these fields:
        it agreed to typed consent, so it reads as "statement" (a new tenant is "spoken")."""
        days = fields.get("retention_days")
        return cls(consent=fields.get("consent", "statement"),  # type: ignore[arg-type]
                   report_gate=fields.get("report_gate", "warn"),  # type: ignore[arg-type]
                   retention_days=None if days is None else cls.parse_retention_days(days))


@dataclass(frozen=True, slots=True)
class Tenant:
    """One customer of the platform. `id` is the stable handle (it prefixes the tenant's voice ids)."""

    id: str
    name: str
    limits: TenantLimits
    created_at: float  # unix seconds
    revoked: bool = False
    policy: TenantPolicy = TenantPolicy()


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
    settled_at: float | None = None  # unix seconds it became ready (or failed): the tenant's retention counts from it
    recordings_deleted_at: float | None = None  # when its uploads and consent recording were deleted (retention)


VOICE_UPDATABLE: Final = frozenset({"job_id", "note", "state", "settled_at", "recordings_deleted_at"})


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
    """The tenant's Redis hash: id, name, created_at, revoked, one field per limit, one per policy field."""
    limits = {name: str(getattr(tenant.limits, name)) for name in TenantLimits.names()}
    return {"id": tenant.id, "name": tenant.name, "created_at": repr(tenant.created_at),
            "revoked": "1" if tenant.revoked else "0", **limits, **tenant.policy.fields()}


def tenant_from(fields: Mapping[str, str]) -> Tenant:
    try:
        limits = TenantLimits(**{name: int(fields[name]) for name in TenantLimits.names()})
        policy = TenantPolicy.from_fields(fields)
        return Tenant(fields["id"], fields["name"], limits, float(fields["created_at"]), fields["revoked"] == "1",
                      policy)
    except (KeyError, ValueError, InvalidLimits, InvalidPolicy) as exc:
        raise StoreError(f"the record of tenant {fields.get('id', '?')!r} in Redis is damaged ({exc!r}); "
                         "fix it with `voicering tenant limits`, `voicering tenant policy` or redis-cli") from None


def voice_from(raw: str) -> TenantVoice:
    data = json.loads(raw)
    return TenantVoice(**{f.name: data[f.name] for f in dataclasses.fields(TenantVoice) if f.name in data})


def pairs(flat: list[str]) -> dict[str, str]:
    """HGETALL's flat [field, value, ...] reply (as a Lua script returns it) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))
