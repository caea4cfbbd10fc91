"""Voice id -> validated adapter, from a local directory or through the remote tier.

A local store (a directory or a shared filesystem path) is read in place: every resolve checks the
voice's directory, so a deleted voice is unknown at once and a republished one (new weights inode)
gets a new LoRA id. A remote store (any fsspec URL but ``file://``) serves revalidated local
copies (`remote.RemoteTier`). Validation runs once per adapter version, before vLLM ever sees it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_worker.adapters.layout import CONFIG, STAGING_TENANT, WEIGHTS
from gpu_worker.adapters.remote import RemoteTier, default_cache_dir
from gpu_worker.adapters.validation import AdapterInfo, validate_adapter
from gpu_worker.errors import UnknownVoice
from hashring.records import shown_voice_id, valid_voice_id

if TYPE_CHECKING:
    from gpu_worker.engine import Voice

__all__ = ["DEFAULT_CACHE_MAX_BYTES", "DEFAULT_REVALIDATE_S", "AdapterStore"]

DEFAULT_REVALIDATE_S = 30.0
DEFAULT_CACHE_MAX_BYTES = 16 * 2**30


def _is_url(root: str | Path) -> bool:
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


@dataclass(slots=True)
class AdapterStore:
    """Resolves voice ids to validated adapters; integer LoRA ids are stable per adapter version
    within a process (a republished voice gets a new id, so stale weights are never served).

    ``root``: a local directory, or an fsspec URL whose adapters are copied into ``cache_dir``
    (default: `remote.default_cache_dir`, private to this user), rechecked against the remote at
    most every ``revalidate_s`` per voice, and evicted least recently used past ``cache_max_bytes``.
    """

    root: Path | str
    max_rank: int = 32
    base_voices: tuple[str, ...] = ()
    base_model: str | None = None
    cache_dir: Path | None = None
    revalidate_s: float = DEFAULT_REVALIDATE_S
    cache_max_bytes: int = DEFAULT_CACHE_MAX_BYTES
    clock: Callable[[], float] = time.monotonic
    _remote: RemoteTier | None = field(default=None, init=False)
    _ids: dict[tuple[str, tuple], int] = field(default_factory=dict, init=False)
    _infos: dict[tuple[str, tuple], AdapterInfo] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)  # resolves run in threads

    def __post_init__(self) -> None:
        if _is_url(self.root):
            self.cache_dir = Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir()
            self._remote = RemoteTier(str(self.root), self.cache_dir, max_rank=self.max_rank,
                                      base_model=self.base_model, revalidate_s=self.revalidate_s,
                                      max_bytes=self.cache_max_bytes, clock=self.clock)
        else:
            self.root = Path(str(self.root).removeprefix("file://"))

    @property
    def remote(self) -> bool:
        return self._remote is not None

    def resolve(self, voice_id: str) -> Voice:
        """Voice id -> engine voice. Blocking (filesystem or network): call it off the event loop.
        Raises UnknownVoice, or AdapterError for an adapter that fails validation."""
        from gpu_worker.engine import Voice

        if voice_id in self.base_voices:
            return Voice(voice_id, voice_id)
        if not valid_voice_id(voice_id):
            raise UnknownVoice(f"voice {shown_voice_id(voice_id)} is not a valid voice id "
                               "(letters, digits, '._-', optional 'tenant/')")
        path = self._remote.fetch(voice_id) if self._remote is not None else self._local(voice_id)
        key = (voice_id, _version(path))
        info = self._infos.get(key)
        if info is None:
            info = validate_adapter(path, voice_id=voice_id, max_rank=self.max_rank, base_model=self.base_model)
            self._infos[key] = info
        with self._lock:
            lora_id = self._ids.setdefault(key, len(self._ids) + 1)
        return Voice(voice_id, info.prompt_name, str(path), lora_id)

    def _local(self, voice_id: str) -> Path:
        path = Path(self.root) / voice_id
        if not path.is_dir():
            raise UnknownVoice(f"unknown voice '{voice_id}': no adapter published for it on this worker")
        return path

    def voices(self) -> list[str]:
        """Base voices and the voice ids held here (a remote store: those copied locally). Hidden
        directories and lora_training's staging tenant are never listed."""
        found: list[str] = []
        root = Path(self.cache_dir) if self._remote is not None else Path(self.root)
        if root.is_dir():
            for entry in sorted(root.iterdir()):
                if entry.name.startswith(".") or entry.name == STAGING_TENANT or not entry.is_dir():
                    continue
                if (entry / CONFIG).is_file():
                    found.append(entry.name)
                    continue
                found.extend(f"{entry.name}/{sub.name}" for sub in sorted(entry.iterdir())
                             if not sub.name.startswith(".") and (sub / CONFIG).is_file())
        return [*self.base_voices, *(v for v in found if valid_voice_id(v))]


def _version(path: Path) -> tuple:
    """What makes two resolutions the same adapter: real path + weights/config identity."""
    try:
        weights, config = (path / WEIGHTS).stat(), (path / CONFIG).stat()
    except FileNotFoundError:
        return (str(path.resolve()),)
    return (str(path.resolve()), weights.st_ino, weights.st_mtime_ns, weights.st_size, config.st_mtime_ns)
