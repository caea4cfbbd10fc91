"""The local store: what it lists, and that resolving (file I/O) never runs on the event loop."""

from __future__ import annotations

import asyncio
import shutil
import threading

from gpu_worker.adapters import STAGING_DIR, STAGING_TENANT, AdapterCache, AdapterStore, publish_adapter


def test_voices_never_lists_staging_adapters_or_hidden_dirs(stand_in, tmp_path):
    store_dir = tmp_path / "store"
    for voice in ("tara", "acme/leo", f"{STAGING_TENANT}/3f2a9c1b0d4e"):
        publish_adapter(stand_in.voice("tara"), store_dir, voice)
    shutil.copytree(store_dir / "tara", store_dir / ".trash" / "tara")
    shutil.copytree(store_dir / "tara", store_dir / "acme" / ".old")
    (store_dir / STAGING_DIR / "inflight").mkdir(parents=True)
    store = AdapterStore(store_dir, base_voices=("base",))
    assert store.voices() == ["base", "acme/leo", "tara"]
    assert store.resolve(f"{STAGING_TENANT}/3f2a9c1b0d4e").adapter_path  # still resolvable for validation


class ThreadSpyStore(AdapterStore):
    """Records the thread each resolve ran on."""

    def resolve(self, voice_id):
        self.threads.append(threading.get_ident())
        return super().resolve(voice_id)


async def test_local_resolution_runs_off_the_event_loop(stand_in, tmp_path):
    publish_adapter(stand_in.voice("tara"), tmp_path / "store", "tara")
    store = ThreadSpyStore(tmp_path / "store", base_voices=("base",))
    store.threads = []
    cache = AdapterCache(store, None, capacity=2)
    await asyncio.gather(cache.acquire("tara"), cache.acquire("tara"), cache.acquire("base"))
    assert store.remote is False and len(store.threads) == 3
    assert threading.get_ident() not in store.threads
