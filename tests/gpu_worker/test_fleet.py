"""Many voices on one real worker (session `worker`: real vLLM engine, max_loras=2, max_streams=8,
default max_cpu_loras=16): a 50-voice burst, concurrent constrained streams, bad adapters through
the real engine, prewarm. Voices are published into the running worker's store at test time."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bench.worker import derive_voice
from gpu_worker.adapters import CONFIG, WEIGHTS, publish_adapter
from gpu_worker.client import WorkerClient, WorkerRequestError
from gpu_worker.orpheus import SAMPLES_PER_FRAME
from gpu_worker.protocol import ContextOptions


def scrape(worker) -> dict[str, float]:
    with urllib.request.urlopen(f"{worker.http}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def say_until_served(client: WorkerClient, names: list[str], max_tokens: int) -> tuple[dict, int]:
    """Every voice at once; busy ones are retried (what a gateway does) until all are served."""
    served, busy, pending = {}, 0, list(names)
    while pending:
        results = await asyncio.gather(*(
            client.say(name, "Hi there.", options=ContextOptions(max_tokens=max_tokens, seed=i))
            for i, name in enumerate(pending)
        ), return_exceptions=True)
        retry = []
        for name, result in zip(pending, results, strict=True):
            if isinstance(result, WorkerRequestError) and result.error.code == "busy":
                assert result.retryable
                busy += 1
                retry.append(name)
            elif isinstance(result, BaseException):
                raise result
            else:
                served[name] = result
        pending = retry
    return served, busy


async def test_fifty_voices_in_a_burst_with_two_slots(worker, adapter_store):
    names = [f"burst/v{i:02d}" for i in range(50)]
    for name in names:
        if not (adapter_store / name).exists():
            publish_adapter(adapter_store / "tara", adapter_store, name)
    before = scrape(worker)
    async with await WorkerClient.connect(worker.url) as client:
        served, busy = await say_until_served(client, names, max_tokens=7 * 2 + 1)
    assert sorted(served) == names
    assert busy > 0  # 50 > max_streams: the excess was refused at once, not queued
    for speech in served.values():
        assert speech.done.stats.frames == 2 and speech.done.stats.invalid_tokens == 0
        assert len(speech.pcm) == 2 * SAMPLES_PER_FRAME * 2
    after = scrape(worker)
    loads = after["voicering_worker_adapter_loads_total"] - before.get("voicering_worker_adapter_loads_total", 0)
    evictions = after["voicering_worker_adapter_evictions_total"] - before.get("voicering_worker_adapter_evictions_total", 0)
    assert loads >= 50 and evictions >= 50 - 16
    refused = sum(after.get(f'voicering_worker_rejected_total{{reason="{r}"}}', 0) for r in ("busy", "connection_limit"))
    assert refused >= busy
    health = await asyncio.to_thread(worker.health)
    assert health["status"] == "ok" and health["adapters_resident"] <= 16


async def test_eight_concurrent_constrained_streams_never_misalign(worker):
    """Mixed voices and both constrained modes in one engine batch: the processor's per-row slot
    counting holds under vLLM's scheduling, so no generated id is ever invalid. Two connections:
    one may hold only half of the worker's 8 slots."""
    async with await WorkerClient.connect(worker.url) as one, await WorkerClient.connect(worker.url) as two:
        results = await asyncio.gather(*(
            (one, two)[i % 2].say(("tara", "leo")[i % 2], f"Stream {i} speaking.",
                                  options=ContextOptions(max_tokens=7 * 6, seed=100 + i, constraint=("fused", "mask")[i // 4]))
            for i in range(8)
        ))
    for speech in results:
        stats = speech.done.stats
        assert stats.invalid_tokens == 0 and stats.frames == 6
        assert stats.tokens == 7 * 6 and len(speech.pcm) == 6 * SAMPLES_PER_FRAME * 2


def _bad_adapters(store: Path, good: Path) -> dict[str, tuple[str, str]]:
    """Adapters written straight into the store (no publish helper): voice -> (error code, needle)."""
    def copy(name: str) -> Path:
        target = store / "bad" / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(good, target)
        return target

    def config(path: Path, **changes) -> None:
        data = json.loads((path / CONFIG).read_text())
        data.update(changes)
        (path / CONFIG).write_text(json.dumps(data))

    cases = {}
    path = copy("pickled")
    (path / WEIGHTS).rename(path / "adapter_model.bin")
    cases["pickled"] = ("bad_adapter", "pickled")
    path = copy("malformed")
    (path / CONFIG).write_text("{not json")
    cases["malformed"] = ("bad_adapter", "not valid JSON")
    config(copy("rank64"), r=64)
    cases["rank64"] = ("bad_adapter", "max_lora_rank 32")
    config(copy("embeddings"), target_modules=["embed_tokens", "q_proj"])
    cases["embeddings"] = ("bad_adapter", "target modules")
    config(copy("dora"), use_dora=True)
    cases["dora"] = ("bad_adapter", "DoRA")
    path = copy("half-written")
    data = (path / WEIGHTS).read_bytes()
    (path / WEIGHTS).write_bytes(data[: len(data) // 3])
    cases["half-written"] = ("bad_adapter", "not a complete safetensors")
    path = copy("no-weights")
    (path / WEIGHTS).unlink()
    cases["no-weights"] = ("bad_adapter", "no adapter_model.safetensors")
    path = copy("wrong-shape")  # passes our checks; the engine itself refuses it
    tensors = {k: (torch.zeros(v.shape[0], 999) if "q_proj.lora_A" in k else v) for k, v in load_file(path / WEIGHTS).items()}
    save_file(tensors, path / WEIGHTS)
    cases["wrong-shape"] = ("bad_adapter", "could not load")
    (store / "bad" / "unpublished").mkdir(exist_ok=True)  # a directory with nothing in it yet
    cases["unpublished"] = ("bad_adapter", "no adapter_config.json")
    cases["never-existed"] = ("unknown_voice", "unknown voice")
    return cases


async def test_each_bad_adapter_is_a_clear_error_and_nothing_else_breaks(worker, adapter_store):
    cases = _bad_adapters(adapter_store, adapter_store / "tara")
    async with await WorkerClient.connect(worker.url) as client:
        ongoing = asyncio.create_task(client.say("leo", "I keep talking through all of it.",
                                                 options=ContextOptions(max_tokens=7 * 12 + 1, seed=3)))
        for name, (code, needle) in cases.items():
            try:
                await client.say(f"bad/{name}", "Hello.", options=ContextOptions(max_tokens=15))
            except WorkerRequestError as err:
                assert err.error.code == code, (name, err.error)
                assert needle in err.error.message and f"bad/{name}" in err.error.message, (name, err.error.message)
                assert not err.retryable
            else:
                raise AssertionError(f"bad adapter '{name}' was served")
        speech = await ongoing
        assert speech.done.stats.frames == 12
        fine = await client.say("tara", "Still fine.", options=ContextOptions(max_tokens=15, seed=1))
        assert fine.done.stats.frames == 2
    assert (await asyncio.to_thread(worker.health))["status"] == "ok"


async def test_a_voice_published_while_serving_is_picked_up(worker, adapter_store, tmp_path):
    source = derive_voice(adapter_store / "tara", tmp_path / "fresh", seed=5, prompt_name="tara")
    async with await WorkerClient.connect(worker.url) as client:
        try:
            await client.say("late/fresh", "Hi.", options=ContextOptions(max_tokens=15))
            raise AssertionError("served before it was published")
        except WorkerRequestError as err:
            assert err.error.code == "unknown_voice"
        publish_adapter(source, adapter_store, "late/fresh", replace=True)
        speech = await client.say("late/fresh", "Hi.", options=ContextOptions(max_tokens=15, seed=2))
        tara = await client.say("tara", "Hi.", options=ContextOptions(max_tokens=15, seed=2))
    assert speech.done.stats.frames == 2 and speech.pcm != tara.pcm  # its own weights, same prompt name


def test_prewarm_loads_voices_ahead_of_traffic(worker, adapter_store):
    if not (adapter_store / "warm/one").exists():
        publish_adapter(adapter_store / "leo", adapter_store, "warm/one")
    before = scrape(worker).get("voicering_worker_adapter_loads_total", 0)
    url = f"{worker.http}/prewarm?voice=warm/one&voice=ghost"
    began = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as resp:  # answered at once: loading runs in the background
        assert resp.status == 202
        started = json.loads(resp.read())
    assert started["state"] == "running" and set(started["voices"]) == {"warm/one", "ghost"}
    while True:
        with urllib.request.urlopen(f"{worker.http}{started['status_url']}", timeout=10) as resp:
            report = json.loads(resp.read())
        if report["state"] != "running":
            break
        assert time.monotonic() - began < 60, report
        time.sleep(0.2)
    assert report["state"] == "done"
    assert report["voices"]["warm/one"] == "ready"
    assert "unknown voice 'ghost'" in report["voices"]["ghost"]
    assert scrape(worker)["voicering_worker_adapter_loads_total"] >= before + 1
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{worker.http}/prewarm/nope", timeout=10)
    assert missing.value.code == 404
