"""Tenants' pronunciation dictionaries: named sets of "sounds-like" rules, kept in Redis next to the
tenant's voices, isolated the same way (every key is under the tenant's id; a name is looked up
only among the caller's own).

Two hashes per tenant, written together by one Lua script each (`scripts`):

    {prefix}:t:{id}:pronunciations        name -> {"name", "version", "rules": [...]}  (what workers read)
    {prefix}:t:{id}:pronunciation_index   name -> {"name", "version", "rules": count, "bytes",
                                                   "created_at", "updated_at"}        (lists, resolving)

so listing and resolving a request's names read a few hundred bytes, never the rules. The rules'
format and validation are the worker's (`gpu_worker.text`: at most `MAX_RULES` rules of
at most 100 + 200 characters); this layer adds the tenant's bounds: at most
`MAX_DICTIONARIES` dictionaries and `MAX_DICTIONARY_BYTES` of stored JSON each (so one tenant
holds at most ~5 MiB), and at most `MAX_PRONUNCIATIONS` per request with `MAX_RULES` rules
together. A dictionary's `version` is a hash of its rules: it changes whenever they do, and a
worker's cache keyed by it never serves a replaced rule.

`resolve` turns a request's names into `PronunciationRef`s (the tenant's hash key, name, version)
for the worker: the caller never names a Redis key. A voice may have default dictionaries (a third
hash, voice name -> names), used by a request that names none; a dictionary some voice has as a
default cannot be deleted (`PronunciationInUse`), so a default never names a missing one. While
Redis is away a request that names none is not refused (the gateway keeps speaking for known keys
then): it uses the defaults this process last saw for the voice (`MAX_REMEMBERED_DEFAULTS`), none
if it saw none; a request that names dictionaries is refused (503), never spoken without them.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis

from gateway.tenants import scripts
from gateway.tenants.errors import (
    InvalidPronunciation,
    PronunciationExists,
    PronunciationInUse,
    PronunciationNotFound,
    QuotaExceeded,
    StoreError,
    Unavailable,
    redis_errors,
)
from gateway.tenants.keys import DEFAULT_PREFIX, KeyLayout
from gateway.tenants.records import Tenant
from gpu_worker.protocol import MAX_PRONUNCIATIONS, PronunciationRef
from gpu_worker.text import DICTIONARY_NAME, MAX_RULES, Dictionary, InvalidDictionary

__all__ = ["MAX_DICTIONARIES", "MAX_DICTIONARY_BYTES", "MAX_PRONUNCIATIONS", "PronunciationInfo", "Pronunciations"]

MAX_DICTIONARIES: Final = 20  # per tenant
MAX_DICTIONARY_BYTES: Final = 256 * 1024  # one dictionary's stored JSON (compact, UTF-8)
MAX_REMEMBERED_DEFAULTS: Final = 4096  # voices whose defaults one gateway keeps for a Redis outage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PronunciationInfo:
    """What the index holds of one dictionary (everything but its rules)."""

    name: str
    version: str
    rules: int  # how many
    bytes: int  # of its stored form
    created_at: float
    updated_at: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "rules": self.rules, "bytes": self.bytes,
                "created_at": self.created_at, "updated_at": self.updated_at}

    @classmethod
    def from_json(cls, raw: str) -> PronunciationInfo:
        try:
            d = json.loads(raw)
            return cls(d["name"], d["version"], int(d["rules"]), int(d["bytes"]), float(d["created_at"]),
                       float(d["updated_at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"a pronunciation dictionary's index entry in Redis is damaged ({exc!r}); delete it "
                             "and create it again") from None


class Pronunciations:
    """Create, list, read, replace and delete a tenant's dictionaries; resolve a request's names.
    `redis` decodes replies (`connect_redis`); the caller owns it."""

    def __init__(self, redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.keys = KeyLayout(prefix)
        self._redis = redis
        self._create = redis.register_script(scripts.CREATE_PRONUNCIATION)
        self._replace = redis.register_script(scripts.REPLACE_PRONUNCIATION)
        self._delete = redis.register_script(scripts.DELETE_PRONUNCIATION)
        self._set_defaults = redis.register_script(scripts.SET_VOICE_PRONUNCIATIONS)
        self._defaults = redis.register_script(scripts.VOICE_PRONUNCIATIONS)
        self._seen: OrderedDict[tuple[str, str], tuple[PronunciationRef, ...]] = OrderedDict()  # (tenant, voice)

    def _hashes(self, tenant: Tenant) -> list[str]:
        return [self.keys.pronunciations(tenant.id), self.keys.pronunciation_index(tenant.id)]

    async def create(self, tenant: Tenant, name: Any, rules: Any) -> PronunciationInfo:
        """A new dictionary `name` of `rules` (the API's rule objects), within the tenant's bounds."""
        dictionary, record, info = _prepared(name, rules)
        with redis_errors():
            outcome = await self._create(keys=self._hashes(tenant),
                                         args=[dictionary.name, record, json.dumps(info.to_json()), MAX_DICTIONARIES])
        if outcome == "exists":
            raise PronunciationExists(f"you already have a pronunciation dictionary named {dictionary.name!r}; "
                                      f"replace it with PUT /v1/pronunciations/{dictionary.name}, or pick another name")
        if outcome == "full":
            raise QuotaExceeded(f"you have {MAX_DICTIONARIES} pronunciation dictionaries, the most a tenant may "
                                "keep; delete one to add another (or merge two into one)", limit="pronunciations")
        return info

    async def replace(self, tenant: Tenant, name: str, rules: Any) -> PronunciationInfo:
        """Replace the rules of dictionary `name` (a new version; the next request reads them)."""
        dictionary, record, info = _prepared(name, rules)
        with redis_errors():
            raw = await self._replace(keys=self._hashes(tenant),
                                      args=[dictionary.name, record, json.dumps(info.to_json())])
        if not raw:
            raise _not_found(dictionary.name)
        return PronunciationInfo.from_json(raw)

    async def get(self, tenant: Tenant, name: str) -> tuple[PronunciationInfo, Dictionary]:
        """The dictionary `name` of this tenant, with its rules. Another tenant's of the same name is absent."""
        records, index = self._hashes(tenant)
        with redis_errors():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(index, name)
                pipe.hget(records, name)
                raw_info, raw_record = await pipe.execute()
        if raw_info is None or raw_record is None:
            raise _not_found(name)
        try:
            dictionary = Dictionary.from_json(json.loads(raw_record))
        except (ValueError, InvalidDictionary) as exc:
            raise StoreError(f"pronunciation dictionary {name!r} in Redis is damaged ({exc}); replace it") from None
        return PronunciationInfo.from_json(raw_info), dictionary

    async def list(self, tenant: Tenant) -> list[PronunciationInfo]:
        """The tenant's dictionaries, by name (without their rules)."""
        with redis_errors():
            raws = await self._redis.hvals(self.keys.pronunciation_index(tenant.id))
        return sorted((PronunciationInfo.from_json(r) for r in raws), key=lambda i: i.name)

    async def delete(self, tenant: Tenant, name: str) -> PronunciationInfo:
        with redis_errors():
            raw = await self._delete(keys=[*self._hashes(tenant), self.keys.voice_pronunciations(tenant.id)],
                                     args=[name])
        if not raw:
            raise _not_found(name)
        if isinstance(raw, list):
            raise PronunciationInUse(f"pronunciation dictionary {_shown(name)} is the default of voice {_shown(raw[1])}; "
                                     f"set that voice's defaults without it first (PUT /v1/voices/{raw[1]}/pronunciations)")
        return PronunciationInfo.from_json(raw)

    async def set_voice_default(self, tenant: Tenant, voice: str, names: Any) -> tuple[str, ...]:
        """The dictionaries a request for `voice` (the tenant's name for it) uses when it names none;
        an empty list removes the default. Checked like a request's list, and each must exist now."""
        refs = await self.resolve(tenant, names)  # the same bounds as a request's list (404, rule total)
        chosen = tuple(ref.name for ref in refs)
        with redis_errors():
            outcome = await self._set_defaults(
                keys=[self.keys.pronunciation_index(tenant.id), self.keys.voice_pronunciations(tenant.id)],
                args=[voice, json.dumps(list(chosen)), *chosen])
        if isinstance(outcome, list):  # deleted between the two steps
            raise _not_found(outcome[1])
        return chosen

    async def voice_default(self, tenant: Tenant, voice: str) -> tuple[str, ...]:
        """The names `voice` uses when a request names none (empty: none)."""
        return tuple(name for name, _ in await self._default_entries(tenant, voice))

    async def resolve_for(self, tenant: Tenant, voice: str, names: Any) -> tuple[PronunciationRef, ...]:
        """A request's references: its own `names`, or (None) the voice's default, in one round trip."""
        if names is not None:
            return await self.resolve(tenant, names)
        seen = (tenant.id, voice)
        try:
            entries = await self._default_entries(tenant, voice)
        except Unavailable as exc:
            remembered = self._seen.get(seen, ())
            log.warning("voice %r of tenant %s spoken with the default dictionaries last seen (%s): %s", voice,
                        tenant.id, ", ".join(r.name for r in remembered) or "none", exc.message)
            return remembered
        refs = self._refs(tenant, [name for name, _ in entries], [raw for _, raw in entries])
        self._seen.pop(seen, None)
        if refs:  # only voices with defaults are kept: the bound is on those
            self._seen[seen] = refs
            while len(self._seen) > MAX_REMEMBERED_DEFAULTS:
                self._seen.popitem(last=False)
        return refs

    async def _default_entries(self, tenant: Tenant, voice: str) -> list[tuple[str, str | None]]:
        with redis_errors():
            flat = await self._defaults(
                keys=[self.keys.pronunciation_index(tenant.id), self.keys.voice_pronunciations(tenant.id)], args=[voice])
        return list(zip(flat[::2], flat[1::2], strict=True))

    async def resolve(self, tenant: Tenant, names: Sequence[str]) -> tuple[PronunciationRef, ...]:
        """The references a worker reads `names` by, in order: one Redis round trip (the index only).
        InvalidPronunciation for a bad list, PronunciationNotFound for a name the tenant does not have."""
        names = check_names(names)
        if not names:
            return ()
        with redis_errors():
            raws = await self._redis.hmget(self.keys.pronunciation_index(tenant.id), list(names))
        return self._refs(tenant, names, raws)

    def _refs(self, tenant: Tenant, names: Sequence[str], raws: Sequence[str | None]) -> tuple[PronunciationRef, ...]:
        """References from the index entries of `names` (None: the tenant has no such dictionary)."""
        if not names:
            return ()
        infos = []
        for name, raw in zip(names, raws, strict=True):
            if raw is None:
                raise _not_found(name)
            infos.append(PronunciationInfo.from_json(raw))
        total = sum(i.rules for i in infos)
        if total > MAX_RULES:
            raise InvalidPronunciation(f"the dictionaries {', '.join(names)} hold {total} rules together; one request "
                                       f"may use at most {MAX_RULES}: name fewer, or merge them into one",
                                       param="pronunciations")
        key = self.keys.pronunciations(tenant.id)
        return tuple(PronunciationRef(key, i.name, i.version) for i in infos)


def check_names(names: Any) -> tuple[str, ...]:
    """A request's `pronunciations`: a list of at most MAX_PRONUNCIATIONS distinct dictionary names."""
    if names is None:
        return ()
    if not isinstance(names, list | tuple) or len(names) > MAX_PRONUNCIATIONS:
        raise InvalidPronunciation(f"'pronunciations' is a list of at most {MAX_PRONUNCIATIONS} dictionary names",
                                   param="pronunciations")
    for name in names:
        if not isinstance(name, str) or not DICTIONARY_NAME.fullmatch(name):
            raise InvalidPronunciation(f"'pronunciations' holds {_shown(name)}, which is not a dictionary name "
                                       "(1-64 letters, digits, '_', '.', '-')", param="pronunciations")
    if len(set(names)) != len(names):
        raise InvalidPronunciation("'pronunciations' names a dictionary twice", param="pronunciations")
    return tuple(names)


def _prepared(name: Any, rules: Any) -> tuple[Dictionary, str, PronunciationInfo]:
    """The validated dictionary, its stored record and its index entry (created now)."""
    if not isinstance(name, str) or not DICTIONARY_NAME.fullmatch(name):
        raise InvalidPronunciation(f"dictionary name {_shown(name)} is not usable: use 1-64 letters, digits, '_', "
                                   "'.', '-', starting with a letter or digit", param="name")
    if not isinstance(rules, list):
        raise InvalidPronunciation('\'rules\' is a list of rules: [{"written": "SQL", "spoken": "sequel"}]')
    try:
        dictionary = Dictionary.from_json({"name": name, "rules": rules})
    except InvalidDictionary as exc:
        raise InvalidPronunciation(str(exc)) from None
    version = dictionary.version
    record = json.dumps({"name": name, "version": version, "rules": dictionary.to_json()["rules"]},
                        separators=(",", ":"), ensure_ascii=False)
    try:
        size = len(record.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPronunciation("the rules hold a lone surrogate (an unpaired \\ud800-\\udfff escape); "
                                   "send valid UTF-8 text") from None
    if size > MAX_DICTIONARY_BYTES:
        raise InvalidPronunciation(f"dictionary {name!r} takes {size:,} bytes stored; the most is "
                                   f"{MAX_DICTIONARY_BYTES:,}: split it into two (a request may name "
                                   f"{MAX_PRONUNCIATIONS})")
    now = time.time()
    return dictionary, record, PronunciationInfo(name, version, len(dictionary.rules), size, now, now)


def _not_found(name: str) -> PronunciationNotFound:
    return PronunciationNotFound(f"you have no pronunciation dictionary named {_shown(name)}; list yours with "
                                 "GET /v1/pronunciations (names are case-sensitive)")


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
