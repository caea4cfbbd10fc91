"""The agent server (`voicering agent`): joins LiveKit rooms on dispatch and speaks with one voice.

Out of the box it needs no external AI service: it speaks the text that room participants send
on LiveKit's chat topic (`lk.chat` text streams: `room.localParticipant.sendText(...)` in the
client SDKs), interrupting whatever it was saying, which is how a game or an app drives an NPC
line. With `llm` (and `stt`) set, the same entry runs a full voice agent: participants' text and
speech go to the LLM and its replies are spoken through the voicering plugin (docs/livekit.md).

    AgentServer (main process)          load_fnc = FleetLoad(RingWatcher): fleet streams / capacity
      └─ job process per room           VoiceAgent(settings)(ctx): TTS over the ring -> AgentSession

`load_fnc` reports the GPU fleet's load as the ring sees it (the sum of the streams every live
worker reported in its heartbeat over the sum of their capacities), so at `load_threshold`
LiveKit stops dispatching rooms to this server while the GPUs are full (LiveKit Cloud's hosted
agents ignore custom load functions). Each job process holds one plugin, hence one pooled
connection per worker, for the life of its room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from livekit.agents import NOT_GIVEN, Agent, AgentServer, AgentSession, JobContext
from livekit.agents.voice import SpeechHandle
from livekit.agents.voice.room_io import RoomOptions, TextInputEvent, TextInputOptions

from gateway.livekit.metrics import AgentMetrics
from gateway.livekit.settings import AgentSettings
from gateway.livekit.transcript import TaggedSpeechAgent
from gateway.livekit.tts import TTS
from gpu_worker.open_cluster import require_cluster_token
from gpu_worker.open_files import raise_open_file_limit
from gpu_worker.protocol import ContextOptions
from hashring.errors import RingUnavailable
from hashring.membership import RingWatcher
from hashring.presence import Announcer, default_id
from hashring.records import RingView
from hashring.store import RingStore

__all__ = ["FleetLoad", "VoiceAgent", "build_server", "fleet_load", "serve", "speak_text"]

log = logging.getLogger(__name__)


def fleet_load(view: RingView) -> float:
    """Streams over capacity of the workers in the ring, in [0, 1]; 1 with no worker (nothing can speak)."""
    members = [state for wid, state in view.workers.items() if wid in view.ring]
    capacity = sum(state.info.capacity for state in members)
    if capacity == 0:
        return 1.0
    return min(1.0, sum(state.load for state in members) / capacity)


class FleetLoad:
    """`AgentServer.load_fnc`: the fleet's load from a running `RingWatcher` (a stale view is
    used as it is; no view at all counts as full). Called from livekit's executor thread: it only
    reads the watcher's current, immutable view."""

    def __init__(self, watcher: RingWatcher) -> None:
        self._watcher = watcher

    def __call__(self) -> float:
        try:
            view = self._watcher.view
        except RingUnavailable:
            return 1.0
        return fleet_load(view)


async def speak_text(session: AgentSession, event: TextInputEvent) -> SpeechHandle | None:
    """A participant's text (chat / text stream): stop what is being said, speak the text as sent."""
    await session.interrupt()
    if not event.text.strip():
        return None
    return session.say(event.text)


@dataclass(frozen=True)
class VoiceAgent:
    """The rtc_session entrypoint (picklable: LiveKit ships it to each job process)."""

    settings: AgentSettings

    async def __call__(self, ctx: JobContext) -> None:
        await self.start(ctx)

    async def start(self, ctx: JobContext) -> AgentSession:
        """Join the job's room and start speaking; the plugin closes when the job shuts down."""
        voice = self.tts()
        ctx.add_shutdown_callback(voice.aclose)
        voice.prewarm()
        session = self.session(voice)
        AgentMetrics().attach(session, voice)  # this job process's files, served by the main process
        await session.start(agent=self.agent(), room=ctx.room, room_options=self.room_options())
        log.info("voicering agent joined room %s with voice %r", ctx.room.name, self.settings.voice)
        return session

    def tts(self) -> TTS:
        s = self.settings
        return TTS(voice=s.voice, ring=s.redis_url, ring_settings=s.ring_settings(),
                   cluster_token=s.cluster_token.get_secret_value() if s.cluster_token else None,
                   options=ContextOptions(seed=s.seed), min_sentence_chars=s.min_sentence_chars)

    def session(self, voice: TTS) -> AgentSession:
        s = self.settings
        # the voice's word timings drive the captions and what an interruption keeps in the history
        aligned = voice.capabilities.aligned_transcript
        if s.stt:
            return AgentSession(tts=voice, llm=s.llm or NOT_GIVEN, stt=s.stt, use_tts_aligned_transcript=aligned)
        # nothing listens to speech: no VAD model to load, turns arrive as text
        return AgentSession(tts=voice, llm=s.llm or NOT_GIVEN, vad=None, turn_handling={"turn_detection": "manual"},
                            use_tts_aligned_transcript=aligned)

    def agent(self) -> Agent:
        return TaggedSpeechAgent(instructions=self.settings.instructions)  # captions without the voice's tags

    def room_options(self) -> RoomOptions:
        s = self.settings
        text = TextInputOptions() if s.llm else TextInputOptions(text_input_cb=speak_text)
        return RoomOptions(text_input=text, audio_input=bool(s.stt))


def build_server(settings: AgentSettings, load: Callable[[], float], *, metrics_dir: Path | None = None) -> AgentServer:
    """The agent server; with `metrics_port` set it serves /metrics there, collected from the job
    processes' multiprocess files in ``metrics_dir`` (else `settings.metrics_dir`), which it empties
    at start."""
    secret = settings.livekit_api_secret.get_secret_value() if settings.livekit_api_secret else None
    port = {} if settings.http_port is None else {"port": settings.http_port}
    if settings.metrics_port is not None:
        folder = metrics_dir or settings.metrics_dir
        if folder is None:
            raise ValueError("metrics_port needs a metrics folder (settings.metrics_dir or metrics_dir)")
        port |= {"prometheus_port": settings.metrics_port, "prometheus_multiproc_dir": str(folder)}
    server = AgentServer(ws_url=settings.livekit_url, api_key=settings.livekit_api_key, api_secret=secret,
                         host=settings.http_host, load_fnc=load, load_threshold=settings.load_threshold, **port)
    server.rtc_session(VoiceAgent(settings), agent_name=settings.agent_name)
    return server


async def serve(settings: AgentSettings, *, devmode: bool = False) -> None:
    """Run the agent server until SIGINT/SIGTERM, then drain its jobs. Needs Redis at start-up
    (the ring is read once before registering with LiveKit); afterwards a Redis outage only makes
    the load figure stale. Raises `OpenCluster` first when `http_host` is beyond loopback and the
    cluster token is empty or short, unless `allow_open_cluster`."""
    token = settings.cluster_token.get_secret_value() if settings.cluster_token else None
    require_cluster_token(settings.http_host, token, allow_open=settings.allow_open_cluster,
                          env_prefix=AgentSettings.model_config["env_prefix"], role="agent server")
    raise_open_file_limit()  # rooms, job processes and worker links each hold descriptors
    ring = settings.ring_settings()
    with contextlib.ExitStack() as folders:
        metrics_dir = settings.metrics_dir
        if settings.metrics_port is not None and metrics_dir is None:
            metrics_dir = Path(folders.enter_context(tempfile.TemporaryDirectory(prefix="voicering-agent-metrics-")))
        await _serve(settings, ring, metrics_dir, devmode=devmode)


async def _serve(settings: AgentSettings, ring, metrics_dir: Path | None, *, devmode: bool) -> None:
    async with (RingStore(ring) as store, RingWatcher(store) as watcher,
                Announcer(store, "agent", default_id(), address=settings.livekit_url or "")):
        server = build_server(settings, FleetLoad(watcher), metrics_dir=metrics_dir)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        running = asyncio.create_task(server.run(devmode=devmode), name="agent-server")
        stopping = asyncio.create_task(stop.wait(), name="agent-server-stop")
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not running.done():
                log.info("stopping: draining the agent server's jobs")
                await server.drain()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            stopping.cancel()
            await server.aclose()
            await asyncio.gather(running, stopping, return_exceptions=True)
        if running.done() and not running.cancelled() and running.exception() is not None:
            raise running.exception()
