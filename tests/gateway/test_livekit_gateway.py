"""The plugin as an app developer runs it in their own livekit agent: through the public gateway's
text-in websocket with a tenant API key (`GatewayTransport`), not the cluster token. Real
livekit-agents framework in-process, the real `voicering gateway` process, the session's worker."""

from __future__ import annotations

import pytest
from livekit.agents import APIStatusError

from gateway.livekit import TTS
from gateway.livekit.transport import GatewayTransport
from gpu_worker.client import WorkerClient
from gpu_worker.protocol import MAX_BUFFER_DELAY_MS, ContextOptions
from tests.gateway.test_livekit_tts import direct_like_the_plugin, pcm_of, speak, words

TEXT = "Hello from an app's own agent. It speaks through the public gateway."


async def test_stream_and_synthesize_through_the_gateway_equal_the_worker_s_samples(gateway, worker, new_tenant):
    _, key = await new_tenant()
    transport = GatewayTransport(gateway.url, key)
    options = ContextOptions(seed=31, max_tokens=22, chunking="auto", max_buffer_delay_ms=MAX_BUFFER_DELAY_MS)
    plugin = TTS(voice="tara", transport=transport, options=options)
    try:
        streamed = await speak(plugin, words(TEXT))
        synthesized = [ev async for ev in plugin.synthesize("One line.")]
        again = await speak(plugin, words("And a second turn."))
    finally:
        await plugin.aclose()
    direct = await direct_like_the_plugin(worker.url, words(TEXT), options)
    assert pcm_of(streamed) == direct and direct
    async with await WorkerClient.connect(worker.url) as client:
        line = await client.say("tara", "One line.", options=options)
    assert pcm_of(synthesized) == line.pcm
    assert pcm_of(again)
    assert transport.connections == 1  # three turns, one websocket to the gateway
    await worker.wait_idle()


async def test_a_bad_key_and_another_tenant_s_voice_are_clear_non_retryable_errors(gateway, new_tenant):
    bad = TTS(voice="tara", transport=GatewayTransport(gateway.url, "vr_not-a-key"),
              options=ContextOptions(seed=1, max_tokens=15))
    _, key = await new_tenant()
    unknown = TTS(voice="t_aaaaaaaaaa/their-voice", transport=GatewayTransport(gateway.url, key),
                  options=ContextOptions(seed=1, max_tokens=15))
    try:
        with pytest.raises(APIStatusError) as err:
            await speak(bad, ["Hi."])
        assert err.value.status_code == 401 and not err.value.retryable
        with pytest.raises(APIStatusError) as err:
            await speak(unknown, ["Hi."])
        assert err.value.status_code == 404 and not err.value.retryable
    finally:
        await bad.aclose()
        await unknown.aclose()
