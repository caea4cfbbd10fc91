"""The remote tier: adapters in an fsspec store (``s3://...``, ``memory://...``) served from private
local copies that are revalidated, removed when withdrawn, and capped in size.

- **Revalidation.** A copy is served without asking the remote for ``revalidate_s`` after its last
  check; then one listing of the voice's directory (fresh, never fsspec's listing cache) gives each
  served file's size and etag/mtime. The same version keeps the copy; a new one is fetched and
  swapped in (a new inode, so the store gives it a new LoRA id and vLLM never serves old weights);
  a voice gone from the remote (its creator withdrew consent) is removed locally and becomes
  `UnknownVoice`. When the remote cannot be reached the copy keeps serving until the next check.
- **Private cache.** The cache directory (default ``$XDG_CACHE_HOME/voicering/adapters``, else
  ``~/.cache/voicering/adapters``) is created 0700; one writable by others, or owned by another
  user, is refused: whoever can write there chooses the weights a voice speaks with.
- **Size cap.** Copies are evicted least recently used first once they exceed ``max_bytes`` (the
  copy just fetched always stays). Each copy records its remote version in `VERSION_FILE`, so a
  restart keeps the cache and revalidates each copy on its first use.

Blocking (filesystem and network): the store calls it from a thread, never on the event loop.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpu_worker.adapters.layout import CONFIG, PICKLED_SUFFIXES, SERVED_FILES, STAGING_DIR, WEIGHTS
from gpu_worker.adapters.publish import swap_in
from gpu_worker.adapters.validation import adapter_error, validate_adapter
from gpu_worker.errors import AdapterError, UnknownVoice

__all__ = ["VERSION_FILE", "RemoteTier", "default_cache_dir", "private_dir", "remote_version"]

log = logging.getLogger(__name__)

VERSION_FILE: Final = ".remote-version"  # inside each copy; hidden, never loaded by vLLM
ABANDONED_S: Final = 3600.0  # a staging directory this old is a crashed download, not one in flight
# fields of an fsspec listing entry that change when a file is rewritten (backends differ in which they have)
_VERSION_FIELDS: Final = ("size", "ETag", "etag", "md5Hash", "generation", "VersionId", "mtime",
                          "LastModified", "last_modified", "updated", "created")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/voicering/adapters`` (``~/.cache`` when unset): per user, never shared /tmp."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voicering" / "adapters"


def private_dir(path: Path) -> Path:
    """Create ``path`` 0700 (parents as needed) and refuse it when others could write into it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = os.stat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"adapter cache {path} is not a directory")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"adapter cache {path} is owned by uid {info.st_uid}, not this user: "
                              "point adapter_cache_dir at a directory of your own")
    if info.st_mode & stat.S_IWOTH:
        raise PermissionError(f"adapter cache {path} is writable by every user (mode {stat.S_IMODE(info.st_mode):o}): "
                              f"run 'chmod 700 {path}' or point adapter_cache_dir elsewhere")
    return path


def remote_version(entries: dict[str, dict]) -> str:
    """What identifies one publication of a voice: each served file's name, size and etag/mtime."""
    return json.dumps([[name, *(str(info[k]) for k in _VERSION_FIELDS if k in info)]
                       for name, info in sorted(entries.items()) if name in SERVED_FILES])


@dataclass(slots=True)
class _Copy:
    version: str
    size: int
    checked_at: float  # clock time of the last remote check; -inf: never checked by this process


class RemoteTier:
    """Voice id -> validated local copy of its remote adapter (see the module docstring)."""

    def __init__(self, url: str, cache_dir: Path, *, max_rank: int, base_model: str | None,
                 revalidate_s: float, max_bytes: int, clock: Callable[[], float]) -> None:
        import fsspec

        self.url = url
        self.cache_dir = private_dir(cache_dir)
        self.revalidate_s = revalidate_s
        self.max_bytes = max_bytes
        self._max_rank, self._base_model, self._clock = max_rank, base_model, clock
        self._fs, base = fsspec.core.url_to_fs(url)
        self._base = base.rstrip("/")
        self._copies: OrderedDict[str, _Copy] = OrderedDict()  # voice id -> copy, least recently used first
        self._lock = threading.Lock()  # guards _copies, _busy, _scanned
        self._busy: dict[str, list] = {}  # voice id -> [lock, holders]
        self._scanned = False

    def fetch(self, voice_id: str) -> Path:
        """The local copy of a valid voice id's adapter, current within ``revalidate_s``."""
        self._scan_once()
        with self._voice(voice_id):
            local = self.cache_dir / voice_id
            with self._lock:
                copy = self._copies.get(voice_id)
                if copy is not None:
                    self._copies.move_to_end(voice_id)
            now = self._clock()
            fresh = copy is not None and now - copy.checked_at < self.revalidate_s
            if fresh and (local / CONFIG).is_file():
                return local
            try:
                entries = self._listing(voice_id)
            except (UnknownVoice, AdapterError):
                self._forget(voice_id)  # withdrawn, or republished unservable: never fall back to old weights
                raise
            except Exception as exc:  # remote unreachable: keep serving what we hold until the next check
                if copy is None or not (local / CONFIG).is_file():
                    raise
                log.warning("cannot revalidate voice %s at %s (%s); serving the local copy", voice_id, self.url, exc)
                copy.checked_at = now
                return local
            version = remote_version(entries)
            if copy is not None and copy.version == version and (local / CONFIG).is_file():
                copy.checked_at = now
                return local
            try:
                size = self._download(voice_id, entries, version, local)
            except Exception:
                self._forget(voice_id)  # the copy is stale either way
                raise
            with self._lock:
                self._copies[voice_id] = _Copy(version, size, now)
                self._copies.move_to_end(voice_id)
        self._trim(keep=voice_id)
        return local

    def _listing(self, voice_id: str) -> dict[str, dict]:
        remote = f"{self._base}/{voice_id}"
        self._fs.invalidate_cache(remote)  # s3fs & co. cache listings: a stale one would hide a change
        try:
            entries = {Path(e["name"]).name: e for e in self._fs.ls(remote, detail=True)}
        except FileNotFoundError:
            entries = {}
        if CONFIG not in entries:
            raise UnknownVoice(f"unknown voice '{voice_id}': no adapter published for it in {self.url}")
        pickled = sorted(n for n in entries if n.endswith(PICKLED_SUFFIXES))
        if pickled:
            raise adapter_error(voice_id, f"adapter holds pickled weights ({', '.join(pickled)}); "
                                          f"only {WEIGHTS} is ever loaded")
        return entries

    def _download(self, voice_id: str, entries: dict[str, dict], version: str, local: Path) -> int:
        """Copy the served files through a staging directory, validate, swap in; returns bytes on disk."""
        staging = self.cache_dir / STAGING_DIR / uuid.uuid4().hex
        staging.mkdir(parents=True)
        try:
            for name in SERVED_FILES:
                if name in entries:
                    self._fs.get_file(f"{self._base}/{voice_id}/{name}", str(staging / name))
            (staging / VERSION_FILE).write_text(version)
            validate_adapter(staging, voice_id=voice_id, max_rank=self._max_rank, base_model=self._base_model)
            local.parent.mkdir(parents=True, exist_ok=True)
            if local.exists():
                swap_in(staging, local)
            else:
                os.rename(staging, local)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return _tree_size(local)

    def _forget(self, voice_id: str) -> None:
        """Drop a voice's copy (caller holds its voice lock)."""
        with self._lock:
            self._copies.pop(voice_id, None)
        shutil.rmtree(self.cache_dir / voice_id, ignore_errors=True)

    def _trim(self, keep: str) -> None:
        """Evict least recently used copies until the cache fits ``max_bytes``; busy voices are skipped."""
        with self._lock:
            total = sum(c.size for c in self._copies.values())
            victims = [v for v in self._copies if v != keep]
        for voice_id in victims:
            if total <= self.max_bytes:
                return
            with self._voice(voice_id, wait=False) as claimed:
                with self._lock:
                    copy = self._copies.pop(voice_id, None) if claimed else None
                if copy is None:
                    continue
                shutil.rmtree(self.cache_dir / voice_id, ignore_errors=True)
            total -= copy.size
            log.info("adapter cache evicted voice %s (%d bytes; cap %d)", voice_id, copy.size, self.max_bytes,
                     extra={"voice": voice_id, "bytes": copy.size})

    def _scan_once(self) -> None:
        """Adopt the copies a previous process left (least recently used = oldest mtime), each to be
        revalidated on first use; clear staging directories abandoned by a crash."""
        with self._lock:
            if self._scanned:
                return
            self._scanned = True
            _remove_abandoned(self.cache_dir / STAGING_DIR, older_than=time.time() - ABANDONED_S)
            found = []
            for path in _copy_dirs(self.cache_dir):
                try:
                    version = (path / VERSION_FILE).read_text()
                except OSError:
                    shutil.rmtree(path, ignore_errors=True)  # not ours, or from an older layout
                    continue
                voice_id = path.relative_to(self.cache_dir).as_posix()
                found.append((path.stat().st_mtime, voice_id, version, _tree_size(path)))
            for _, voice_id, version, size in sorted(found):
                self._copies[voice_id] = _Copy(version, size, float("-inf"))

    @contextmanager
    def _voice(self, voice_id: str, *, wait: bool = True) -> Iterator[bool]:
        """Hold the voice's lock: one fetch or eviction per voice at a time. With ``wait=False``,
        yield False at once when another thread holds or awaits it."""
        with self._lock:
            entry = None
            if wait or voice_id not in self._busy:
                entry = self._busy.setdefault(voice_id, [threading.Lock(), 0])
                entry[1] += 1
        if entry is None:
            yield False
            return
        try:
            with entry[0]:
                yield True
        finally:
            with self._lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._busy[voice_id]


def _copy_dirs(root: Path) -> Iterator[Path]:
    """Adapter directories at ``root/name`` and ``root/tenant/name`` (hidden entries skipped)."""
    for entry in root.iterdir():
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        if (entry / CONFIG).is_file():
            yield entry
            continue
        yield from (sub for sub in entry.iterdir() if not sub.name.startswith(".") and (sub / CONFIG).is_file())


def _remove_abandoned(staging: Path, *, older_than: float) -> None:
    if staging.is_dir():
        for entry in staging.iterdir():
            try:
                abandoned = entry.stat().st_mtime < older_than
            except FileNotFoundError:  # finished meanwhile
                continue
            if abandoned:
                shutil.rmtree(entry, ignore_errors=True)


def _tree_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
