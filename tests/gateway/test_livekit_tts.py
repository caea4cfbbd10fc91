"""The livekit-agents TTS plugin against the real framework in-process, the session's real
`voicering worker` (`worker-a`: real vLLM engine, stand-in weights, voices tara and leo) and the
session's real Redis ring. Audio is noise (random weights); what is checked is that the frames the
framework hands on are exactly the samples the worker sent for the same seed and messages."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError, tts
from livekit.agents.metrics import TTSMetrics
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from gateway.livekit import TTS
from gateway.livekit.sentences import Piece, SentenceSplitter
from gateway.livekit.tts import context_options
from gpu_worker.client import WorkerClient
from hashring.ports import free_port
from gpu_worker.protocol import MAX_BUFFER_DELAY_MS, ContextOptions
from hashring.membership import RingWatcher
from hashring.settings import RingSettings
from hashring.store import RingStore
from tests.fixtures.models import CLUSTER_PREFIX, REPO

VOICE = "tara"
TEXT = "Hello there, my old friend. How have you been lately?"
NO_RETRY = APIConnectOptions(max_retry=0, timeout=10)
MARKER_BYTES = 2 * 240  # the framework's 10 ms end-of-segment marker (synthetic silence), 24 kHz mono s16


def opts(seed: int = 1, max_tokens: int = 15) -> ContextOptions:
    """The worker cuts the text (the plugin's default) with the longest wait for a sentence end: a
    test's words come within milliseconds, so where the worker cuts depends on the text alone,
    however late a loaded box runs the delay timer (`test_the_worker_cuts_...` runs the default)."""
    return ContextOptions(max_tokens=max_tokens, seed=seed, chunking="auto", max_buffer_delay_ms=MAX_BUFFER_DELAY_MS)


def ring_settings(redis_url: str) -> RingSettings:
    return RingSettings(redis_url=redis_url, prefix=CLUSTER_PREFIX)


def ring_tts(redis_url: str, **kwargs) -> TTS:
    kwargs.setdefault("options", opts())
    return TTS(voice=kwargs.pop("voice", VOICE), ring=redis_url, ring_settings=ring_settings(redis_url), **kwargs)


def static_tts(worker, **kwargs) -> TTS:
    kwargs.setdefault("options", opts())
    return TTS(voice=kwargs.pop("voice", VOICE), workers=[worker.url], **kwargs)


def pcm_of(events: list[tts.SynthesizedAudio]) -> bytes:
    """The samples the framework handed on, less its synthetic end marker (sent when a slow-audio
    flush had already released the held-back tail: 10 ms of zeros, not the worker's audio)."""
    pcm = b"".join(ev.frame.data.tobytes() for ev in events)
    last = events[-1] if events else None
    if last is not None and last.is_final and len(last.frame.data.tobytes()) == MARKER_BYTES \
            and not any(last.frame.data.tobytes()):
        pcm = pcm[:-MARKER_BYTES]
    return pcm


async def speak(plugin: tts.TTS, chunks: list[str], *, gap_s: float = 0.0,
                conn_options: APIConnectOptions | None = None) -> list[tts.SynthesizedAudio]:
    """One speech turn as the agent's tts_node drives it: text pushed as it comes, end_input, read all."""
    stream = plugin.stream(conn_options=conn_options) if conn_options else plugin.stream()

    async def feed() -> None:
        for chunk in chunks:
            stream.push_text(chunk)
            if gap_s:
                await asyncio.sleep(gap_s)
        stream.end_input()

    feeder = asyncio.create_task(feed())
    try:
        return [ev async for ev in stream]
    finally:
        await feeder
        await stream.aclose()


def words(text: str) -> list[str]:
    parts = text.split(" ")
    return [p if i == 0 else " " + p for i, p in enumerate(parts)]


async def direct_like_the_plugin(url: str, chunks: list[str], options: ContextOptions, voice: str = VOICE, *,
                                 alignments: list | None = None, min_sentence_chars: int | None = None) -> bytes:
    """The same messages the plugin sends, straight to the worker with its own client: the first
    text in `start`, then by default each chunk as it came (the worker cuts: `chunking` "auto"),
    or with ``min_sentence_chars`` the plugin's own cut (a flush per sentence); then `end`.
    ``alignments`` gathers the word timings of a start that asks for them (a version-2 connection)."""
    options = context_options(options, aligned=False, min_sentence_chars=min_sentence_chars)
    if min_sentence_chars is None:
        pieces = [Piece(c, False) for c in chunks]
    else:
        splitter = SentenceSplitter(min_sentence_chars)
        pieces = [p for c in chunks for p in splitter.feed(c)] + splitter.end()
    async with await WorkerClient.connect(url, version=2 if alignments is not None else 1) as client:
        first = next(i for i, p in enumerate(pieces) if p.text.strip())
        stream = await client.start(voice, pieces[first].text, options=options)
        if pieces[first].flush:
            await stream.flush()
        for piece in pieces[first + 1:]:
            if piece.text:
                await stream.push(piece.text)
            if piece.flush:
                await stream.flush()
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
    if alignments is not None:
        alignments.extend(stream.alignments)
    return pcm


async def test_synthesize_gives_24khz_mono_frames_equal_to_the_worker_s_samples(worker):
    plugin = static_tts(worker, options=opts(seed=11))
    try:
        events = [ev async for ev in plugin.synthesize(TEXT)]
    finally:
        await plugin.aclose()
    async with await WorkerClient.connect(worker.url) as client:
        direct = await client.say(VOICE, TEXT, options=opts(seed=11))
    assert events and all(ev.frame.sample_rate == 24000 and ev.frame.num_channels == 1 for ev in events)
    assert pcm_of(events) == direct.pcm and direct.pcm


async def test_stream_through_the_ring_equals_the_worker_s_samples_and_reports_metrics(worker, redis_url):
    plugin = ring_tts(redis_url, options=opts(seed=12, max_tokens=30))
    metrics: list[TTSMetrics] = []
    plugin.on("metrics_collected", metrics.append)
    chunks = words(TEXT)
    try:
        first = await speak(plugin, chunks)
        again = await speak(plugin, chunks)
        pool = plugin.transport.pool
        assert len(pool.connections("worker-a")) == 1 and pool.handshakes == 1
    finally:
        await plugin.aclose()
    direct = await direct_like_the_plugin(worker.url, chunks, opts(seed=12, max_tokens=30))
    assert direct and pcm_of(first) == direct and pcm_of(again) == direct
    assert {ev.frame.sample_rate for ev in first} == {24000}
    assert len(metrics) == 2 and all(m.streamed and m.ttfb > 0 and m.audio_duration > 0 for m in metrics)
    assert metrics[0].connection_reused is False and metrics[1].connection_reused is True
    assert all(m.acquire_time > 0 for m in metrics)
    assert metrics[0].label == "gateway.livekit.tts.TTS" and metrics[0].metadata.model_provider == "voicering"


async def test_each_timed_word_reaches_the_framework_as_a_timed_string_with_the_worker_s_times(worker):
    """Aligned transcripts (issue 37 item 4): the plugin asks every context for word timings and
    pushes each word to livekit as `TimedString("word ", start_time, end_time)`, which the framework
    carries on the audio frames (`lk.timed_transcripts`) to its transcription sync. The stand-in's
    audio is noise: the times are the worker's estimate, the same the worker gives a direct caller."""
    plugin = static_tts(worker, options=opts(seed=13, max_tokens=7 * 8 + 1))
    assert plugin.capabilities.aligned_transcript and plugin.options.context.alignment == "word"
    chunks = words("I paid $5 today. Thanks a lot!")
    try:
        events = await speak(plugin, chunks)
    finally:
        await plugin.aclose()
    pushed = [t for ev in events for t in ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    timings: list = []
    pcm = await direct_like_the_plugin(worker.url, chunks, replace(opts(seed=13, max_tokens=7 * 8 + 1),
                                                                    alignment="word"), alignments=timings)
    assert pcm_of(events) == pcm
    want = [(f"{w.text} ", w.start_s, w.end_s) for a in timings for w in a.words]
    assert [str(t) for t in pushed] == [w[0] for w in want] == ["I ", "paid ", "$5 ", "today ", "Thanks ", "a ", "lot "]
    # the same times, to espeak-ng's reproducibility: its synthesizer carries its waveform's phase from
    # one reading to the next, which moves a reference word by ~1 ms and a warped time by a frame or so
    assert [(t.start_time, t.end_time) for t in pushed] == [pytest.approx(w[1:], abs=0.02) for w in want]
    unaligned = static_tts(worker, aligned_transcript=False)
    assert not unaligned.capabilities.aligned_transcript and unaligned.options.context.alignment is None
    await unaligned.aclose()


async def test_update_options_reaches_new_streams_but_never_a_running_one(worker):
    plugin = static_tts(worker, options=opts(seed=21))
    try:
        running = plugin.stream()
        running.push_text("A line spoken with the first seed.")
        plugin.update_options(options=opts(seed=22), voice="leo")
        running.end_input()
        old = [ev async for ev in running]
        await running.aclose()
        new = await speak(plugin, ["A line spoken with the first seed."])
    finally:
        await plugin.aclose()
    assert plugin.options.voice == "leo" and plugin.options.context.seed == 22
    async with await WorkerClient.connect(worker.url) as client:
        want_old = await client.say("tara", "A line spoken with the first seed.", options=opts(seed=21))
        want_new = await client.say("leo", "A line spoken with the first seed.", options=opts(seed=22))
    assert pcm_of(old) == want_old.pcm and pcm_of(new) == want_new.pcm and want_old.pcm != want_new.pcm


@pytest.mark.parametrize("chunks", [[], ["   ", "\n"]], ids=["nothing", "blank"])
async def test_an_empty_turn_ends_cleanly_with_no_audio_no_error_and_no_context(worker, chunks):
    plugin = static_tts(worker)
    errors: list[tts.TTSError] = []
    plugin.on("error", errors.append)
    try:
        events = await speak(plugin, chunks, conn_options=NO_RETRY)
        chunked = [ev async for ev in plugin.synthesize("  ")]
        assert plugin.transport.pool.handshakes == 0  # no context was ever opened
    finally:
        await plugin.aclose()
    assert events == [] and chunked == [] and errors == []


async def test_an_unknown_voice_is_a_non_retryable_error_naming_the_voice(worker):
    plugin = static_tts(worker, voice="nobody-by-that-name")
    errors: list[tts.TTSError] = []
    plugin.on("error", errors.append)
    try:
        with pytest.raises(APIStatusError) as streamed:
            await speak(plugin, ["Is anyone there?"])
        with pytest.raises(APIStatusError) as chunked:
            [ev async for ev in plugin.synthesize("Is anyone there?")]
    finally:
        await plugin.aclose()
    for err in (streamed.value, chunked.value):
        assert err.status_code == 404 and err.retryable is False and "nobody-by-that-name" in str(err)
        assert err.body == {"code": "unknown_voice", "voice": "nobody-by-that-name"}
    assert [e.recoverable for e in errors] == [False, False]  # no retry was attempted


async def test_no_worker_is_retryable_before_any_audio(worker):
    dead = TTS(voice=VOICE, workers=[f"ws://127.0.0.1:{free_port()}"], options=opts())
    errors: list[tts.TTSError] = []
    dead.on("error", errors.append)
    try:
        with pytest.raises(APIConnectionError) as err:
            await speak(dead, ["Nobody listens here."], conn_options=APIConnectOptions(max_retry=1, retry_interval=0))
    finally:
        await dead.aclose()
    assert err.value.retryable and err.value.body["code"] == "no_worker"
    assert [e.recoverable for e in errors] == [True, False]  # the framework retried once, then gave up


async def test_stream_adapter_and_fallback_adapter_work_around_the_plugin(worker):
    live = static_tts(worker, options=opts(seed=31))
    dead = TTS(voice=VOICE, workers=[f"ws://127.0.0.1:{free_port()}"], options=opts(seed=31))
    adapter = tts.StreamAdapter(tts=live)
    fallback = tts.FallbackAdapter([dead, live], max_retry_per_tts=0)
    changes: list[tts.AvailabilityChangedEvent] = []
    fallback.on("tts_availability_changed", changes.append)
    try:
        adapted = await speak(adapter, words(TEXT))
        fell_back = await speak(fallback, words(TEXT))
        fell_back_chunked = [ev async for ev in fallback.synthesize(TEXT)]
    finally:
        await fallback.aclose()
        await adapter.aclose()
        await asyncio.gather(live.aclose(), dead.aclose())
    async with await WorkerClient.connect(worker.url) as client:
        # the StreamAdapter speaks each sentence as its own synthesize()
        per_sentence = [(await client.say(VOICE, s, options=opts(seed=31))).pcm
                        for s in ("Hello there, my old friend.", "How have you been lately?")]
    assert pcm_of(adapted) == b"".join(per_sentence)
    assert pcm_of(fell_back) == await direct_like_the_plugin(worker.url, words(TEXT), opts(seed=31))
    whole = await _say(worker, TEXT, opts(seed=31))
    assert whole and pcm_of(fell_back_chunked) == whole
    assert [(c.tts, c.available) for c in changes][:1] == [(dead, False)]


async def _say(worker, text: str, options: ContextOptions) -> bytes:
    async with await WorkerClient.connect(worker.url) as client:
        return (await client.say(VOICE, text, options=options)).pcm


async def test_closing_a_stream_mid_sentence_cancels_the_worker_context_and_stops_the_audio(worker):
    plugin = static_tts(worker, options=opts(seed=41, max_tokens=7 * 80 + 1))
    try:
        await plugin.warm()
        stream = plugin.stream()
        stream.push_text("This sentence is long enough to still be speaking when the listener barges in. ")
        stream.push_text("And it goes on")
        got = []
        async for ev in stream:
            got.append(ev)
            if len(got) == 2:
                break
        closed_at = time.monotonic()
        await stream.aclose()
        after = [ev async for ev in stream]  # a closed stream yields nothing more
        health = await worker.wait_idle(timeout=10)
        idle_after_s = time.monotonic() - closed_at
        assert after == [] and health["active_streams"] == 0 and idle_after_s < 10
        # the connection survives the interruption: the next (short) turn reuses it
        plugin.update_options(options=opts(seed=43))
        nxt = await speak(plugin, ["Next turn, please."])
        assert nxt and plugin.transport.pool.handshakes == 1
    finally:
        await plugin.aclose()


async def test_closing_the_tts_closes_its_open_streams_and_their_contexts(worker):
    plugin = static_tts(worker, options=opts(seed=42, max_tokens=7 * 80 + 1))
    stream = plugin.stream()
    stream.push_text("Keep talking until the whole plugin is closed under you. ")
    async for _ in stream:
        break
    await plugin.aclose()
    assert [ev async for ev in stream] == []
    await worker.wait_idle(timeout=10)


BACK_TO_BACK_TURNS = 30  # enough that a connection (or a stream slot) leaked per turn would show many times over


async def test_many_back_to_back_turns_keep_one_connection_to_the_worker(worker, redis_url):
    plugin = ring_tts(redis_url, options=opts(seed=51, max_tokens=15))
    failed = []
    try:
        await plugin.warm()
        for i in range(BACK_TO_BACK_TURNS):
            try:
                events = await speak(plugin, [f"Turn {i}."], conn_options=NO_RETRY)
                assert events
            except Exception as exc:  # counted, reported below
                failed.append((i, repr(exc)))
            if i % 5 == 0:
                assert len(plugin.transport.pool.connections("worker-a")) == 1
        pool = plugin.transport.pool
        assert failed == []
        assert len(pool.connections("worker-a")) == 1 and pool.handshakes == 1
        assert pool.peer_stats("worker-a").streams == 0
    finally:
        await plugin.aclose()


async def test_redis_down_the_plugin_routes_on_its_cached_ring(worker, redis_server, redis_url):
    plugin = ring_tts(redis_url, options=opts(seed=61))
    try:
        before = await speak(plugin, ["Redis is up."])
        redis_server.kill()
        try:
            watcher = plugin.transport.own_ring.watcher
            async with asyncio.timeout(60):  # the plugin's watcher fails its next refresh
                while not (watcher.stale and watcher.last_error is not None):
                    await asyncio.sleep(0.05)
            during = await speak(plugin, ["Redis is down."], conn_options=NO_RETRY)
            fresh = ring_tts(redis_url)  # never read a ring: a retryable error that says why
            try:
                with pytest.raises(APIConnectionError) as err:
                    await speak(fresh, ["No ring yet."], conn_options=NO_RETRY)
            finally:
                await fresh.aclose()
        finally:
            redis_server.start()
        assert before and during
        assert err.value.retryable and "Redis" in str(err.value) and err.value.body["code"] == "no_worker"
    finally:
        await plugin.aclose()
    # the worker registers again in the empty Redis; later tests find the ring as before
    async with RingStore(ring_settings(redis_url)) as store, RingWatcher(store) as watcher:
        await watcher.wait_for(lambda v: "worker-a" in v.ring, timeout=30)


def test_the_plugin_imports_no_torch_or_vllm():
    code = ("import sys, gateway.livekit, gateway.livekit.tts, gateway.livekit.transport, gateway.livekit.agent, "
            "gateway.livekit.settings, gateway.livekit.cli; "
            "print(','.join(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
    code = "import sys, voicering.cli; print([m for m in ('livekit', 'redis') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr  # `voicering --help` stays light with `agent` registered


async def test_the_first_sentence_is_spoken_before_the_rest_of_the_text_arrives(worker):
    """The LLM has written one sentence and is still thinking: its audio must come now, not at end_input."""
    plugin = static_tts(worker, options=opts(seed=71))
    try:
        stream = plugin.stream()
        for word in words("This first sentence is complete. And the"):
            stream.push_text(word)
        first = await asyncio.wait_for(anext(aiter(stream)), timeout=60)  # no end_input yet
        stream.push_text(" rest comes later.")
        stream.end_input()
        rest = [ev async for ev in stream]
        await stream.aclose()
    finally:
        await plugin.aclose()
    assert first.frame.samples_per_channel > 0 and rest
    assert pcm_of([first, *rest]) == await direct_like_the_plugin(
        worker.url, words("This first sentence is complete. And the rest comes later."), opts(seed=71))


def test_public_names_import_and_bad_arguments_are_refused():
    import gateway.livekit as package

    assert all(getattr(package, name) is not None for name in package.__all__)
    with pytest.raises(ValueError):
        TTS(voice=VOICE)  # no way to the fleet
    with pytest.raises(ValueError):
        TTS(voice=VOICE, workers=["ws://127.0.0.1:1"], ring="redis://127.0.0.1:1/0")  # two ways
    plugin = TTS(voice=VOICE, workers=["ws://127.0.0.1:1"])
    with pytest.raises(ValueError):
        plugin.update_options(voice="x" * 300)
    with pytest.raises(ValueError):
        plugin.update_options(min_sentence_chars=-1)
    assert plugin.options.voice == VOICE and plugin.capabilities.streaming and plugin.sample_rate == 24000


def test_the_worker_cuts_by_default_and_min_sentence_chars_cuts_in_the_plugin():
    plugin = TTS(voice=VOICE, workers=["ws://127.0.0.1:1"])
    context = plugin.options.context
    assert plugin.options.min_sentence_chars is None
    assert context.chunking == "auto" and context.max_buffer_delay_ms is None  # the worker's delay, 1000 ms
    plugin.update_options(min_sentence_chars=12)
    assert plugin.options.min_sentence_chars == 12 and plugin.options.context.chunking is None
    plugin.update_options(voice="leo")  # other changes keep the cut
    assert plugin.options.min_sentence_chars == 12 and plugin.options.context.chunking is None
    plugin.update_options(min_sentence_chars=None)  # back to the worker
    assert plugin.options.min_sentence_chars is None and plugin.options.context.chunking == "auto"
    assert plugin.options.voice == "leo" and plugin.options.context.alignment == "word"
    own = TTS(voice=VOICE, workers=["ws://127.0.0.1:1"], min_sentence_chars=0)
    assert own.options.context.chunking is None
    with pytest.raises(ValueError, match="one of them"):
        TTS(voice=VOICE, workers=["ws://127.0.0.1:1"], options=ContextOptions(chunking="auto"), min_sentence_chars=20)
    with pytest.raises(ValueError, match="one of them"):
        own.update_options(options=ContextOptions(chunking="auto"))


async def test_the_worker_keeps_abbreviations_whole_where_the_plugin_s_own_cut_breaks_them(worker):
    """The default (the worker cuts, at its default 1000 ms delay) speaks two segments: a cut after
    "today." once the next word shows the sentence ended, and the rest at the turn's end (the words
    come faster than the delay); the plugin's splitter without joining cuts after "Dr.", "p.m." and
    "No." too, so the voice would pause and restart its intonation mid-sentence. Counted by the
    worker (`done`)."""
    text = "Dr. Smith sees you at 3 p.m. today. Bring the No. 5 form. Thanks."
    segments = {}
    for name, cut in (("worker", None), ("plugin", 0)):
        plugin = static_tts(worker, options=ContextOptions(seed=17, max_tokens=8), min_sentence_chars=cut)
        try:
            stream = plugin.stream()
            for word in words(text):
                stream.push_text(word)
            stream.end_input()
            assert [ev async for ev in stream]
            await stream.aclose()
            segments[name] = stream.worker_done.stats.segments
        finally:
            await plugin.aclose()
    assert segments == {"worker": 2, "plugin": 6}
