"""The Pipecat service across gateway drains (SIGTERM: a rollout), in a real pipeline in-process:
real `voicering gateway` processes of the test's own, one after the other on one address (what a
rolling update behind one URL looks like to a client), the session's worker.

- a turn that starts while its gateway drains is refused there (`going_away`) and started again
  on a new socket, which the next gateway on the address takes: the turn is spoken whole, without
  an error; the turn still speaking on the old socket finishes there, and that socket then closes
  (1001);
- an idle socket the drain closes with 1001 is redialed with back-off until the next gateway
  answers; the next turn speaks on it.
"""

from __future__ import annotations

import asyncio
import signal
from unittest import mock

from pipecat.frames.frames import (LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame,
                                   TTSSpeakFrame, TTSStoppedFrame)

from bench.pipecat import running, words
from gateway.pipecat import VoiceringTTSService
from hashring.ports import free_port
from tests.fixtures import gateway as gateway_fixtures
from tests.gateway.test_pipecat_service import gateway_hops, pcm
from tests.gateway.test_stream_drain import draining

BACK_OFF = {"reconnect_backoff_min_wait": 0.2, "reconnect_backoff_max_wait": 1.0, "reconnect_attempts": 40}


def gateway_on(port: int, redis_server, adapter_store, folder, *extra: str):
    """`start_gateway` on a given port (the fixture draws a free one): the next gateway of a rollout."""
    with mock.patch.object(gateway_fixtures, "free_port", side_effect=[port, free_port()]):
        return gateway_fixtures.start_gateway(redis_server.url, adapter_store, folder, *extra)


async def test_a_turn_refused_by_a_draining_gateway_is_spoken_by_the_next(worker, redis_server, adapter_store,
                                                                          new_tenant, tmp_path):
    port = free_port()
    first, second = gateway_on(port, redis_server, adapter_store, tmp_path / "a", "--grace", "60"), None
    try:
        _, key = await new_tenant()
        tts = VoiceringTTSService(api_key=key, url=first.url, **BACK_OFF,
                                  settings=VoiceringTTSService.Settings(voice="tara", seed=9, max_tokens=22))
        async with running(tts) as bot:
            since = len(bot.down.frames)
            # an LLM turn whose response has not ended: its context stays open on the first gateway,
            # however fast the worker speaks, so the next turn's start goes out on that socket
            await bot.say(LLMFullResponseStartFrame(),
                          *[LLMTextFrame(w) for w in words("This turn is still open when its gateway drains. And")])
            await bot.down.until(lambda fs: any(isinstance(f, TTSAudioRawFrame) for f in fs[since:]))
            first.proc.send_signal(signal.SIGTERM)
            await draining(first)
            second = await asyncio.to_thread(gateway_on, port, redis_server, adapter_store, tmp_path / "b")
            await bot.say(TTSSpeakFrame("A turn after the drain."), LLMFullResponseEndFrame())
            await bot.down.until(lambda fs: len([f for f in fs[since:] if isinstance(f, TTSStoppedFrame)]) == 2)
            errors, frames = bot.errors(), [f for _, f in bot.down.frames[since:]]
            stopped = [f.context_id for f in frames if isinstance(f, TTSStoppedFrame)]
        assert not errors, errors
        for context_id in stopped:  # both turns spoken, each with its own audio
            assert pcm([f for f in frames if getattr(f, "context_id", None) == context_id])
        assert tts.sockets_opened == 2
        assert await asyncio.to_thread(first.proc.wait, 60) is not None  # its last context done: it closed and exited
        assert "draining 1 stream socket(s) with 1 open context(s)" in first.log_path.read_text()
        # the first turn was spoken there, the second here
        assert gateway_hops(first, "completed") == 1 and gateway_hops(second, "completed") == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_an_idle_socket_closed_by_a_drain_is_redialed_with_back_off(worker, redis_server, adapter_store,
                                                                          new_tenant, tmp_path):
    port = free_port()
    first, second = gateway_on(port, redis_server, adapter_store, tmp_path / "a"), None
    try:
        _, key = await new_tenant()
        tts = VoiceringTTSService(api_key=key, url=first.url, **BACK_OFF,
                                  settings=VoiceringTTSService.Settings(voice="tara", seed=4, max_tokens=22))
        connected = asyncio.Event()

        @tts.event_handler("on_connected")
        async def _connected(service) -> None:
            connected.set()

        async with running(tts) as bot:
            assert pcm(await bot.speak("Before the rollout."))
            connected.clear()
            first.proc.send_signal(signal.SIGTERM)  # nothing open on our socket: closed with 1001 at once
            await asyncio.to_thread(first.proc.wait, 60)
            second = await asyncio.to_thread(gateway_on, port, redis_server, adapter_store, tmp_path / "b")
            async with asyncio.timeout(60):
                await connected.wait()  # redialed once an answer came
            after = await bot.speak("After the rollout.")
            errors = bot.errors()
        assert not errors, errors  # a rollout is not an error: the dials that found no gateway were only logged
        assert pcm(after) and gateway_hops(second, "completed") == 1
        assert tts.sockets_opened >= 2 and tts.open_sockets == 0 and tts.is_usable
    finally:
        first.stop()
        if second is not None:
            second.stop()
