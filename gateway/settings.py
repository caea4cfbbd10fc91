"""Gateway settings: one object per process, read once at start-up (env prefix VOICERING_GATEWAY_).

Defaults are not repeated here: tenant limits are read off `TenantLimits`, the stream lease off
`gateway.quotas`, the Redis timeout off hashring's `RingSettings`, each the one place it is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.quotas import DEFAULT_STREAM_LEASE_S
from gateway.tenants import DEFAULT_AUTH_CACHE_S, DEFAULT_PREFIX, TenantLimits
from hashring.settings import REDIS_URL_ENV, RingSettings
from lora_training.settings import DataParams, TrainParams

__all__ = ["GatewaySettings"]

_LIMITS = TenantLimits()
_RING = RingSettings()
# A request holds a Redis connection only for a round trip, a few times in its life, and one event
# loop makes some thousands of Redis calls a second (~7,000 measured on this 2-core box), so the
# connections busy at once are calls/s × round trip: ~10 for a Redis 1 ms away; 128 (one per 16 of
# max_connections' 2048) covers one ~10 ms away. On loopback 2048 requests × 3 calls at once ended
# as fast over 4 connections as over 128 (the loop is the limit, not the pool), and a burst of 300
# over 4 is served whole (tests/gateway/test_redis_pool.py), where redis-py's 100 with no wait
# refused 198 of them.
REQUESTS_PER_REDIS_CONNECTION = 16
MIN_REDIS_CONNECTIONS = 8


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICERING_GATEWAY_", frozen=True, populate_by_name=True)

    # Redis: VOICERING_GATEWAY_REDIS_URL, else the fleet's VOICERING_REDIS_URL (as `voicering ring` reads it).
    # None: nothing configured; the gateway then runs hashring's EmbeddedRedis and `voicering tenant`
    # uses RingSettings' default URL (see default_redis_url).
    redis_url: str | None = Field(None, validation_alias=AliasChoices("VOICERING_GATEWAY_REDIS_URL", REDIS_URL_ENV),
                                  description="Redis holding tenants, keys, quotas and usage")
    redis_timeout_s: float = Field(_RING.redis_timeout_s, gt=0, description="longest one Redis call may take")
    redis_max_connections: int | None = Field(None, ge=1, description="connections each of this process's Redis "
                                              "clients (tenant store, ring) holds at most; None: one per "
                                              f"{REQUESTS_PER_REDIS_CONNECTION} of max_connections, at least "
                                              f"{MIN_REDIS_CONNECTIONS} (see redis_pool_size)")
    redis_pool_wait_s: float = Field(_RING.redis_pool_wait_s, gt=0, description="a Redis call that finds every "
                                     "pooled connection in use waits this long for one, then the request gets 503 "
                                     "gateway_busy (Retry-After)")
    tenant_prefix: str = Field(DEFAULT_PREFIX, min_length=1, description="Redis key prefix of the tenant layer "
                                                                         "(every gateway of a fleet agrees)")
    auth_cache_s: float = Field(DEFAULT_AUTH_CACHE_S, ge=0, description="while Redis is unreachable, a key verified "
                                "this recently still authenticates (also the longest a revocation can lag)")
    stream_lease_s: float = Field(DEFAULT_STREAM_LEASE_S, gt=0, description="a crashed gateway's stream slots "
                                                                            "lapse after this long")
    # limits of a new tenant (each tenant's own are kept in Redis; `voicering tenant limits` changes them)
    default_max_streams: int = Field(_LIMITS.max_streams, ge=1, description="concurrent speech streams")
    default_requests_per_minute: int = Field(_LIMITS.requests_per_minute, ge=1)
    default_max_upload_bytes: int = Field(_LIMITS.max_upload_bytes, ge=1, description="bytes per upload")
    default_max_voices: int = Field(_LIMITS.max_voices, ge=1)
    default_max_training_jobs: int = Field(_LIMITS.max_training_jobs, ge=1, description="training jobs at once")

    # serving
    host: str = Field("127.0.0.1", description="address the HTTP server binds")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port (0: any free port)")
    workers: tuple[str, ...] = Field((), description="fixed worker websocket URLs (no ring); empty: route by the "
                                     "ring in Redis")
    ring_prefix: str = Field(_RING.prefix, min_length=1, description="the workers' ring prefix in Redis")
    cluster_token: str | None = Field(None, description="sent to workers as 'Authorization: Bearer'")
    allow_open_cluster: bool = Field(False, description="start bound beyond loopback with an empty or short "
                                     "cluster token (refused otherwise: gpu_worker.open_cluster)")
    base_voices: tuple[str, ...] = Field(("tara", "leo"), description="platform voices every tenant may speak "
                                         "(global voice ids the workers serve)")
    max_input_chars: int = Field(4096, ge=1, description="characters of `input` one speech request may carry")
    # the HTTP edge (gateway.serve, gateway.api.edge)
    http: Literal["auto", "httptools", "h11"] = Field("auto", description="uvicorn's HTTP parser (auto: httptools "
                                                      "when installed); both close slow request heads")
    header_timeout_s: float = Field(5.0, gt=0, description="a connection that has not sent a whole request head "
                                    "this long after it opened (or after its previous response) is closed")
    max_head_bytes: int = Field(60 * 1024, ge=1024, description="bytes of one request head (request line, header "
                                "fields, the empty line), counted before the parser buffers them; 431 past it "
                                "(Envoy's default; an API client or a browser sends ~1 KiB)")
    max_headers: int = Field(100, ge=8, description="header fields of one request head; 431 past it (Envoy's "
                             "default; clients send ~20)")
    body_timeout_s: float = Field(30.0, gt=0, description="longest a JSON request body may take to arrive (408)")
    max_connections: int = Field(2048, ge=1, description="open connections and requests at once; past it uvicorn "
                                 "answers 503 (uvicorn's limit_concurrency)")
    backlog: int = Field(2048, ge=1, description="connections the kernel queues before the server accepts them")
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP traces endpoint (http://collector:4318/v1/traces): "
                                      "every request's gateway hop is also exported there as a span; needs "
                                      "opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http")
    metrics_host: str = Field("127.0.0.1", description="address of the internal metrics server (GET /metrics); "
                              "the public port does not serve metrics")
    metrics_port: int | None = Field(8001, ge=0, le=65535, description="port of the internal metrics server "
                                     "(0: any free port; None: no metrics server)")
    # voices and cloning
    uploads_dir: Path = Field(Path("var/uploads"), description="where uploaded audio is kept until its voice is "
                              "deleted (the trainers read it: shared storage in a fleet)")
    voices_dir: Path = Field(Path("var/voices"), description="the adapter store the trainers publish into and "
                             "the workers read (deleting a voice removes its adapter here)")
    train_prefix: str = Field("voicering:train", min_length=1, description="Redis prefix of the training queue")
    train_timeout_s: float = Field(30.0, gt=0, description="longest one call to the training queue may take (an "
                                   "upload whose submit is not answered in it gets 503 "
                                   "training_queue_unavailable, and its job is withdrawn)")
    # what one upload may take of this process while it is received and checked (POST /v1/voices)
    max_concurrent_decodes: int = Field(4, ge=1, description="upload checks decoding audio at once in this gateway "
                                        "process; an upload past it is refused (503 decodes_busy, Retry-After)")
    max_decodes_per_tenant: int = Field(2, ge=1, description="of those, at once for one tenant; past it: 429 "
                                        "decodes_limit_exceeded, Retry-After")
    upload_idle_timeout_s: float = Field(30.0, gt=0, description="an upload body that sends nothing for this long "
                                         "is cut: 408 request_timeout, its files removed")
    upload_body_timeout_s: float = Field(900.0, gt=0, description="the longest a whole upload body may take to "
                                         "arrive: 408 request_timeout past it, its files removed")

    @field_validator("redis_url")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value or None

    def default_limits(self) -> TenantLimits:
        """Limits a tenant created without explicit ones gets."""
        return TenantLimits(**{name: getattr(self, f"default_{name}") for name in TenantLimits.names()})

    def redis_pool_size(self) -> int:
        """Connections each Redis client of this process holds at most (`redis_max_connections`, or
        sized from `max_connections`: 128 for the default 2048)."""
        if self.redis_max_connections is not None:
            return self.redis_max_connections
        return max(MIN_REDIS_CONNECTIONS, -(-self.max_connections // REQUESTS_PER_REDIS_CONNECTION))

    def default_redis_url(self) -> str:
        """`redis_url`, or hashring's default URL when none is configured (for commands that need a
        Redis that outlives them, where an embedded one would forget everything)."""
        return self.redis_url or _RING.redis_url

    # clone jobs (what POST /v1/voices submits; both travel inside each job, so every trainer runs it
    # the same way; JSON in the environment: VOICERING_GATEWAY_CLONE_PARAMS='{"max_steps": 200}')
    clone_data: DataParams = Field(DataParams(), description="which uploads a clone accepts (speech minutes, "
                                   "sample rate, clipping) and how they are cut into clips")
    clone_params: TrainParams = Field(TrainParams(), description="LoRA training parameters of clone jobs")
    clone_asr: bool = Field(True, description="the trainers transcribe uploads that come without a transcript "
                            "(VOICERING_TRAIN_ASR_MODEL, 'bundled' by default); false (for trainers run with "
                            "ASR 'off'): such uploads are refused at once")
    clone_warming_deadline_s: float = Field(600.0, gt=0, description="a published clone not prewarmed on every "
                                            "owner this long after its job was ready is made ready anyway (its "
                                            "adapter checked; workers load it on first use), and its slot freed")
