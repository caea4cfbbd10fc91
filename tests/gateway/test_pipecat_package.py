"""`voicering[pipecat]` as Pipecat users install it, and what the service may import.

1. A fresh virtual environment gets the checkout with only the `pipecat` extra (`pip install
   "<checkout>[pipecat]"`, a real wheel build and install); from there a real Pipecat pipeline
   speaks a turn through the session's real gateway with a tenant key, and torch, vLLM,
   transformers, FastAPI and uvicorn are not installed. The environment's size and the import's
   time are printed (docs/pipecat.md).
2. The service's modules import only pipecat, websockets, loguru, the standard library and the
   worker protocol's messages (read from the source), and importing it loads no server module.
3. The `start` its settings become: options left unset stay off the wire (a gateway that predates
   an option is never sent it), token streaming asks the worker to cut segments (`chunking: "auto"`),
   and settings the gateway would refuse are refused at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipecat.utils.errors import ErrorCategory

from gateway.pipecat import VoiceringError, VoiceringTTSService
from gateway.pipecat.errors import category_of, from_status
from gateway.pipecat.settings import default_settings, start_message
from gpu_worker.protocol import parse_client
from tests.fixtures.models import REPO
from tests.gateway.test_import_rule import module_imports
from tests.fixtures.fresh_envs import FRESH_ENV
from tests.gateway.test_livekit_plugin_package import _site_packages_mb

ABSENT = ("torch", "vllm", "transformers", "fastapi", "uvicorn")
ONE_TURN = r"""
import asyncio, json, sys
from pipecat.frames.frames import EndFrame, TTSAudioRawFrame, TTSSpeakFrame, TTSStoppedFrame, TTSTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection
from pipecat.tests.utils import QueuedFrameProcessor
from pipecat.workers.runner import WorkerRunner
from gateway.pipecat import VoiceringTTSService

async def main(url, key):
    tts = VoiceringTTSService(api_key=key, url=url, settings=VoiceringTTSService.Settings(voice="tara", seed=3, max_tokens=22))
    frames = asyncio.Queue()
    worker = PipelineWorker(Pipeline([tts, QueuedFrameProcessor(queue=frames, queue_direction=FrameDirection.DOWNSTREAM)]),
                            cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    await asyncio.wait_for(started.wait(), 60)
    await worker.queue_frame(TTSSpeakFrame("Hello from a fresh environment."))
    got = []
    while not isinstance(frame := await asyncio.wait_for(frames.get(), 120), TTSStoppedFrame):
        got.append(frame)
    await worker.queue_frame(EndFrame())
    await asyncio.wait_for(run, 60)
    audio = [f for f in got if isinstance(f, TTSAudioRawFrame)]
    import gateway.pipecat as package
    print(json.dumps({"file": package.__file__, "bytes": sum(len(f.audio) for f in audio),
                      "rates": sorted({f.sample_rate for f in audio}), "words": [f.text for f in got if isinstance(f, TTSTextFrame)],
                      "sockets": tts.sockets_opened}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
PROBE = r"""
import importlib.util as u, json, sys
print(json.dumps([m for m in sys.argv[1:] if u.find_spec(m)]))
"""
ALLOWED = ("gateway.pipecat", "gpu_worker.protocol", "gpu_worker.errors", "pipecat", "websockets", "loguru")


@pytest.fixture(scope="module")
def pipecat_env(fresh_envs) -> Path:
    return fresh_envs.python("pipecat")


@pytest.mark.timeout(1500)
async def test_a_fresh_environment_with_only_the_pipecat_extra_speaks_a_turn(pipecat_env, gateway, new_tenant):
    away = pipecat_env.parents[2]  # not the checkout: its folders would shadow what the wheel installed
    present = json.loads(subprocess.run([str(pipecat_env), "-c", PROBE, *ABSENT], capture_output=True, text=True,
                                        check=True, timeout=120, cwd=away, env=FRESH_ENV).stdout)
    assert present == []
    _, key = await new_tenant()
    turn = subprocess.run([str(pipecat_env), "-c", ONE_TURN, gateway.url, key], capture_output=True, text=True,
                          timeout=300, cwd=away, env=FRESH_ENV)
    assert turn.returncode == 0, turn.stderr[-3000:]
    said = json.loads(turn.stdout.strip().splitlines()[-1])
    assert "/site-packages/" in said["file"]  # the installed wheel's, not the checkout's
    assert said["bytes"] > 0 and said["bytes"] % 2 == 0 and said["rates"] == [24000]
    assert said["words"] == ["Hello", "from", "a", "fresh", "environment"] and said["sockets"] == 1

    imports = []
    for _ in range(3):
        began = time.perf_counter()
        subprocess.run([str(pipecat_env), "-c", "from gateway.pipecat import VoiceringTTSService"], check=True,
                       timeout=120, cwd=away, env=FRESH_ENV)
        imports.append(time.perf_counter() - began)
    print(f"pipecat extra: {_site_packages_mb(pipecat_env):.0f} MiB installed; "
          f"`from gateway.pipecat import VoiceringTTSService` in a new interpreter: {min(imports):.2f} s (best of 3)")




def _beyond_rule(names: set[str]) -> set[str]:
    """Imports outside the service's rule: anything of voicering's but its own package and the
    worker protocol's messages, and any third party but pipecat, websockets and loguru."""
    stdlib = sys.stdlib_module_names | {"__future__"}
    return {n for n in names if n.split(".")[0] not in stdlib
            and not any(n == a or n.startswith(a + ".") for a in ALLOWED)}


def test_the_service_imports_only_pipecat_websockets_and_the_protocol():
    files = sorted((REPO / "gateway" / "pipecat").glob("*.py"))
    assert len(files) >= 4
    assert {f.name: _beyond_rule(module_imports(f)) for f in files} == {f.name: set() for f in files}
    assert _beyond_rule({"gateway.api.stream", "gpu_worker.client", "fastapi", "json"}) == {
        "gateway.api.stream", "gpu_worker.client", "fastapi"}  # the rule can fail


def test_importing_the_service_loads_no_server_module():
    code = ("import sys, gateway.pipecat; print(json.dumps([m for m in sys.argv[1:] if m in sys.modules]))"
            .replace("import sys", "import json, sys"))
    out = subprocess.run([sys.executable, "-c", code, *ABSENT, "gateway.api", "gpu_worker.client", "redis"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def settings(**values) -> VoiceringTTSService.Settings:
    store = default_settings()
    store.apply_update(VoiceringTTSService.Settings(voice="tara", **values))
    return store


def test_unset_options_stay_off_the_wire_and_continuity_goes_only_when_set():
    plain = json.loads(start_message("c1", "Hi.", settings()))
    assert plain["options"] == {**plain["options"], "alignment": "word"}
    assert "continuity" not in plain["options"] and "normalize" not in plain["options"]
    assert "pronunciations" not in plain and "pronunciations" not in plain["options"]
    assert parse_client(start_message("c1", "Hi.", settings())).options.alignment == "word"  # the gateway reads it

    full = json.loads(start_message("c1", "Hi.", settings(continuity=False, normalize=False, alignment=False,
                                                           pronunciations=("medical",), seed=7, temperature=0.3)))
    assert full["options"]["continuity"] is False and full["options"]["normalize"] is False
    assert "alignment" not in full["options"] and full["pronunciations"] == ["medical"]
    assert full["options"]["seed"] == 7 and full["options"]["temperature"] == 0.3
    assert parse_client(start_message("c1", "Hi.", settings(continuity=False))).options.continuity is False
    assert "chunking" not in plain["options"]  # sentence mode: the service flushes each sentence itself
    tokens = parse_client(start_message("c1", "Hi", settings(), auto_chunking=True))
    assert tokens.options.chunking == "auto"  # token mode: the worker decides when to speak


def test_settings_the_gateway_would_refuse_are_refused_at_construction():
    for bad, why in [({"temperature": 3.0}, "temperature"), ({"pronunciations": ("a b",)}, "dictionary name"),
                     ({"max_tokens": 2}, "max_tokens"), ({"voice": ""}, "voice is required")]:
        with pytest.raises(ValueError, match=why):
            VoiceringTTSService(api_key="k", url="http://127.0.0.1:9",
                                settings=VoiceringTTSService.Settings(**{"voice": "tara", **bad}))


def test_the_gateway_s_codes_keep_the_service_only_when_the_next_turn_could_speak():
    assert category_of("invalid_api_key").is_permanent and category_of("voice_not_found").is_permanent
    for passing in ("busy", "no_worker", "worker_lost", "text_too_long", "streams_limit_exceeded", "voice_not_ready",
                    "a_code_from_a_newer_gateway"):
        assert not category_of(passing).is_permanent, passing
    refused = from_status("ws://x/v1/tts/stream", 401, b'{"error": {"message": "bad key", "code": "invalid_api_key"}}')
    assert (refused.code, refused.category, refused.retryable) == ("invalid_api_key", ErrorCategory.AUTHENTICATION, False)
    assert "bad key" in str(refused) and "HTTP 401" in str(refused)
    busy = from_status("ws://x/v1/tts/stream", 503, b"<html>")
    assert busy.retryable and busy.category is ErrorCategory.SERVER and isinstance(busy, VoiceringError)


async def test_a_runtime_update_the_gateway_would_refuse_is_undone_and_reported():
    from pipecat.frames.frames import ErrorFrame

    tts = VoiceringTTSService(api_key="k", url="http://127.0.0.1:9", settings=VoiceringTTSService.Settings(voice="tara"))
    reported: list[ErrorFrame] = []

    @tts.event_handler("on_error")
    async def _reported(service, frame) -> None:
        reported.append(frame)

    assert await tts._update_settings(VoiceringTTSService.Settings(temperature=3.0, seed=4)) == {}
    assert tts._settings.temperature is None and tts._settings.seed is None  # both undone, the service unchanged
    assert "temperature" in reported[0].error and reported[0].category is ErrorCategory.APPLICATION and tts.is_usable
    assert await tts._update_settings(VoiceringTTSService.Settings(seed=4)) == {"seed": None}
