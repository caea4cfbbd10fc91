"""The remote tier against fsspec's in-memory filesystem: revalidation, withdrawal, a private cache
directory and its size cap."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from gpu_worker.adapters import CONFIG, METADATA, STAGING_DIR, WEIGHTS, AdapterStore, default_cache_dir
from gpu_worker.errors import AdapterError, UnknownVoice


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Remote:
    """A voices directory in memory://, published to the way a trainer would."""

    def __init__(self, source: Path) -> None:
        self.fs = fsspec.filesystem("memory")
        self.root = f"/voices-{uuid.uuid4().hex}"
        self.url = f"memory://{self.root}"
        self.source = source

    def publish(self, voice: str, *, flip: int = 0) -> bytes:
        """Upload the stand-in voice; ``flip`` changes one byte of tensor data (a retrained voice)."""
        weights = bytearray((self.source / WEIGHTS).read_bytes())
        weights[-1] ^= flip
        files = {CONFIG: (self.source / CONFIG).read_bytes(), METADATA: (self.source / METADATA).read_bytes(),
                 WEIGHTS: bytes(weights)}
        for name, data in files.items():
            self.fs.pipe(f"{self.root}/{voice}/{name}", data)
        return bytes(weights)

    def withdraw(self, voice: str) -> None:
        self.fs.rm(f"{self.root}/{voice}", recursive=True)


@pytest.fixture
def remote(stand_in):
    handle = Remote(stand_in.voice("tara"))
    yield handle
    if handle.fs.exists(handle.root):
        handle.fs.rm(handle.root, recursive=True)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def store_for(remote: Remote, cache: Path, clock: Clock, **kw) -> AdapterStore:
    return AdapterStore(remote.url, cache_dir=cache, revalidate_s=10.0, clock=clock, **kw)


def test_a_republished_voice_is_served_after_at_most_revalidate_s(remote, tmp_path, clock):
    remote.publish("acme/tara")
    store = store_for(remote, tmp_path / "cache", clock)
    first = store.resolve("acme/tara")
    new = remote.publish("acme/tara", flip=1)
    clock.now += 9
    assert store.resolve("acme/tara").lora_id == first.lora_id  # within the period: no remote round trip
    clock.now += 2
    second = store.resolve("acme/tara")
    assert second.lora_id != first.lora_id  # a new id: vLLM cannot serve the old weights from its cache
    assert (Path(second.adapter_path) / WEIGHTS).read_bytes() == new


def test_a_withdrawn_voice_stops_within_revalidate_s_and_its_copy_is_removed(remote, tmp_path, clock):
    remote.publish("acme/tara")
    store = store_for(remote, tmp_path / "cache", clock)
    local = Path(store.resolve("acme/tara").adapter_path)
    remote.withdraw("acme/tara")
    clock.now += 10
    with pytest.raises(UnknownVoice, match="no adapter published"):
        store.resolve("acme/tara")
    assert not local.exists() and store.voices() == []


def test_revalidation_is_one_listing_per_period_and_unchanged_copies_stay(remote, tmp_path, clock, monkeypatch):
    remote.publish("tara")
    calls: list[str] = []
    real_ls = MemoryFileSystem.ls

    def counted(self, path, *args, **kwargs):
        calls.append(path)
        return real_ls(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "ls", counted)
    store = store_for(remote, tmp_path / "cache", clock)
    voice = store.resolve("tara")
    inode = (Path(voice.adapter_path) / WEIGHTS).stat().st_ino
    for _ in range(50):
        clock.now += 0.1
        store.resolve("tara")
    assert len(calls) == 1
    clock.now += 10
    assert store.resolve("tara").lora_id == voice.lora_id and len(calls) == 2
    assert (Path(voice.adapter_path) / WEIGHTS).stat().st_ino == inode  # same version: not downloaded again


def test_an_unreachable_remote_keeps_serving_the_copy_until_the_next_check(remote, tmp_path, clock, monkeypatch):
    remote.publish("tara")
    store = store_for(remote, tmp_path / "cache", clock)
    voice = store.resolve("tara")

    def down(self, path, *a, **kw):
        raise ConnectionError("no route to bucket")

    monkeypatch.setattr(MemoryFileSystem, "ls", down)
    clock.now += 10
    assert store.resolve("tara").lora_id == voice.lora_id
    with pytest.raises(ConnectionError):  # nothing held locally: the failure is the request's
        store_for(remote, tmp_path / "other-cache", clock).resolve("tara")


def test_a_restart_revalidates_the_copies_it_finds(remote, tmp_path, clock):
    remote.publish("tara")
    remote.publish("leo")
    before = store_for(remote, tmp_path / "cache", clock)
    tara = Path(before.resolve("tara").adapter_path)
    before.resolve("leo")
    new = remote.publish("leo", flip=1)
    remote.withdraw("tara")
    after = store_for(remote, tmp_path / "cache", clock)  # a new process, same clock time: no period to wait out
    assert (Path(after.resolve("leo").adapter_path) / WEIGHTS).read_bytes() == new
    with pytest.raises(UnknownVoice):
        after.resolve("tara")
    assert not tara.exists()
    remote.publish("tara")  # consent given again
    assert Path(after.resolve("tara").adapter_path) == tara and (tara / WEIGHTS).is_file()


def test_a_restart_keeps_an_unchanged_copy(remote, tmp_path, clock):
    remote.publish("tara")
    path = Path(store_for(remote, tmp_path / "cache", clock).resolve("tara").adapter_path)
    inode = (path / WEIGHTS).stat().st_ino
    assert Path(store_for(remote, tmp_path / "cache", clock).resolve("tara").adapter_path) == path
    assert (path / WEIGHTS).stat().st_ino == inode


def test_the_default_cache_is_private_to_the_user(remote, tmp_path, clock, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    remote.publish("tara")
    store = AdapterStore(remote.url, clock=clock)
    assert store.cache_dir == default_cache_dir() == tmp_path / "xdg" / "voicering" / "adapters"
    assert stat.S_IMODE(store.cache_dir.stat().st_mode) == 0o700
    assert Path(store.resolve("tara").adapter_path).is_relative_to(store.cache_dir)


def test_a_cache_dir_others_can_write_is_refused(remote, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by every user"):
        AdapterStore(remote.url, cache_dir=shared)


def test_a_cache_dir_owned_by_another_user_is_refused(remote, tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: theirs.stat().st_uid + 1)
    with pytest.raises(PermissionError, match="not this user"):
        AdapterStore(remote.url, cache_dir=theirs)


def test_the_cache_is_capped_least_recently_used_first(remote, tmp_path, clock):
    for voice in ("a", "b", "c"):
        remote.publish(voice)
    size = sum(len(remote.fs.cat(f"{remote.root}/a/{name}")) for name in (CONFIG, METADATA, WEIGHTS))
    store = store_for(remote, tmp_path / "cache", clock, cache_max_bytes=int(2.5 * size))
    a = Path(store.resolve("a").adapter_path)
    store.resolve("b")
    store.resolve("a")  # a is now more recent than b
    store.resolve("c")
    assert a.exists() and not (tmp_path / "cache" / "b").exists() and (tmp_path / "cache" / "c").exists()
    assert Path(store.resolve("b").adapter_path).exists()  # fetched again on demand
    assert sorted(store.voices()) == ["b", "c"]  # ... evicting a, now the least recently used


def test_a_republish_that_fails_validation_never_falls_back_to_the_old_copy(remote, tmp_path, clock):
    remote.publish("tara")
    store = store_for(remote, tmp_path / "cache", clock)
    local = Path(store.resolve("tara").adapter_path)
    remote.fs.pipe(f"{remote.root}/tara/adapter_model.bin", b"\x80\x04")
    clock.now += 10
    with pytest.raises(AdapterError, match="pickled"):
        store.resolve("tara")
    assert not local.exists()


def test_a_restart_clears_only_abandoned_downloads(remote, tmp_path, clock):
    remote.publish("tara")
    staging = tmp_path / "cache" / STAGING_DIR
    (staging / "crashed").mkdir(parents=True)
    (staging / "inflight").mkdir()  # another worker process sharing the cache, mid-download
    os.utime(staging / "crashed", (0, 0))
    store_for(remote, tmp_path / "cache", clock).resolve("tara")
    assert sorted(p.name for p in staging.iterdir()) == ["inflight"]
