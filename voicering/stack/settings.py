"""`voicering up` settings: one object per run (env prefix VOICERING_UP_, options override).

The children keep their own settings objects (VOICERING_WORKER_*, VOICERING_GATEWAY_*, ...): `up`
passes its environment through and sets only what wires them together (ports, Redis, the shared
adapter store), so an operator's environment still tunes every process.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["UpSettings"]


class UpSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICERING_UP_", frozen=True)

    folder: Path = Field(Path("var/up"), description="logs, Redis data, the adapter store, uploads, the local "
                         "tenant's key; one `up` at a time per folder")
    workers: int = Field(2, ge=1, le=8, description="GPU workers (each ~5 GiB of memory on CPU)")
    redis_url: str | None = Field(None, description="an existing Redis; None: an embedded one kept in the folder")
    model: str | None = Field(None, description="Orpheus weights (path or hub id); None: stand-in weights")
    codec: str = Field("hubertsiuzdak/snac_24khz", description="SNAC 24 kHz weights, with `model`")
    stand_in_cache: Path = Field(Path(".cache/stand-in"), description="where stand-in weights are built (once)")
    host: str = Field("127.0.0.1", description="address every child binds")
    gateway_port: int = Field(8000, ge=1, le=65535)
    gateway_metrics_port: int | None = Field(None, ge=1, le=65535, description="the gateway's internal metrics "
                                             "server (on 127.0.0.1 whatever `host` is); None: gateway_port + 1")
    worker_port: int = Field(8765, ge=1, le=65535, description="worker i listens on worker_port + i")
    agent_port: int = Field(8081, ge=1, le=65535, description="the LiveKit agent server's health port")
    worker_id_prefix: str = Field("up-worker", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                                  description="worker i joins the ring as <prefix>-<i> (unique per Redis)")
    tenant: str = Field("local", description="the tenant `up` creates (or reuses) and prints the key of")
    trainer: bool = Field(True, description="run a training worker (voice clones from uploads)")
    agent_voice: str = Field("tara", description="voice the LiveKit agent speaks with (when LiveKit is configured)")
    max_restarts: int = Field(3, ge=0, description="restarts of one child within restart_window_s before up gives up")
    restart_window_s: float = Field(300.0, gt=0)
    start_timeout_s: float = Field(600.0, gt=0, description="longest a child may take to become healthy")

    @model_validator(mode="after")
    def _ports_fit(self) -> UpSettings:
        if self.worker_port + self.workers - 1 > 65535:
            raise ValueError(f"worker ports {self.worker_port}..{self.worker_port + self.workers - 1} exceed 65535")
        if self.gateway_metrics_port is None and self.gateway_port == 65535:
            raise ValueError("the gateway's metrics port (gateway_port + 1) exceeds 65535: set gateway_metrics_port")
        return self

    def metrics_port(self) -> int:
        return self.gateway_metrics_port or self.gateway_port + 1

    def worker_ports(self) -> list[int]:
        return [self.worker_port + i for i in range(self.workers)]

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    @property
    def voices_dir(self) -> Path:
        return self.folder / "voices"

    @property
    def uploads_dir(self) -> Path:
        return self.folder / "uploads"
