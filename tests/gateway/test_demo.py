"""`voicering demo` (what `make demo` runs) end to end, as a real process: `voicering up` with two
workers, the gateway and a trainer; a clone from uploaded espeak-ng speech; the openai client
through the owner and through the other worker (proxied); the LiveKit plugin; two replicas; stop.
About 80 s on two cores, two workers beside the session worker: the fleet starts it ahead, in the
CPU the modules before it leave idle, and this test judges its run (tests/fixtures/fleet.py)."""

from __future__ import annotations

import json
import sys
import wave

import pytest

from lora_training.asr import BUNDLED_SHA256
from tests.fixtures.fleet import Command, Done
from tests.fixtures.models import STAND_IN_CACHE
from tests.gateway.test_up import processes_of

# `voicering demo` as `make demo` runs it, on free ports; its `voicering up` runs two workers
DEMO = Command("demo", (sys.executable, "-m", "voicering", "demo", "--out", "{out}/out", "--folder", "{out}/demo",
                        "--gateway-port", "{ports:2}", "--worker-port", "{ports:2}"),
               timeout_s=900, env={"VOICERING_UP_STAND_IN_CACHE": str(STAND_IN_CACHE)}, workers=2)


@pytest.mark.ahead(DEMO)
def test_the_demo_runs_the_platform_s_day_and_reports_every_line(fleet, request):
    fleet.result(request, DEMO, reports_every_line)


def reports_every_line(done: Done) -> None:
    out, folder = done.out / "out", done.out / "demo"
    up_log = out / "demo-up.log"
    assert done.returncode == 0, (f"{done.stdout[-4000:]}\n{done.stderr[-3000:]}\n"
                                  f"{up_log.read_text()[-3000:] if up_log.exists() else ''}")
    report = json.loads((out / "demo-report.json").read_text())
    lines = {x["line"]: x for x in report["lines"]}
    assert list(lines) == ["owner", "proxied", "livekit", "replica-a", "replica-b"]
    owner = lines["owner"]["served_by"]
    assert owner in ("up-worker-0", "up-worker-1") and lines["owner"]["proxied"] is False
    assert lines["proxied"]["served_by"] == owner and lines["proxied"]["proxied"] is True
    # the plugin's line (from livekit.plugins import voicering) names the worker that spoke it
    assert lines["livekit"]["served_by"] == owner and lines["livekit"]["proxied"] is False
    # two owners now: the platform gateway's pool picks either (two random choices), and the pinned
    # gateway's worker, the new owner, serves the voice itself; neither line takes a hop
    other = ({"up-worker-0", "up-worker-1"} - {owner}).pop()
    assert lines["replica-a"]["served_by"] in (owner, other) and lines["replica-a"]["proxied"] is False
    assert lines["replica-b"]["served_by"] == other and lines["replica-b"]["proxied"] is False
    for line in report["lines"]:
        with wave.open(line["wav"]) as wav:
            assert wav.getframerate() == 24000 and wav.getnframes() / 24000 == line["audio_s"] > 2.0
        assert 0 < line["ttfb_ms"] < 30_000 and line["rtf"] > 0
    assert report["stand_in"] and "noise, not speech" in done.stdout and "demo report" in done.stdout
    assert "ready         100%" in done.stdout and "POST /v1/voices -> 202" in done.stdout
    assert "no transcripts: the trainer's ASR writes them" in done.stdout
    published = [json.loads(p.read_text()) for p in (folder / "voices").glob("*/creator/voicering.json")]
    assert len(published) == 1 and len(published[0]["asr"]["transcribed_files"]) == 32  # trained on ASR text
    assert published[0]["asr"]["asr_model"]["sha256"] == BUNDLED_SHA256
    # the clone's job is final: its trainer left no checkpoints, caches or staging folders behind
    leftovers = [folder / "training" / "jobs", folder / "training" / "cache", folder / "voices" / "voicering-staging",
                 folder / "voices" / ".staging"]
    assert not [str(p) for p in leftovers if p.exists()]
    assert "voicering up exited with 0" in done.stdout
    assert not processes_of(folder)  # every process of the stack is gone
