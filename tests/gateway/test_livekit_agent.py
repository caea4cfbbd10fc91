"""The voicering plugin inside livekit-agents' own `AgentSession`, run in-process with no room, and
the agent server's parts: its entrypoint under livekit's fake job context, its text-input path,
and its load function served by a real (unregistered) `AgentServer`.

Real: the framework, the session's `voicering worker` (`worker-a`, real vLLM engine, stand-in
weights) and the session's Redis ring. Stand-ins, because the real thing needs an external AI
service or a LiveKit server: `ScriptedLLM` (replays a fixed reply word by word, as an LLM streams
it; no STT or VAD is configured, the user's turn is given as text) and `RecordingSink` (the room's
audio track: records the frames and plays them out in real time, as livekit's own test sink does).
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from livekit import rtc
from prometheus_client import CollectorRegistry
from livekit.agents import Agent, AgentSession, APIConnectOptions, llm
from livekit.agents.testing import fake_job_context
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities
from livekit.agents.types import TimedString
from livekit.agents.voice.room_io import TextInputEvent
from livekit.agents.voice.transcription import TranscriptSynchronizer

from gateway.livekit import TTS
from gateway.livekit.agent import FleetLoad, VoiceAgent, build_server, fleet_load, speak_text
from gateway.livekit.metrics import AgentMetrics
from gateway.livekit.settings import AgentSettings
from gateway.livekit.transcript import TaggedSpeechAgent
from hashring.ports import free_port
from gpu_worker.protocol import MAX_BUFFER_DELAY_MS, ContextOptions
from hashring.membership import RingWatcher
from hashring.records import RingView, Snapshot, WorkerInfo
from hashring.settings import RingSettings
from hashring.store import RingStore
from tests.fixtures.models import CLUSTER_PREFIX
from tests.fixtures.probes import metric_samples
from tests.gateway.test_livekit_tts import direct_like_the_plugin

VOICE = "tara"
VOICERING = Path(sys.executable).parent / "voicering"
REPLY = "Sure, I can help you with that today. Let me think about it for a moment."


class ScriptedLLM(llm.LLM):
    """Stands in for an external LLM service: every chat streams `reply` word by word."""

    def __init__(self, reply: str, gap_s: float = 0.02) -> None:
        super().__init__()
        self.reply = reply
        self.gap_s = gap_s
        self.calls = 0

    def chat(self, *, chat_ctx, tools=None, conn_options=APIConnectOptions(), **_: object) -> llm.LLMStream:
        self.calls += 1
        return _ScriptedStream(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _ScriptedStream(llm.LLMStream):
    async def _run(self) -> None:
        words = self._llm.reply.split(" ")
        for i, word in enumerate(words):
            delta = word if i == 0 else " " + word
            self._event_ch.send_nowait(llm.ChatChunk(id="scripted", delta=llm.ChoiceDelta(role="assistant",
                                                                                           content=delta)))
            await asyncio.sleep(self._llm.gap_s)


class RecordingSink(AudioOutput):
    """Stands in for the room's audio track: records every frame, plays out in real time."""

    def __init__(self) -> None:
        super().__init__(label="RecordingSink", capabilities=AudioOutputCapabilities(pause=False))
        self.frames: list[rtc.AudioFrame] = []
        self.first_frame = asyncio.Event()
        self._pushed_s = 0.0
        self._started_at = 0.0
        self._finish: asyncio.TimerHandle | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._pushed_s:
            self._started_at = time.monotonic()
            self.on_playback_started(created_at=time.time())
        self.frames.append(frame)
        self.first_frame.set()
        self._pushed_s += frame.duration

    def flush(self) -> None:
        super().flush()
        if not self._pushed_s:
            return
        played = self._pushed_s

        def finished() -> None:
            self._pushed_s = 0.0
            self.on_playback_finished(playback_position=played, interrupted=False)

        self._finish = asyncio.get_running_loop().call_later(
            max(0.0, played - (time.monotonic() - self._started_at)), finished)

    def clear_buffer(self) -> None:
        if not self._pushed_s:
            return
        if self._finish is not None:
            self._finish.cancel()
        position = min(self._pushed_s, time.monotonic() - self._started_at)
        self._pushed_s = 0.0
        self.on_playback_finished(playback_position=position, interrupted=True)

    @property
    def pcm(self) -> bytes:
        return b"".join(f.data.tobytes() for f in self.frames)


class WholeTurnSink(RecordingSink):
    """A RecordingSink that starts playing a turn once all of its audio has arrived, then plays it out
    in real time. The stand-in worker generates slower than real time on this CPU (~0.6x), so a sink
    playing frames as they come would underrun through the whole turn and its clock would run ahead
    of the audio; a GPU worker is faster than real time and the room plays continuously."""

    def __init__(self) -> None:
        super().__init__()
        self.playing = asyncio.Event()
        self.stopped_at: float | None = None  # the playback position an interruption cut at

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await AudioOutput.capture_frame(self, frame)
        self.frames.append(frame)
        self._pushed_s += frame.duration

    def flush(self) -> None:
        AudioOutput.flush(self)
        if not self._pushed_s or self.playing.is_set():
            return
        self._started_at = time.monotonic()
        self.on_playback_started(created_at=time.time())
        self.playing.set()
        played = self._pushed_s

        def finished() -> None:
            self._pushed_s = 0.0
            self.on_playback_finished(playback_position=played, interrupted=False)

        self._finish = asyncio.get_running_loop().call_later(played, finished)

    def position(self) -> float:
        return time.monotonic() - self._started_at

    def clear_buffer(self) -> None:
        if self._pushed_s:
            self.stopped_at = min(self._pushed_s, self.position())
        super().clear_buffer()


class TimingAgent(Agent):
    """Records the TimedStrings the plugin gives the framework for the agent's transcript."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.timed: list[TimedString] = []
        self._more = asyncio.Condition()

    async def transcription_node(self, text, model_settings):
        async for piece in text:
            if isinstance(piece, TimedString):
                self.timed.append(piece)
                async with self._more:
                    self._more.notify_all()
            yield piece

    async def words(self, count: int) -> list[TimedString]:
        """The first ``count`` timed words, once the framework has passed them through this node (the
        node runs as its own task: the last words may follow the turn's last audio)."""
        async with self._more:
            await self._more.wait_for(lambda: len([t for t in self.timed if t.strip()]) >= count)
        return [t for t in self.timed if t.strip()]


def opts(seed: int, max_tokens: int = 15) -> ContextOptions:
    return ContextOptions(max_tokens=max_tokens, seed=seed, chunking="auto", max_buffer_delay_ms=MAX_BUFFER_DELAY_MS)


def without_end_marker(pcm: bytes) -> bytes:
    """Drop the framework's synthetic 10 ms end-of-segment marker (zeros), if it sent one."""
    marker = b"\0" * 480
    return pcm[:-480] if pcm.endswith(marker) else pcm


async def started_session(plugin: TTS, reply: str = REPLY, agent: type[Agent] = Agent
                          ) -> tuple[AgentSession, RecordingSink, ScriptedLLM]:
    scripted = ScriptedLLM(reply)
    session = AgentSession(llm=scripted, tts=plugin, vad=None, turn_handling={"turn_detection": "manual"})
    sink = RecordingSink()
    session.output.audio = sink
    await session.start(agent(instructions="You are a test voice."))
    return session, sink, scripted


async def test_an_agent_session_speaks_the_llm_reply_through_the_plugin(worker):
    plugin = TTS(voice=VOICE, workers=[worker.url], options=opts(seed=81))
    session, sink, scripted = await started_session(plugin)
    try:
        handle = session.generate_reply(user_input="Can you help me?")
        await asyncio.wait_for(handle.wait_for_playout(), timeout=120)
        assert not handle.interrupted and scripted.calls == 1
    finally:
        await session.aclose()
        await plugin.aclose()
    assert sink.frames and {(f.sample_rate, f.num_channels) for f in sink.frames} == {(24000, 1)}
    assert without_end_marker(sink.pcm) == await direct_like_the_plugin(worker.url, [REPLY], opts(seed=81))


async def test_the_voice_acts_its_tags_and_the_transcript_leaves_them_out(worker):
    """The TTS gets the LLM's text with its tags (the audio is that of the tagged text); the
    session's history, built from the transcription node, has none (TaggedSpeechAgent)."""
    reply = "Well <laugh> that is funny. <SIGH> Anyway."
    plugin = TTS(voice=VOICE, workers=[worker.url], options=opts(seed=83))
    session, sink, _ = await started_session(plugin, reply=reply, agent=TaggedSpeechAgent)
    try:
        handle = session.generate_reply(user_input="Tell me a joke.")
        await asyncio.wait_for(handle.wait_for_playout(), timeout=120)
    finally:
        await session.aclose()
        await plugin.aclose()
    said = [item.text_content for item in session.history.items if getattr(item, "role", None) == "assistant"]
    assert said == ["Well that is funny. Anyway."]
    assert without_end_marker(sink.pcm) == await direct_like_the_plugin(worker.url, [reply], opts(seed=83))


async def test_an_interruption_stops_the_speech_and_the_worker_drops_the_context(worker):
    plugin = TTS(voice=VOICE, workers=[worker.url], options=opts(seed=82, max_tokens=7 * 80 + 1))
    session, sink, _ = await started_session(plugin, reply="This reply is long and will be cut off by the user. "
                                                        "It keeps going for quite a while after that.")
    registry = CollectorRegistry()
    AgentMetrics(registry).attach(session, plugin)  # what the agent server's entrypoint attaches
    try:
        handle = session.generate_reply(user_input="Tell me a long story.")
        await asyncio.wait_for(sink.first_frame.wait(), timeout=120)
        await session.interrupt()
        frames_at_interrupt = len(sink.frames)
        health = await worker.wait_idle(timeout=10)  # the worker's context is gone (engine request aborted)
        await asyncio.sleep(0.5)
        assert handle.interrupted and health["active_streams"] == 0
        assert len(sink.frames) == frames_at_interrupt  # nothing of the cut turn arrives afterwards
        # the same session speaks again (a short line) on the same connection
        plugin.update_options(options=opts(seed=87))
        nxt = session.say("And now something else.")
        await asyncio.wait_for(nxt.wait_for_playout(), timeout=120)
        assert len(sink.frames) > frames_at_interrupt and plugin.transport.pool.handshakes == 1
        assert registry.get_sample_value("voicering_agent_sessions") == 1
    finally:
        await session.aclose()
        await plugin.aclose()
    value = registry.get_sample_value
    assert value("voicering_agent_turns_total", {"outcome": "interrupted"}) == 1
    assert value("voicering_agent_turns_total", {"outcome": "completed"}) == 1
    assert value("voicering_agent_tts_ttfb_seconds_count") >= 1  # per TTS request that reported (the cut one may not)
    assert value("voicering_agent_sessions") == 0  # the session's close event


async def test_an_interruption_keeps_in_the_history_the_words_played_by_the_voice_s_timings(worker):
    """livekit's AgentSession with use_tts_aligned_transcript and its TranscriptSynchronizer (what RoomIO
    puts between the session and the room): an interruption in the reply's second sentence leaves in
    the chat history the words the plugin's timings say were played by then, not the whole reply.
    Tolerance: one word ahead, three behind. The synchronizer sends a word halfway through its pacing
    delay, so the word playing at the cut may or may not be in; and it paces with sleeps on the event
    loop, which wake late on a loaded box, so its forwarded text falls behind the audio (2 words by
    the cut in a clean-clone CI run on 2 loaded cores: 17 kept against 19 timed; 18 of 19 idle). The
    history still ends inside the second sentence, far from the whole reply. The stand-in's audio is
    noise, so the timings are the worker's estimate; what is proven is that the framework cuts the
    history by the voice's timings."""
    reply = ("The first sentence is here and will be heard in full by the user. "
             "The second sentence is cut off by the user before its last words are ever played.")
    plugin = TTS(voice=VOICE, workers=[worker.url], options=opts(seed=91, max_tokens=7 * 30 + 1))
    sink = WholeTurnSink()
    sync = TranscriptSynchronizer(next_in_chain_audio=sink, next_in_chain_text=None)
    session = AgentSession(llm=ScriptedLLM(reply), tts=plugin, vad=None, turn_handling={"turn_detection": "manual"},
                           use_tts_aligned_transcript=True)
    session.output.audio, session.output.transcription = sync.audio_output, sync.text_output
    agent = TimingAgent(instructions="You are a test voice.")
    await session.start(agent)
    try:
        handle = session.generate_reply(user_input="Say two sentences.")
        await asyncio.wait_for(sink.playing.wait(), timeout=180)  # the whole turn's audio is in
        words = await asyncio.wait_for(agent.words(len(reply.split())), timeout=30)
        assert [w.strip() for w in words] == [w.strip(".") for w in reply.split()]  # every word timed, in order
        second = next(i for i, w in enumerate(words) if i and w.strip() == "The")
        # cut after the second sentence's fifth word has started: its timings say where that is
        cut = words[second + 4].start_time + 0.05
        await asyncio.sleep(max(0.0, cut - sink.position()))  # the sink's playback clock (real time)
        await session.interrupt()
        await handle
        assert handle.interrupted and sink.stopped_at is not None
        played = [w for w in words if w.start_time < sink.stopped_at]
        said = [m for m in session.history.items if getattr(m, "role", None) == "assistant"]
        assert said and said[-1].interrupted
        kept = said[-1].text_content.split()
        assert len(played) - 3 <= len(kept) <= len(played) + 1, (sink.stopped_at, kept,
                                                                  [(w, w.start_time) for w in words])
        assert second < len(kept) < len(words) - 2  # cut inside the second sentence: not the whole reply
        assert " ".join(kept).startswith(reply[:40])  # sentence 1 (heard in full) is kept as written
    finally:
        await session.aclose()
        await plugin.aclose()


async def test_participant_text_interrupts_and_is_spoken_as_sent(worker):
    """The agent server's text path (what a chat message or text stream runs), minus the room."""
    plugin = TTS(voice=VOICE, workers=[worker.url], options=opts(seed=83, max_tokens=7 * 80 + 1))
    session = AgentSession(tts=plugin, vad=None, turn_handling={"turn_detection": "manual"})
    sink = RecordingSink()
    session.output.audio = sink
    await session.start(Agent(instructions="unused: no LLM"))
    try:
        long = session.say("A long line that the next message will cut short, right in its middle.")
        await asyncio.wait_for(sink.first_frame.wait(), timeout=120)
        assert await speak_text(session, TextInputEvent(text="   ")) is None  # blank: interrupts, says nothing
        assert long.interrupted
        await worker.wait_idle(timeout=10)
        plugin.update_options(options=opts(seed=84))
        before = len(sink.frames)
        spoken = await speak_text(session, TextInputEvent(text="Hello from the game."))
        assert spoken is not None
        await asyncio.wait_for(spoken.wait_for_playout(), timeout=120)
        assert not spoken.interrupted
    finally:
        await session.aclose()
        await plugin.aclose()
    said = b"".join(f.data.tobytes() for f in sink.frames[before:])
    assert without_end_marker(said) == await direct_like_the_plugin(worker.url, ["Hello from the game."], opts(seed=84))


def agent_settings(redis_url: str, **more) -> AgentSettings:
    return AgentSettings(voice=VOICE, redis_url=redis_url, ring_prefix=CLUSTER_PREFIX, seed=85, **more)


async def test_the_entrypoint_joins_under_livekit_s_fake_job_context(worker, redis_url):
    """Everything but the LiveKit server: the room is a real, unconnected `rtc.Room`."""
    entry = VoiceAgent(agent_settings(redis_url))
    with fake_job_context(room=rtc.Room()) as ctx:
        session = await asyncio.wait_for(entry.start(ctx), timeout=60)
        voice = session.tts
        try:
            assert isinstance(voice, TTS) and voice.options.voice == VOICE and voice.options.context.seed == 85
            pool = voice.transport.pool
            deadline = time.monotonic() + 30  # prewarm dials the voice's owner in the background
            while not pool.connections("worker-a"):
                assert time.monotonic() < deadline, "prewarm never connected to the voice's owner"
                await asyncio.sleep(0.1)
            events = [ev async for ev in voice.synthesize("Hello.")]
            assert events and pool.handshakes == 1  # routed through the ring to the prewarmed connection
        finally:
            await session.aclose()
            await voice.aclose()
    options = entry.room_options()
    assert options.audio_input is False and options.text_input.text_input_cb is speak_text
    with_llm = VoiceAgent(agent_settings(redis_url, llm="openai/gpt-4.1-mini")).room_options()
    assert with_llm.text_input.text_input_cb is not speak_text  # the framework's own: text goes to the LLM


def view_of(workers: dict[str, tuple[int, int, str]]) -> RingView:
    """A ring view from records: id -> (load, capacity, 'live' | 'draining' | 'down')."""
    infos = {wid: WorkerInfo(wid, f"ws://{wid}", f"ws://{wid}", capacity=cap) for wid, (_, cap, _) in workers.items()}
    live = frozenset(w for w, (_, _, st) in workers.items() if st != "down")
    draining = frozenset(w for w, (_, _, st) in workers.items() if st == "draining")
    snap = Snapshot(epoch=1, server_time=100.0, workers=infos, heartbeats={w: 99.0 for w in workers}, live=live,
                    draining=draining, loads={w: load for w, (load, _, _) in workers.items()}, replicas={},
                    auto_replicas={})
    return RingView.from_snapshot(snap, vnodes=16)


def test_fleet_load_is_streams_over_capacity_of_the_workers_in_the_ring():
    assert fleet_load(view_of({"a": (4, 8, "live"), "b": (2, 16, "live")})) == pytest.approx(6 / 24)
    assert fleet_load(view_of({"a": (4, 8, "live"), "b": (7, 8, "draining"), "c": (8, 8, "down")})) == 0.5
    assert fleet_load(view_of({"a": (9, 8, "live")})) == 1.0  # capped
    assert fleet_load(view_of({})) == 1.0 and fleet_load(view_of({"a": (0, 8, "down")})) == 1.0  # nothing can speak


async def test_the_agent_server_reports_the_fleet_s_real_load_from_the_ring(worker, redis_url):
    settings = RingSettings(redis_url=redis_url, prefix=CLUSTER_PREFIX)
    plugin = TTS(voice=VOICE, workers=[worker.url], options=opts(seed=86, max_tokens=7 * 200 + 1))
    async with RingStore(settings) as store, RingWatcher(store) as watcher:
        load = FleetLoad(watcher)
        port = free_port()
        server = build_server(agent_settings(redis_url, http_port=port), load)
        running = asyncio.create_task(server.run(devmode=True, unregistered=True))
        streams = []
        try:
            async def reported() -> float:
                def get() -> float:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/worker", timeout=2) as resp:
                        return json.loads(resp.read()).get("worker_load", 0.0)  # proto JSON omits a zero
                for _ in range(100):
                    try:
                        return await asyncio.to_thread(get)
                    except OSError:
                        await asyncio.sleep(0.1)
                raise AssertionError("the agent server's /worker never answered")

            async def until(predicate, what: str) -> float:
                deadline = time.monotonic() + 30
                while not predicate(value := await reported()):
                    assert time.monotonic() < deadline, f"{what}: the server reported {value}"
                    await asyncio.sleep(0.2)
                return value

            await worker.wait_idle(timeout=10)
            await until(lambda v: v == 0.0 == fleet_load(watcher.view), "idle fleet")  # heartbeats lag ~1-3 s
            for text in ("One long line to keep a slot busy. ", "Another long line for a second slot. "):
                stream = plugin.stream()
                stream.push_text(text)
                streams.append(stream)
            for stream in streams:
                await asyncio.wait_for(anext(aiter(stream)), timeout=120)
            view = watcher.view
            capacity = sum(st.info.capacity for wid, st in view.workers.items() if wid in view.ring)
            busy = await until(lambda v: v == pytest.approx(2 / capacity), "load with two streams open")
            assert load() == pytest.approx(busy) and 0 < busy < 1
            for stream in streams:
                await stream.aclose()
            await until(lambda v: v == 0.0, "load after the streams closed")
        finally:
            for stream in streams:
                await stream.aclose()
            await plugin.aclose()
            await server.aclose()
            await running
        await worker.wait_idle(timeout=10)


_JOB_PROCESS = """
import sys
from gateway.livekit.metrics import AgentMetrics
m = AgentMetrics()  # as in a room's job process: no registry, values in PROMETHEUS_MULTIPROC_DIR
m.sessions.inc()  # a room still open in that process
m.turns.labels("completed").inc(3)
m.turns.labels("interrupted").inc()
m.ttfb.observe(0.2)
"""


async def test_the_agent_server_serves_the_job_processes_metrics(redis_url, tmp_path):
    """The agent server's /metrics collects what job processes wrote: a real second process writes
    them as a room's job process would (a LiveKit server would dispatch that job; none runs here)."""
    port, metrics_port, folder = free_port(), free_port(), tmp_path / "metrics"
    server = build_server(agent_settings(redis_url, http_port=port, metrics_port=metrics_port), lambda: 0.0,
                          metrics_dir=folder)
    running = asyncio.create_task(server.run(devmode=True, unregistered=True))
    try:
        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
                return resp.read().decode()

        for _ in range(100):
            try:
                await asyncio.to_thread(scrape)
                break
            except OSError:
                await asyncio.sleep(0.1)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", _JOB_PROCESS], env=env,
                                       capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        page = metric_samples(await asyncio.to_thread(scrape))
        assert page[("voicering_agent_turns_total", (("outcome", "completed"),))] == 3
        assert page[("voicering_agent_turns_total", (("outcome", "interrupted"),))] == 1
        assert page[("voicering_agent_tts_ttfb_seconds_count", ())] == 1
        assert page[("voicering_agent_sessions", ())] == 1
    finally:
        await server.aclose()
        await running
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # livekit set it in this process for its job processes


async def test_voicering_agent_reads_the_ring_then_says_what_livekit_setting_is_missing(redis_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIVEKIT_", "VOICERING_AGENT_"))}
    env |= {"VOICERING_AGENT_VOICE": VOICE, "VOICERING_REDIS_URL": redis_url, "VOICERING_AGENT_RING_PREFIX": CLUSTER_PREFIX}
    proc = await asyncio.create_subprocess_exec(str(VOICERING), "agent", env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out = (await asyncio.wait_for(proc.communicate(), 120))[0].decode()
    assert proc.returncode == 1 and "LIVEKIT_URL" in out, out
    env["VOICERING_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: refused before LiveKit
    proc = await asyncio.create_subprocess_exec(str(VOICERING), "agent", env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out = (await asyncio.wait_for(proc.communicate(), 120))[0].decode()
    assert proc.returncode == 1 and "unreachable" in out, out


def test_agent_settings_read_livekit_s_own_names_and_refuse_a_bad_voice(monkeypatch):
    monkeypatch.setenv("LIVEKIT_URL", "wss://example.livekit.cloud")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "s3cret-s3cret")
    monkeypatch.setenv("VOICERING_AGENT_VOICE", "leo")
    settings = AgentSettings()
    assert settings.livekit_url == "wss://example.livekit.cloud" and settings.voice == "leo"
    assert "s3cret" not in repr(settings)  # secrets never printed
    with pytest.raises(ValueError):
        AgentSettings(voice="")
    with pytest.raises(ValueError, match="llm"):
        AgentSettings(stt="deepgram/nova-3")
    with pytest.raises(ValueError):
        TTS(voice="", workers=["ws://127.0.0.1:1"])
    entry = pickle.loads(pickle.dumps(VoiceAgent(settings)))  # livekit ships the entrypoint to job processes
    assert entry == VoiceAgent(settings) and entry.settings.livekit_api_secret.get_secret_value() == "s3cret-s3cret"
