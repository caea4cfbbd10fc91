"""`voicering up`'s folder: one running `up` per folder, and what it tells others about itself.

The folder holds a lock (flock: released by the kernel when `up` dies, however it dies, so a crash
never leaves a stale lock), `up.json` (pid, state, URLs: what a second `up`, the demo or a
script reads; mode 0600: it holds the Redis URL with its password), `tenant.json` (the local
tenant's API key, mode 0600: keys are kept in Redis only as digests, so this file is the one copy
`up` can reuse on its next start), `redis-password` (the embedded Redis's, mode 0600, reused
likewise) and, when `up` binds beyond loopback, `cluster-token` (the workers' cluster token).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["AlreadyRunning", "LocalKey", "StackFolder", "UpState"]


class AlreadyRunning(Exception):
    def __init__(self, folder: Path, state: UpState | None) -> None:
        where = f" (pid {state.pid}, {state.state}; web page {state.gateway_url}/)" if state else ""
        super().__init__(f"voicering up is already running in {folder}{where}: use it, stop it (Ctrl-C in its "
                         f"terminal or `kill {state.pid if state else '<pid>'}`), or give another --folder")
        self.state = state


@dataclass(slots=True)
class UpState:
    pid: int
    state: str  # starting | ready | stopping
    gateway_url: str
    worker_urls: list[str] = field(default_factory=list)
    worker_ids: list[str] = field(default_factory=list)
    redis_url: str = ""
    tenant: str = ""
    key_file: str = ""
    logs: str = ""
    agent: bool = False
    stand_in: bool = True

    @classmethod
    def read(cls, path: Path) -> UpState | None:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (OSError, ValueError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class LocalKey:
    tenant_id: str
    tenant: str
    api_key: str


class StackFolder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock: int | None = None

    @property
    def state_file(self) -> Path:
        return self.path / "up.json"

    @property
    def key_file(self) -> Path:
        return self.path / "tenant.json"

    @property
    def token_file(self) -> Path:
        return self.path / "cluster-token"

    @property
    def redis_password_file(self) -> Path:
        return self.path / "redis-password"

    def cluster_token(self) -> str:
        """The folder's cluster token: the one kept from an earlier start, or a new one (0600)."""
        return self._kept_secret(self.token_file)

    def redis_password(self) -> str:
        """The embedded Redis's password: the one kept from an earlier start, or a new one (0600)."""
        return self._kept_secret(self.redis_password_file)

    def _kept_secret(self, path: Path) -> str:
        try:
            secret = path.read_text().strip()
            if secret:
                return secret
        except OSError:
            pass
        secret = secrets.token_urlsafe(32)
        self.path.mkdir(parents=True, exist_ok=True)
        _write_private(path, secret + "\n")
        return secret

    def acquire(self) -> None:
        """Take the folder, or raise `AlreadyRunning` with what the holder wrote about itself."""
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / "up.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(self.path, UpState.read(self.state_file)) from None
        self._lock = fd

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.state_file.unlink()
        if self._lock is not None:
            os.close(self._lock)  # drops the flock
            self._lock = None

    def write_state(self, state: UpState) -> None:
        _write_private(self.state_file, json.dumps(asdict(state), indent=2))

    def read_key(self) -> LocalKey | None:
        try:
            data = json.loads(self.key_file.read_text())
            return LocalKey(data["tenant_id"], data["tenant"], data["api_key"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_key(self, key: LocalKey) -> None:
        _write_private(self.key_file, json.dumps(asdict(key), indent=2))


def _write_private(path: Path, text: str) -> None:
    """Replace `path` atomically with `text`, readable by this user only (0600)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, 0o600)  # an older tmp file may have had other bits
    tmp.replace(path)
