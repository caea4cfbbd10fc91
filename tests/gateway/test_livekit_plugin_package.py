"""The plugin as LiveKit users install and import it, and livekit's own OpenAI plugin against the gateway.

1. A fresh virtual environment gets the checkout with only the `livekit` extra (`pip install
   "<checkout>[livekit]"`, a real wheel build and install, built in the background from the
   session's start: tests/fixtures/fresh_envs.py); from that environment
   `from livekit.plugins import voicering` speaks a turn against the session's real worker over a real
   websocket, and neither torch, vLLM, transformers, FastAPI nor uvicorn is installed there. PyAV and
   openai are: livekit-agents itself requires them (checked from its metadata, so the day it stops,
   this test says so). The environment's size and the import's time are printed (docs/livekit.md).
2. The zero-install path: livekit-plugins-openai's `openai.TTS(base_url=.../v1, api_key=...)`, unchanged,
   speaks through the gateway's OpenAI-compatible endpoint in this process's real livekit framework.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement


ABSENT = ("torch", "vllm", "transformers", "fastapi", "uvicorn")
ONE_TURN = r"""
import asyncio, json, logging, sys
from livekit.plugins import voicering
from livekit.agents import Plugin

async def main(url):
    tts = voicering.TTS(voice="tara", workers=[url], options=voicering.ContextOptions(seed=3, max_tokens=15))
    try:
        speech = tts.synthesize("Hello from a fresh environment.")
        pcm = b"".join([ev.frame.data.tobytes() async for ev in speech])
    finally:
        await tts.aclose()
    plugin = next(p for p in Plugin.registered_plugins if p.package == "livekit.plugins.voicering")
    print(json.dumps({"file": voicering.__file__, "bytes": len(pcm), "served_by": speech.worker_done.stats.served_by,
                      "version": voicering.__version__,
                      "plugin": [plugin.title, plugin.version], "logger": plugin._logger.name,
                      "sample_rate": tts.sample_rate}))

asyncio.run(main(sys.argv[1]))
"""
PROBE = r"""
import importlib.metadata as md, importlib.util as u, json, sys
print(json.dumps({"present": [m for m in sys.argv[1:] if u.find_spec(m)],
                  "livekit_agents_requires": md.requires("livekit-agents") or []}))
"""


@pytest.fixture(scope="module")
def plugin_env(fresh_envs) -> Path:
    return fresh_envs.python("livekit")


def _site_packages_mb(python: Path) -> float:
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return sum(p.stat().st_size for p in Path(site).rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def test_a_fresh_environment_with_only_the_livekit_extra_speaks_a_turn(plugin_env, worker):
    away = plugin_env.parents[2]  # not the checkout: its folders would shadow what the wheel installed
    probe = json.loads(subprocess.run([str(plugin_env), "-c", PROBE, *ABSENT, "av", "openai"], capture_output=True,
                                      text=True, check=True, timeout=120, cwd=away).stdout)
    assert [m for m in probe["present"] if m in ABSENT] == []
    # PyAV and openai arrive with livekit-agents itself, not with voicering's extra
    requires = {Requirement(r).name for r in probe["livekit_agents_requires"]}
    assert {"av", "openai"} <= requires and {"av", "openai"} <= set(probe["present"])

    turn = subprocess.run([str(plugin_env), "-c", ONE_TURN, worker.url], capture_output=True, text=True, timeout=300,
                          cwd=away)
    assert turn.returncode == 0, turn.stderr[-3000:]
    said = json.loads(turn.stdout.strip().splitlines()[-1])
    assert "/site-packages/" in said["file"]  # the installed wheel's, not the checkout's
    assert said["bytes"] > 0 and said["bytes"] % 2 == 0 and said["sample_rate"] == 24000
    assert said["served_by"] == "worker-a"  # the session worker spoke it, over its websocket
    assert said["plugin"] == ["livekit.plugins.voicering", said["version"]]
    assert said["logger"] == "livekit.plugins.voicering"

    imports = []
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([str(plugin_env), "-c", "from livekit.plugins import voicering"], check=True, timeout=120, cwd=away)
        imports.append(time.perf_counter() - began)
    print(f"livekit extra: {_site_packages_mb(plugin_env):.0f} MiB installed; "
          f"`from livekit.plugins import voicering` in a new interpreter: {min(imports):.2f} s (best of 3)")


async def test_livekit_s_own_openai_tts_speaks_through_the_gateway_unchanged(gateway, new_tenant):
    from livekit.agents import APIConnectOptions
    from livekit.plugins import openai

    _, key = await new_tenant()
    spoken = {}
    for model, response_format in (("gpt-4o-mini-tts", "mp3"), ("tts-1", "pcm")):  # SSE deltas; plain audio bytes
        tts = openai.TTS(base_url=f"{gateway.url}/v1", api_key=key, voice="tara", model=model,
                         response_format=response_format)
        try:
            stream = tts.synthesize("Hi.", conn_options=APIConnectOptions(max_retry=0, timeout=30))
            frames = [ev.frame async for ev in stream]
        finally:
            await tts.aclose()
        assert frames and {f.sample_rate for f in frames} == {24000} and {f.num_channels for f in frames} == {1}
        spoken[model] = sum(f.samples_per_channel for f in frames) / 24000
    assert all(seconds > 0.05 for seconds in spoken.values()), spoken


async def test_a_wrong_key_is_livekit_s_non_retryable_401_through_the_openai_plugin(gateway):
    from livekit.agents import APIConnectOptions, APIStatusError
    from livekit.plugins import openai

    tts = openai.TTS(base_url=f"{gateway.url}/v1", api_key="vr_not-a-key", voice="tara")
    try:
        with pytest.raises(APIStatusError) as refused:
            [ev async for ev in tts.synthesize("Hi.", conn_options=APIConnectOptions(max_retry=0, timeout=10))]
    finally:
        await tts.aclose()
    assert refused.value.status_code == 401
