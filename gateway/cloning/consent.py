"""Spoken consent: one-time phrases a creator reads aloud, issued by `POST /v1/voices/consent`.

A phrase is PHRASE_WORDS_PER_PHRASE random words from PHRASE_WORDS, bound to one tenant and one
voice name, valid for CONSENT_PHRASE_TTL_S. The upload of that voice sends a recording of the
creator reading `text_to_read` (`consent_audio`) with the phrase's `consent_id`; the gateway checks
here only that the phrase was issued to this tenant for this voice, is not expired and not used,
and takes it (one atomic script) just before the job is queued. Whether the recording says the
phrase, in the uploads' voice, is the training job's check (lora_training.consent).

Each phrase is one Redis hash, `<tenant prefix>:consent:<tenant id>:<consent id>`, kept
CONSENT_RECORD_KEEP_S past its expiry so a late upload hears "expired" or "used", not "unknown";
Redis drops it then. Issuance is counted against the tenant's requests_per_minute, which bounds
how many a tenant can hold.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gateway.cloning.errors import BadUpload
from gateway.tenants import Tenant, redis_errors

__all__ = ["CONSENT_PHRASE_TTL_S", "CONSENT_RECORD_KEEP_S", "ConsentPhrase", "ConsentStore", "PHRASE_WORDS",
           "PHRASE_WORDS_PER_PHRASE", "text_to_read"]

CONSENT_PHRASE_TTL_S: Final = 600.0  # a phrase is good for 10 minutes: read it and upload
CONSENT_RECORD_KEEP_S: Final = 3600  # its record stays this long after it expired or was used
PHRASE_WORDS_PER_PHRASE: Final = 5  # 35 words, 5 distinct in order: ~25 bits, for a phrase that lives 10 minutes
# Short, common, distinct words that Whisper tiny.en hears right in espeak-ng speech (the male en-us
# and the female en+f3 voice, read in the sentence `text_to_read` makes): of 60 candidates, these
# were heard in all 4 readings, and then in all 6 more of a second round (purple and rabbit, missed
# 3 times in 12 there, were dropped). docs/training.md, "Spoken consent", has the figures.
PHRASE_WORDS: Final = (
    "apple", "basket", "blanket", "camera", "candle", "carpet", "castle", "coffee", "dragon", "garden",
    "guitar", "hammer", "island", "lemon", "magnet", "melon", "mirror", "monkey", "mountain", "music",
    "orange", "paper", "pencil", "pocket", "rocket", "silver", "sugar", "summer", "table", "tiger",
    "tomato", "turtle", "wallet", "winter", "yellow",
)
_TEXT: Final = "I consent to the training and use of a synthetic copy of my voice. My words are: {words}."


def text_to_read(phrase: str) -> str:
    """What the creator reads aloud: the consent sentence, then the phrase's words."""
    return _TEXT.format(words=", ".join(phrase.split()))


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


# KEYS: the phrase's hash. ARGV: voice name, now (unix s), "1" to take it. The states in order:
# unknown (never issued to this tenant, or long gone), used, other voice, expired, ok.
_CLAIM = """
local f = redis.call('HMGET', KEYS[1], 'name', 'phrase', 'issued_at', 'expires_at', 'used_at')
if not f[1] then return {'unknown'} end
if f[5] then return {'used'} end
if f[1] ~= ARGV[1] then return {'other_voice', f[1]} end
if tonumber(f[4]) <= tonumber(ARGV[2]) then return {'expired'} end
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'used_at', ARGV[2]) end
return {'ok', f[2], f[3], f[4]}
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

    def key(self, tenant_id: str, consent_id: str) -> str:
        return f"{self._prefix}:{tenant_id}:{consent_id}"

    def issue(self, tenant: Tenant, name: str) -> ConsentPhrase:
        """A fresh phrase for the tenant's voice `name` (checked by the caller)."""
        rng = secrets.SystemRandom()
        words = " ".join(rng.sample(PHRASE_WORDS, PHRASE_WORDS_PER_PHRASE))
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
        return self._claimed(tenant, consent_id, name, take=False)

    def take(self, tenant: Tenant, consent_id: str, name: str) -> ConsentPhrase:
        """`check`, and mark it used in the same atomic step: of two uploads racing with one phrase, one wins."""
        return self._claimed(tenant, consent_id, name, take=True)

    def _claimed(self, tenant: Tenant, consent_id: str, name: str, *, take: bool) -> ConsentPhrase:
        if not consent_id.startswith("consent_") or not consent_id[8:].isalnum() or len(consent_id) > 64:
            raise _unknown()
        with redis_errors():
            reply = self._claim(keys=[self.key(tenant.id, consent_id)],
                                args=[name, repr(self._clock()), "1" if take else "0"])
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
