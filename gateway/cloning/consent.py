"""Spoken consent: one-time phrases a creator reads aloud, issued by `POST /v1/voices/consent`.

A phrase is PHRASE_WORDS_PER_PHRASE distinct random words from PHRASE_WORDS (gateway.cloning.
phrase_words) and one two-digit number (PHRASE_NUMBERS) at a random place among them, bound to one
tenant and one voice name, valid for CONSENT_PHRASE_TTL_S. The upload of that voice sends a
recording of the creator reading `text_to_read` (`consent_audio`: the consent sentence, then the
phrase; lora_training.consent.consent_text) with the phrase's `consent_id`; the gateway checks
here only that the phrase was issued to this tenant for this voice, is not expired and not used,
and takes it for the upload's job (one atomic script) as the last step before the job is queued;
an upload refused after that (the queue down: a retryable 503) gives it back (`give_back`), so
the speaker's recording stays good for the retry. Whether the recording says the text, and
nothing much besides, in the uploads' voice, is the training job's check (lora_training.consent).

Each phrase is one Redis hash, `<tenant prefix>:consent:<tenant id>:<consent id>`, kept
CONSENT_RECORD_KEEP_S past its expiry so a late upload hears "expired" or "used", not "unknown";
Redis drops it then. Issuance is counted against the tenant's requests_per_minute, which bounds
how many a tenant can hold.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gateway.cloning.errors import BadUpload
from gateway.cloning.phrase_words import PHRASE_WORDS
from gateway.tenants import Tenant, redis_errors
from lora_training.consent import consent_text

__all__ = ["CONSENT_PHRASE_TTL_S", "CONSENT_RECORD_KEEP_S", "ConsentPhrase", "ConsentStore", "PHRASE_NUMBERS",
           "PHRASE_WORDS", "PHRASE_WORDS_PER_PHRASE", "new_phrase", "text_to_read"]

CONSENT_PHRASE_TTL_S: Final = 600.0  # a phrase is good for 10 minutes: read it and upload
CONSENT_RECORD_KEEP_S: Final = 3600  # its record stays this long after it expired or was used
PHRASE_WORDS_PER_PHRASE: Final = 6  # distinct words from PHRASE_WORDS, in a random order, and one number
PHRASE_NUMBERS: Final = tuple(n for n in range(21, 100) if n % 10)  # two words each ("forty-seven"): 72


def new_phrase(rng: random.Random | None = None) -> str:
    """A fresh phrase: PHRASE_WORDS_PER_PHRASE words and a number among them, space-separated."""
    rng = rng or secrets.SystemRandom()
    items = rng.sample(PHRASE_WORDS, PHRASE_WORDS_PER_PHRASE)
    items.insert(rng.randrange(len(items) + 1), str(rng.choice(PHRASE_NUMBERS)))
    return " ".join(items)


def text_to_read(phrase: str) -> str:
    """What the creator reads aloud: the consent sentence, then the phrase's words."""
    return consent_text(phrase)


@dataclass(frozen=True, slots=True)
class ConsentPhrase:
    """One issued phrase."""

    consent_id: str
    tenant_id: str
    name: str  # the voice it is for
    phrase: str  # its words, space-separated
    issued_at: float
    expires_at: float

    @property
    def text_to_read(self) -> str:
        return text_to_read(self.phrase)

    def to_json(self) -> dict:
        return {"object": "voice.consent", "consent_id": self.consent_id, "name": self.name, "phrase": self.phrase,
                "text_to_read": self.text_to_read, "expires_at": int(self.expires_at)}


# KEYS: the phrase's hash. ARGV: voice name, now (unix s), the taking job's id ("": only check).
# The states in order: unknown (never issued to this tenant, or long gone), used, other voice,
# expired, ok.
_CLAIM = """
local f = redis.call('HMGET', KEYS[1], 'name', 'phrase', 'issued_at', 'expires_at', 'used_at')
if not f[1] then return {'unknown'} end
if f[5] then return {'used'} end
if f[1] ~= ARGV[1] then return {'other_voice', f[1]} end
if tonumber(f[4]) <= tonumber(ARGV[2]) then return {'expired'} end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'used_at', ARGV[2], 'used_by', ARGV[3]) end
return {'ok', f[2], f[3], f[4]}
"""
# KEYS: the phrase's hash. ARGV: the job id that took it. Only that upload's take is undone.
_GIVE_BACK = """
if redis.call('HGET', KEYS[1], 'used_by') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'used_at', 'used_by')
return 1
"""


class ConsentStore:
    """Phrases in Redis, through the training queue's sync client (call it in a thread, as CloneIndex)."""

    def __init__(self, redis, prefix: str, *, ttl_s: float = CONSENT_PHRASE_TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self._prefix = f"{prefix}:consent"
        self.ttl_s = ttl_s
        self._clock = clock
        self._claim = redis.register_script(_CLAIM)
        self._give_back = redis.register_script(_GIVE_BACK)

    def key(self, tenant_id: str, consent_id: str) -> str:
        return f"{self._prefix}:{tenant_id}:{consent_id}"

    def issue(self, tenant: Tenant, name: str) -> ConsentPhrase:
        """A fresh phrase for the tenant's voice `name` (checked by the caller)."""
        words = new_phrase()
        now = self._clock()
        phrase = ConsentPhrase(f"consent_{secrets.token_hex(12)}", tenant.id, name, words, now, now + self.ttl_s)
        key = self.key(tenant.id, phrase.consent_id)
        with redis_errors():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hset(key, mapping={"name": name, "phrase": words, "issued_at": repr(now),
                                    "expires_at": repr(phrase.expires_at)})
            pipe.expire(key, int(self.ttl_s) + CONSENT_RECORD_KEEP_S)
            pipe.execute()
        return phrase

    def check(self, tenant: Tenant, consent_id: str, name: str) -> ConsentPhrase:
        """The phrase `consent_id` if an upload of voice `name` may use it now; BadUpload saying why not."""
        return self._claimed(tenant, consent_id, name, job_id="")

    def take(self, tenant: Tenant, consent_id: str, name: str, job_id: str) -> ConsentPhrase:
        """`check`, and mark it used by `job_id` in the same atomic step: of two uploads racing with one
        phrase, one wins."""
        if not job_id:
            raise ValueError("a phrase is taken by a job id")
        return self._claimed(tenant, consent_id, name, job_id=job_id)

    def give_back(self, tenant: Tenant, consent_id: str, job_id: str) -> bool:
        """Undo `job_id`'s take (its upload was refused after it: the queue was down, say), so the
        speaker's recording stays good for a retry; True if it was that job's to give back."""
        with redis_errors():
            return bool(self._give_back(keys=[self.key(tenant.id, consent_id)], args=[job_id]))

    def _claimed(self, tenant: Tenant, consent_id: str, name: str, *, job_id: str) -> ConsentPhrase:
        if not consent_id.startswith("consent_") or not consent_id[8:].isalnum() or len(consent_id) > 64:
            raise _unknown()
        with redis_errors():
            reply = self._claim(keys=[self.key(tenant.id, consent_id)], args=[name, repr(self._clock()), job_id])
        outcome = reply[0]
        if outcome == "ok":
            return ConsentPhrase(consent_id, tenant.id, name, reply[1], float(reply[2]), float(reply[3]))
        if outcome == "used":
            raise BadUpload("this consent phrase was already used by an upload; a phrase is good for one upload: "
                            "ask POST /v1/voices/consent for a new one and record it", code="consent_used",
                            param="consent_id")
        if outcome == "other_voice":
            raise BadUpload(f"this consent phrase was issued for voice {reply[1]!r}, not {name!r}: ask "
                            "POST /v1/voices/consent for a phrase with this voice's name", code="consent_other_voice",
                            param="consent_id")
        if outcome == "expired":
            raise BadUpload(f"this consent phrase has expired (a phrase is good for {self.ttl_s / 60:g} minutes): "
                            "ask POST /v1/voices/consent for a new one, record it and upload at once",
                            code="consent_expired", param="consent_id")
        raise _unknown()


def _unknown() -> BadUpload:
    return BadUpload("no consent phrase with this consent_id was issued to your account (or it is over an hour "
                     "old): send the consent_id that POST /v1/voices/consent answered", code="consent_not_found",
                     param="consent_id")
