"""Adapter store, validation, atomic publish and the engine-cache LRU, without an engine: every bad
adapter is a clear error for its voice only. The same adapters through a real worker: test_fleet.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_worker.adapters import (
    CONFIG,
    STAGING_DIR,
    WEIGHTS,
    AdapterCache,
    AdapterStore,
    base_model_key,
    publish_adapter,
    same_base_model,
    validate_adapter,
)
from gpu_worker.errors import AdapterError, UnknownVoice
from gpu_worker.metrics import WorkerMetrics


@pytest.fixture
def good(stand_in, tmp_path) -> Path:
    path = tmp_path / "src" / "tara"
    shutil.copytree(stand_in.voice("tara"), path)
    return path


def edit_config(path: Path, **changes) -> Path:
    config = json.loads((path / CONFIG).read_text())
    config.update(changes)
    (path / CONFIG).write_text(json.dumps(config))
    return path


def test_stand_in_voice_is_valid(good, stand_in):
    info = validate_adapter(good, voice_id="tara", max_rank=32, base_model=str(stand_in.model))
    assert info.rank == 16 and info.prompt_name == "tara" and info.base_model == str(stand_in.model)


def bad_cases(good: Path):
    def pickled_only():
        (good / WEIGHTS).rename(good / "adapter_model.bin")

    def pickled_beside():
        (good / "adapter_model.bin").write_bytes(b"\x80\x04pickle")

    def half_written():
        data = (good / WEIGHTS).read_bytes()
        (good / WEIGHTS).write_bytes(data[: len(data) // 2])

    def garbage_weights():
        (good / WEIGHTS).write_bytes(b"\xff" * 64)

    def lm_head_inside():
        tensors = load_file(good / WEIGHTS)
        tensors["base_model.model.lm_head.lora_A.weight"] = torch.zeros(16, 256)
        save_file(tensors, good / WEIGHTS)

    def rank_in_file():
        tensors = {k: (torch.zeros(64, v.shape[1]) if "lora_A" in k else torch.zeros(v.shape[0], 64))
                   for k, v in load_file(good / WEIGHTS).items()}
        save_file(tensors, good / WEIGHTS)

    return {
        "pickled weights": (pickled_only, "pickled"),
        "pickle beside safetensors": (pickled_beside, "pickled"),
        "config not JSON": (lambda: (good / CONFIG).write_text("{nope"), "not valid JSON"),
        "missing config": (lambda: (good / CONFIG).unlink(), "no adapter_config.json"),
        "missing weights": (lambda: (good / WEIGHTS).unlink(), "no adapter_model.safetensors"),
        "half-written weights": (half_written, "not a complete safetensors"),
        "garbage weights": (garbage_weights, "not a complete safetensors"),
        "rank above max": (lambda: edit_config(good, r=64), "exceeds this worker's max_lora_rank 32"),
        "rank pattern above max": (lambda: edit_config(good, rank_pattern={"q_proj": 48}), "max_lora_rank 32"),
        "rank in file above max": (rank_in_file, "rank above max_lora_rank"),
        "embedding target": (lambda: edit_config(good, target_modules=["q_proj", "embed_tokens"]), "target modules"),
        "regex target": (lambda: edit_config(good, target_modules=".*proj"), "target modules"),
        "lm_head weights": (lm_head_inside, "lm_head"),
        "modules_to_save": (lambda: edit_config(good, modules_to_save=["lm_head"]), "modules_to_save"),
        "DoRA": (lambda: edit_config(good, use_dora=True), "DoRA"),
        "bias": (lambda: edit_config(good, bias="all"), "bias"),
        "PiSSA init": (lambda: edit_config(good, init_lora_weights="pissa_niter_4"), "pissa"),
        "not LoRA": (lambda: edit_config(good, peft_type="IA3"), "not a LoRA"),
        "other base model": (lambda: edit_config(good, base_model_name_or_path="meta-llama/Llama-3.2-3B"), "trained on"),
    }


@pytest.mark.parametrize("case", list(bad_cases(Path("."))))
def test_bad_adapters_are_clear_errors_for_their_voice(good, stand_in, case):
    mutate, needle = bad_cases(good)[case]
    mutate()
    with pytest.raises(AdapterError) as err:
        validate_adapter(good, voice_id="acme/tara", max_rank=32, base_model=str(stand_in.model))
    assert err.value.message.startswith("voice 'acme/tara': ")
    assert needle in err.value.message
    assert err.value.code == "bad_adapter" and not err.value.retryable


@pytest.mark.parametrize(("declared", "served", "same"), [
    ("canopylabs/orpheus-3b-0.1-ft", "/models/orpheus-3b-0.1-ft", True),
    ("/root/.cache/huggingface/hub/models--canopylabs--orpheus-3b-0.1-ft/snapshots/0a1b", "canopylabs/orpheus-3b-0.1-ft", True),
    ("canopylabs/orpheus-3b-0.1-ft", "canopylabs/orpheus-3b-0.1-pretrained", False),
])
def test_base_model_match_by_hub_id_path_or_snapshot(declared, served, same):
    assert same_base_model(declared, served) is same
    assert base_model_key("a/b/") == "b"


def test_voicering_json_base_model_overrides_the_peft_field(good):
    edit_config(good, base_model_name_or_path="/tmp/somewhere/else")
    (good / "voicering.json").write_text(json.dumps({"prompt_name": "t", "base_model": "acme/orpheus"}))
    info = validate_adapter(good, voice_id="t", max_rank=32, base_model="/srv/models/orpheus")
    assert info.prompt_name == "t" and info.base_model == "acme/orpheus"


def test_publish_is_atomic_and_never_overwrites_unless_asked(good, tmp_path, stand_in):
    store = tmp_path / "store"
    info = publish_adapter(good, store, "acme/tara", max_rank=32)
    assert info.path == store / "acme" / "tara" and (info.path / WEIGHTS).is_file()
    assert not (info.path / "README.md").exists()  # only the served files travel
    assert not any((store / STAGING_DIR).iterdir())
    with pytest.raises(FileExistsError):
        publish_adapter(good, store, "acme/tara")
    before = (store / "acme/tara" / WEIGHTS).stat().st_ino
    tensors = {k: v + 1 for k, v in load_file(good / WEIGHTS).items()}
    save_file(tensors, good / WEIGHTS)
    publish_adapter(good, store, "acme/tara", replace=True)
    assert (store / "acme/tara" / WEIGHTS).stat().st_ino != before
    assert torch.equal(load_file(store / "acme/tara" / WEIGHTS)["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"],
                       tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"])
    assert not any((store / STAGING_DIR).iterdir())


def test_the_clone_reports_samples_travel_with_the_voice_and_nothing_else_under_them(good, tmp_path):
    from gpu_worker.adapters.layout import REPORT_AUDIO, REPORT_AUDIO_MAX_BYTES, REPORT_AUDIO_MAX_FILES

    samples = good / REPORT_AUDIO
    samples.mkdir()
    for i in range(REPORT_AUDIO_MAX_FILES + 2):
        (samples / f"{i:02d}.wav").write_bytes(b"RIFF" + bytes([i]) * 60)
    (samples / "notes.txt").write_text("not a sample")
    (samples / "big.wav").write_bytes(b"\0" * 10)
    (samples / "99.wav").write_bytes(b"\0" * (REPORT_AUDIO_MAX_BYTES + 1))  # past the cap: left behind
    (samples / "65.wav").unlink()
    (samples / "65.wav").symlink_to(good / WEIGHTS)  # a link is never followed
    info = publish_adapter(good, tmp_path / "store", "acme/tara", max_rank=32)
    kept = sorted(p.name for p in (info.path / REPORT_AUDIO).iterdir())
    assert kept == [f"{i:02d}.wav" for i in range(REPORT_AUDIO_MAX_FILES)]
    assert (info.path / REPORT_AUDIO / "07.wav").read_bytes() == b"RIFF" + bytes([7]) * 60


def test_a_bad_adapter_is_never_published(good, tmp_path):
    edit_config(good, use_dora=True)
    with pytest.raises(AdapterError):
        publish_adapter(good, tmp_path / "store", "tara")
    assert not (tmp_path / "store" / "tara").exists()


def test_store_ids_are_stable_per_voice_and_change_on_republish(good, tmp_path):
    store_dir = tmp_path / "store"
    for name in ("a", "b", "acme/c"):
        publish_adapter(good, store_dir, name)
    (store_dir / STAGING_DIR / "junk").mkdir()
    store = AdapterStore(store_dir, base_voices=("base",))
    ids = {name: store.resolve(name).lora_id for name in ("a", "b", "acme/c")}
    assert len(set(ids.values())) == 3 and store.resolve("a").lora_id == ids["a"]
    assert store.resolve("base").adapter_path is None
    assert store.voices() == ["base", "a", "acme/c", "b"]
    publish_adapter(good, store_dir, "a", replace=True)  # new weights file -> new id: no stale weights
    assert store.resolve("a").lora_id not in ids.values()
    with pytest.raises(UnknownVoice):
        store.resolve("nobody")
    with pytest.raises(UnknownVoice):
        store.resolve("../etc")
    with pytest.raises(UnknownVoice):
        store.resolve(f"{STAGING_DIR}/junk")


def test_half_published_voice_is_invisible_then_complete(good, tmp_path):
    """What a reader sees while a publisher is mid-copy: nothing under the voice id."""
    store_dir = tmp_path / "store"
    staging = store_dir / STAGING_DIR / "inflight"
    staging.mkdir(parents=True)
    shutil.copyfile(good / CONFIG, staging / CONFIG)  # weights not written yet
    store = AdapterStore(store_dir)
    with pytest.raises(UnknownVoice):
        store.resolve("tara")
    assert store.voices() == []
    publish_adapter(good, store_dir, "tara")
    assert store.resolve("tara").adapter_path == str(store_dir / "tara")


def test_remote_store_copies_into_the_local_cache(good, tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    for name in (CONFIG, WEIGHTS, "voicering.json", "README.md"):
        fs.pipe(f"/voices-{os.getpid()}/tenant/tara/{name}", (good / name).read_bytes())
    fs.pipe(f"/voices-{os.getpid()}/tenant/pickled/{CONFIG}", (good / CONFIG).read_bytes())
    fs.pipe(f"/voices-{os.getpid()}/tenant/pickled/adapter_model.bin", b"\x80\x04")
    store = AdapterStore(f"memory:///voices-{os.getpid()}", cache_dir=tmp_path / "cache")
    voice = store.resolve("tenant/tara")
    assert Path(voice.adapter_path) == tmp_path / "cache" / "tenant" / "tara"
    assert sorted(p.name for p in Path(voice.adapter_path).iterdir() if not p.name.startswith(".")) == [CONFIG, WEIGHTS, "voicering.json"]
    assert store.resolve("tenant/tara").lora_id == voice.lora_id
    assert store.voices() == ["tenant/tara"]
    with pytest.raises(AdapterError, match="pickled"):
        store.resolve("tenant/pickled")
    with pytest.raises(UnknownVoice):
        store.resolve("tenant/nobody")


class FakeEngine:
    def __init__(self, fail: set[str] = frozenset()) -> None:
        self.loaded: list[str] = []
        self.fail = fail

    async def load(self, voice) -> None:
        await asyncio.sleep(0.01)
        if voice.name in self.fail:
            raise RuntimeError("engine says no")
        self.loaded.append(voice.name)


@pytest.fixture
def store_of_five(good, tmp_path) -> AdapterStore:
    for name in ("v1", "v2", "v3", "v4", "broken"):
        publish_adapter(good, tmp_path / "store", name)
    return AdapterStore(tmp_path / "store", base_voices=("base",))


async def test_cache_loads_on_first_use_and_evicts_least_recently_used(store_of_five):
    engine, metrics = FakeEngine(), WorkerMetrics()
    cache = AdapterCache(store_of_five, engine.load, capacity=2, metrics=metrics)
    for name in ("v1", "v2", "v1", "v3"):  # v2 is the least recent when v3 arrives
        voice = await cache.acquire(name)
        cache.release(voice)
    assert engine.loaded == ["v1", "v2", "v3"] and cache.resident == ["v1", "v3"]
    await cache.acquire("v2")  # evicted earlier: loaded again
    await cache.acquire("base")  # base model: nothing to load
    assert engine.loaded[-1] == "v2" and (cache.loads, cache.evictions) == (4, 2)
    text = metrics.render().decode()
    assert "voicering_worker_adapter_loads_total 4.0" in text and "voicering_worker_adapter_evictions_total 2.0" in text


async def test_concurrent_first_requests_share_one_load(store_of_five):
    engine = FakeEngine()
    cache = AdapterCache(store_of_five, engine.load, capacity=4)
    voices = await asyncio.gather(*(cache.acquire("v1") for _ in range(5)))
    assert engine.loaded == ["v1"] and len({v.lora_id for v in voices}) == 1


async def test_engine_refusal_is_this_voices_error_only(store_of_five):
    engine = FakeEngine(fail={"broken"})
    cache = AdapterCache(store_of_five, engine.load, capacity=4)
    with pytest.raises(AdapterError, match="voice 'broken': the engine could not load"):
        await cache.acquire("broken")
    assert (await cache.acquire("v1")).name == "v1"
    report = await cache.prewarm(["v2", "broken", "ghost", "v3"])
    assert report["v2"] == report["v3"] == "ready"
    assert "could not load" in report["broken"] and "unknown voice" in report["ghost"]
    assert engine.loaded == ["v1", "v2", "v3"]


async def test_a_cancelled_first_load_lets_waiters_load_it_themselves(store_of_five):
    engine = FakeEngine()
    cache = AdapterCache(store_of_five, engine.load, capacity=4)
    first = asyncio.create_task(cache.acquire("v1"))
    await asyncio.sleep(0)  # first is inside the engine load
    waiter = asyncio.create_task(cache.acquire("v1"))
    await asyncio.sleep(0)  # waiter shares that load
    first.cancel()
    assert (await waiter).name == "v1" and engine.loaded == ["v1"] and cache.resident == ["v1"]
