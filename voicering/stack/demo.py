"""`make demo`: one day of the platform, end to end, every piece a real process on this machine.

1. `voicering up` in the background (embedded Redis, two workers, gateway, trainer) and its tenant;
2. a creator clones a voice: espeak-ng speech uploaded through `POST /v1/voices` without transcripts
   (the trainer's ASR, the bundled Whisper tiny.en, writes them), progress shown;
3. an app speaks the clone with the official `openai` client, once through the platform gateway
   (it routes to the voice's owner) and once through a gateway pinned to the other worker, which
   proxies to the owner (`served_by` and `proxied` come back in the SSE `speech.audio.done`);
4. the LiveKit plugin speaks a line in-process (through the gateway's websocket, with the key);
5. an operator scales the voice to 2 replicas (`voicering ring scale`): both workers speak it;
6. everything stops; a report lists TTFB, real-time factor and the serving worker of every line.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from gpu_worker.process import keep_niceness
from voicering.stack.children import Child, ChildSpec
from voicering.stack.folder import StackFolder, UpState
from voicering.stack.settings import UpSettings

__all__ = ["run_demo"]

VOICE = "creator"
CONSENT = "I, the speaker in these recordings, agree that this account may train and serve a clone of my voice."
LINES = {"owner": "Hello! I am a brand new cloned voice, served by the worker that owns me.",
         "proxied": "This line reached the other worker first, which relayed it to my owner.",
         "livekit": "And this one was spoken by the LiveKit plugin, the way an agent in a room speaks.",
         "replica-a": "Now I live on two workers.", "replica-b": "So either of them can speak for me."}
REAL_WEIGHTS_HINT = (
    "Stand-in weights are random: every WAV here is noise, not speech. With real weights, on a GPU machine:\n"
    "  voicering demo --model canopylabs/orpheus-3b-0.1-ft --codec hubertsiuzdak/snac_24khz\n"
    "  (or `voicering up --model ...` and your own app against its API; docs/operations.md for a fleet)")
SAMPLE_RATE = 24000
# Stand-in weights never say "end of speech" on their own: each line is capped at ~2.5 s of audio
# (30 frames of 7 tokens) so the day fits in minutes on a CPU. Real weights end where the text does.
STAND_IN_MAX_TOKENS = 210


class DemoFailed(RuntimeError):
    pass


@dataclass(slots=True)
class Line:
    what: str
    path: str
    wav: Path
    ttfb_ms: float
    audio_s: float
    wall_s: float
    served_by: str = "-"
    proxied: bool | None = None

    @property
    def rtf(self) -> float:
        return self.wall_s / self.audio_s if self.audio_s else float("inf")


_CLOCK = time.perf_counter()


def step(n: int, text: str) -> None:
    print(f"[{n}/6 +{time.perf_counter() - _CLOCK:3.0f} s] {text}", flush=True)


def note(text: str) -> None:
    print(f"      {text}", flush=True)


def run_demo(settings: UpSettings, out_dir: Path) -> int:
    global _CLOCK
    began = _CLOCK = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = StackFolder(settings.folder)
    try:
        folder.acquire()  # refuse to wipe a folder another `up` runs in
    except Exception as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 2
    folder.release()
    shutil.rmtree(settings.folder, ignore_errors=True)
    up = _start_up(settings, out_dir / "demo-up.log")
    pinned: Child | None = None
    try:
        step(1, f"voicering up in the background: embedded Redis, {settings.workers} workers, gateway, trainer "
                f"(its output: {out_dir / 'demo-up.log'}, logs: {settings.logs}/)")
        state = _wait_ready(up, folder, out_dir / "demo-up.log", settings.start_timeout_s + 120)
        key = json.loads(Path(state.key_file).read_text())
        note(f"ready after {time.perf_counter() - began:.0f} s; tenant '{key['tenant']}' ({key['tenant_id']})")
        lines, pinned = asyncio.run(_day(settings, state, key, out_dir))
    except DemoFailed as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted", file=sys.stderr)
        return 130
    finally:
        if pinned is not None:
            asyncio.run(pinned.stop())
        code = _stop_up(up)
        step(6, f"everything stopped (voicering up exited with {code})")
    _report(lines, out_dir, state.stand_in, time.perf_counter() - began)
    return 0


def _start_up(settings: UpSettings, log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "voicering", "up", "--folder", str(settings.folder), "--workers",
            str(settings.workers), "--gateway-port", str(settings.gateway_port), "--worker-port",
            str(settings.worker_port)]
    if settings.model:
        args += ["--model", settings.model, "--codec", settings.codec]
    with open(log, "w") as out:
        up = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    keep_niceness(up.pid)
    return up


def _wait_ready(up: subprocess.Popen, folder: StackFolder, log: Path, timeout_s: float) -> UpState:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = UpState.read(folder.state_file)
        if state is not None and state.state == "ready" and state.pid == up.pid:
            return state
        if up.poll() is not None:
            raise DemoFailed(f"voicering up exited with {up.returncode}:\n{_tail(log)}")
        time.sleep(0.5)
    raise DemoFailed(f"voicering up was not ready after {timeout_s:.0f} s:\n{_tail(log)}")


def _stop_up(up: subprocess.Popen) -> int:
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(180)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    return up.returncode


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


async def _day(settings: UpSettings, state: UpState, key: dict, out_dir: Path) -> tuple[list[Line], Child]:
    import openai

    api_key, voice_id = key["api_key"], f"{key['tenant_id']}/{VOICE}"
    step(2, "a creator clones a voice: espeak-ng speech uploaded through POST /v1/voices, no transcripts typed")
    await _clone(state.gateway_url, api_key, out_dir / "demo-creator")
    owner, other, epoch = await _owners(state, voice_id)
    note(f"the ring places '{voice_id}' on {owner}; the other worker is {other}")
    pinned = await _pinned_gateway(settings, state, other)
    step(3, "an app speaks it with the openai client: through the platform gateway, then through the other worker")
    cap = STAND_IN_MAX_TOKENS if state.stand_in else None
    platform = openai.AsyncOpenAI(base_url=f"{state.gateway_url}/v1", api_key=api_key, max_retries=0)
    via_other = openai.AsyncOpenAI(base_url=f"{pinned.spec.health_url.rsplit('/', 1)[0]}/v1", api_key=api_key,
                                   max_retries=0)
    await _settled(state, epoch)
    lines = [await speak_line(platform, "owner", "gateway -> ring owner", out_dir, cap),
             await speak_line(via_other, "proxied", f"gateway pinned to {other}", out_dir, cap)]
    for line in lines:
        note(f"{line.what}: served by {line.served_by}{' (proxied)' if line.proxied else ''}, "
             f"TTFB {line.ttfb_ms:.0f} ms")
    step(4, "the LiveKit plugin (livekit-agents TTS) speaks a line in-process through the gateway")
    lines.append(await _livekit_line(state.gateway_url, api_key, out_dir, cap))
    note(f"TTFB {lines[-1].ttfb_ms:.0f} ms, {lines[-1].audio_s:.2f} s of audio")
    step(5, f"an operator scales '{voice_id}' to 2 replicas: voicering ring scale {voice_id} --replicas 2")
    scaled = subprocess.run([sys.executable, "-m", "voicering", "ring", "scale", voice_id, "--replicas", "2",
                             "--redis", state.redis_url], capture_output=True, text=True, timeout=60)
    if scaled.returncode != 0:
        raise DemoFailed(f"ring scale failed: {scaled.stderr or scaled.stdout}")
    note(scaled.stdout.strip())
    await _settled(state, await _wait_owners(state, voice_id, 2))
    lines += [await speak_line(platform, "replica-a", "gateway -> ring owner", out_dir, cap),
              await speak_line(via_other, "replica-b", f"gateway pinned to {other}", out_dir, cap)]
    for line in lines[-2:]:
        note(f"{line.what}: served by {line.served_by}{' (proxied)' if line.proxied else ' (its own replica)'}")
    # the pinned gateway's worker is an owner now: it serves the voice itself; the platform gateway's pool
    # picks either owner (two random choices), and whichever it picks serves it without a hop
    platform_line, pinned_line = lines[-2], lines[-1]
    if (pinned_line.served_by != other or pinned_line.proxied or platform_line.proxied
            or platform_line.served_by not in (owner, other)):
        raise DemoFailed(f"after scaling, expected {other} to serve the voice itself and the platform gateway's "
                         f"line to be served by an owner without a hop: "
                         f"{[(x.served_by, x.proxied) for x in lines[-2:]]}")
    await platform.close()
    await via_other.close()
    return lines, pinned


async def _clone(gateway_url: str, api_key: str, folder: Path) -> None:
    from lora_training.espeak import HARVARD_SENTENCES, synthesize

    folder.mkdir(parents=True, exist_ok=True)
    clips = [synthesize(text, "en-us", folder / f"take-{i:02d}.wav") for i, text in enumerate(HARVARD_SENTENCES)]
    seconds = sum(p.stat().st_size - 44 for p in clips) / (2 * SAMPLE_RATE)
    files = [("files", (p.name, p.read_bytes(), "audio/wav")) for p in clips]  # no transcripts: the trainer's ASR
    note(f"{len(clips)} takes, {seconds:.0f} s of speech, no transcripts: the trainer's ASR writes them")
    async with httpx.AsyncClient(base_url=gateway_url, headers={"Authorization": f"Bearer {api_key}"},
                                 timeout=120) as api:
        fields = await _consent(api, folder, files)
        created = await api.post("/v1/voices", data={"name": VOICE, **fields}, files=files)
        if created.status_code != 202:
            raise DemoFailed(f"POST /v1/voices answered {created.status_code}: {created.text}")
        note(f"POST /v1/voices -> 202, job {created.json()['job_id']}")
        shown, deadline = None, time.monotonic() + 600
        while time.monotonic() < deadline:
            view = (await api.get(f"/v1/voices/{VOICE}")).json()
            now = (view.get("state"), 20 * int((view.get("progress") or 0) // 20))
            if now != shown:
                shown = now
                note(f"  {now[0]:13s} {now[1]:3d}%  {view.get('message') or ''}".rstrip())
            if view.get("state") == "ready":
                return
            if view.get("state") == "failed":
                raise DemoFailed(f"the clone failed: {view.get('reason')}")
            await asyncio.sleep(1.0)
    raise DemoFailed("the clone was not ready after 10 minutes")


async def _consent(api: httpx.AsyncClient, folder: Path, files: list) -> dict:
    """The upload's consent: a tenant of the spoken policy (the default) reads a one-time phrase, here
    espeak-ng in the takes' voice, sent as consent_audio; a tenant of the statement policy (one made
    before policies existed) sends the typed text."""
    from lora_training.espeak import LIST_WORD_GAP_MS, synthesize

    asked = await api.post("/v1/voices/consent", json={"name": VOICE})
    if asked.status_code == 400 and asked.json().get("error", {}).get("code") == "consent_policy":
        note("consent: the tenant's policy is a typed statement")
        return {"consent": CONSENT}
    if asked.status_code != 200:
        raise DemoFailed(f"POST /v1/voices/consent answered {asked.status_code}: {asked.text}")
    phrase = asked.json()
    recording = synthesize(phrase["text_to_read"], "en-us", folder / "consent.wav", word_gap_ms=LIST_WORD_GAP_MS)
    files.append(("consent_audio", (recording.name, recording.read_bytes(), "audio/wav")))
    note(f"consent: phrase {phrase['phrase']!r} read aloud, uploaded as consent_audio")
    return {"consent_id": phrase["consent_id"]}


async def _placement(state: UpState, voice_id: str):
    """The voice's placement and the ring epoch it was read at."""
    from hashring.membership import RingWatcher
    from hashring.placement import place
    from hashring.settings import RingSettings
    from hashring.store import RingStore

    settings = RingSettings.from_env(redis_url=state.redis_url)
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        return place(watcher.view, voice_id, settings), watcher.view.epoch


async def _owners(state: UpState, voice_id: str) -> tuple[str, str, int]:
    """The voice's owner, a worker that does not own it, and the ring's epoch."""
    placement, epoch = await _placement(state, voice_id)
    others = [w for w in state.worker_ids if w not in placement.owners]
    if not placement.owners or not others:
        raise DemoFailed(f"expected one owner of {voice_id} among {state.worker_ids}, the ring says {placement.owners}")
    return placement.owners[0], others[0], epoch


async def _wait_owners(state: UpState, voice_id: str, count: int, timeout_s: float = 60.0) -> int:
    """Until the ring places the voice on ``count`` workers; the epoch that does."""
    deadline = time.monotonic() + timeout_s
    while True:
        placement, epoch = await _placement(state, voice_id)
        if len(placement.owners) >= count:
            return epoch
        if time.monotonic() > deadline:
            raise DemoFailed(f"{voice_id} never had {count} owners")
        await asyncio.sleep(0.5)


async def _settled(state: UpState, epoch: int, timeout_s: float = 30.0) -> None:
    """Until every worker and the platform gateway route by one ring view, at ``epoch`` or later,
    with every load at 0, and every worker is idle. Routing bounds each worker's load by
    heartbeats that lag up to a second: right after training's validation sample or a prewarm, a
    start could still spill off its owner, and the lines below say which path they show."""
    deadline = time.monotonic() + timeout_s
    urls = [f"{url.replace('ws://', 'http://')}/health" for url in state.worker_urls]
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            workers = [(await http.get(url)).json() for url in urls]
            gateway = (await http.get(f"{state.gateway_url}/health")).json()
            views = [*workers, gateway]
            epochs = {v.get("ring_epoch") for v in views}
            if (all(v["active_streams"] == 0 and v["relayed_streams"] == 0 for v in workers)
                    and all(v.get("ring_load") == 0 for v in views)
                    and len(epochs) == 1 and None not in epochs and min(epochs) >= epoch):
                return
            await asyncio.sleep(0.3)
    raise DemoFailed(f"the workers and the gateway did not settle on ring epoch {epoch} within {timeout_s:.0f} s")


async def _pinned_gateway(settings: UpSettings, state: UpState, worker_id: str) -> Child:
    """A second gateway with fixed routing to `worker_id` (no ring): what an app reaches when its
    gateway sits beside one worker. Same Redis, so the same tenant and key."""
    from hashring.ports import free_port

    port = free_port()
    url = state.worker_urls[state.worker_ids.index(worker_id)]
    spec = ChildSpec("gateway-pinned", ("gateway", "--host", settings.host, "--port", str(port), "--redis",
                                        state.redis_url, "--worker", url, "--voices-dir", str(settings.voices_dir),
                                        "--uploads-dir", str(settings.uploads_dir), "--metrics-port", "0"),
                     health_url=f"http://{settings.host}:{port}/health", start_timeout_s=60, stop_timeout_s=10)
    child = Child(spec, settings.logs)
    child.start()
    await child.wait_ready(asyncio.Event())
    return child


async def speak_line(client, what: str, path: str, out_dir: Path, max_tokens: int | None) -> Line:
    """One line through the openai client (SSE). A line cut mid-speech (an `error` event where
    `speech.audio.done` was due: a worker stalled past the fleet's clocks, on a starved machine) is
    said again once, as a client should, and the retry is reported; cut twice, the demo fails."""
    from gpu_worker.wav import write_wav

    for attempt in (1, 2):
        began = time.perf_counter()
        pcm, first, done, cut = bytearray(), None, {}, None
        async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice=VOICE, input=LINES[what], response_format="pcm",
                extra_body={"stream_format": "sse", "seed": 7, **({"max_tokens": max_tokens} if max_tokens else {})}
        ) as response:
            async for raw in response.iter_lines():
                if not raw.startswith("data: "):
                    continue
                event = json.loads(raw[len("data: "):])
                if event["type"] == "speech.audio.delta":
                    first = first or time.perf_counter()
                    pcm += base64.b64decode(event["audio"])
                elif event["type"] == "speech.audio.done":
                    done = event
                elif event["type"] == "error":
                    cut = event.get("error", {})
        if cut is None:
            break
        why = f"{cut.get('code')}: {cut.get('message')}"
        if attempt == 2:
            raise DemoFailed(f"the {what!r} line was cut mid-speech twice: {why}")
        note(f"{what}: cut mid-speech after {len(pcm) / (2 * SAMPLE_RATE):.1f} s of audio ({why}); said again")
    wall = time.perf_counter() - began
    wav = out_dir / f"demo-{what}.wav"
    write_wav(wav, bytes(pcm))
    return Line(what, path, wav, ((first or began) - began) * 1000, len(pcm) / (2 * SAMPLE_RATE), wall,
                done.get("served_by", "?"), done.get("proxied"))


async def _livekit_line(gateway_url: str, api_key: str, out_dir: Path, max_tokens: int | None) -> Line:
    from livekit.plugins import voicering

    from gpu_worker.wav import write_wav

    plugin = voicering.TTS(voice=VOICE, transport=voicering.GatewayTransport(gateway_url, api_key),
                           options=voicering.ContextOptions(seed=7, max_tokens=max_tokens))
    began, first, pcm = time.perf_counter(), None, bytearray()
    try:
        speech = plugin.synthesize(LINES["livekit"])
        async for event in speech:
            first = first or time.perf_counter()
            pcm += bytes(event.frame.data)
    finally:
        await plugin.aclose()
    stats = speech.worker_done.stats if speech.worker_done else None
    wall = time.perf_counter() - began
    wav = out_dir / "demo-livekit.wav"
    write_wav(wav, bytes(pcm))
    return Line("livekit", "LiveKit plugin -> gateway websocket", wav, ((first or began) - began) * 1000,
                len(pcm) / (2 * SAMPLE_RATE), wall, stats.served_by if stats and stats.served_by else "?",
                bool(stats and stats.proxied))


def _report(lines: list[Line], out_dir: Path, stand_in: bool, seconds: float) -> None:
    rows = [f"{'line':10s} {'path':36s} {'served by':22s} {'TTFB ms':>8s} {'RTF':>6s} {'audio s':>8s}  wav"]
    for x in lines:
        served = x.served_by + (" (proxied)" if x.proxied else "")
        rows.append(f"{x.what:10s} {x.path:36s} {served:22s} {x.ttfb_ms:8.0f} {x.rtf:6.2f} {x.audio_s:8.2f}  {x.wav}")
    text = "\n".join(["", "demo report", *rows, "", f"the whole day took {seconds:.0f} s",
                      *( [REAL_WEIGHTS_HINT] if stand_in else [])])
    print(text, flush=True)
    (out_dir / "demo-report.json").write_text(json.dumps(
        {"seconds": round(seconds, 1), "stand_in": stand_in,
         "lines": [{"line": x.what, "path": x.path, "served_by": x.served_by, "proxied": x.proxied,
                    "ttfb_ms": round(x.ttfb_ms, 1), "rtf": round(x.rtf, 3), "audio_s": round(x.audio_s, 3),
                    "wav": str(x.wav)} for x in lines]}, indent=2))
