"""The text front end on the serving path (issue 36), on the real engine: a worker reads what the
caller wrote as the normalizer does, once, where the prompt is built; `"normalize": false` speaks
it as written. Seeded speech is byte-identical for identical prompts (as test_cluster relies on), so
the audio itself shows which text the model was prompted with: stand-in weights make noise, but
the same noise only for the same prompt ids."""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import connect

from gpu_worker.client import WorkerClient
from gpu_worker.protocol import ContextOptions, Start, encode, parse_client
from gpu_worker.text import normalize

SEEDED = ContextOptions(max_tokens=21, seed=36)


async def say(worker, text: str, options: ContextOptions = SEEDED) -> bytes:
    async with await WorkerClient.connect(worker.url) as client:
        return (await client.say("tara", text, options=options)).pcm


async def test_the_worker_reads_digits_money_and_units_as_the_normalizer_does(worker):
    written = "It costs $5.20 for 3 km."
    read = normalize(written).text
    assert read != written and "five dollars" in read
    assert await say(worker, written) == await say(worker, read)


async def test_normalize_false_speaks_the_text_as_written(worker):
    written = "It costs $5.20 for 3 km."
    raw = await say(worker, written, ContextOptions(max_tokens=21, seed=36, normalize=False))
    assert raw != await say(worker, written)  # another prompt: other audio
    assert raw == await say(worker, written, ContextOptions(max_tokens=21, seed=36, normalize=False))


async def test_an_option_that_is_not_a_boolean_is_refused_and_the_default_stays_off_the_wire(worker):
    assert "normalize" not in json.loads(encode(Start("c", "tara", "Hi.", SEEDED)))["options"]
    assert json.loads(encode(Start("c", "tara", "Hi.", ContextOptions(normalize=False))))["options"]["normalize"] is False
    with pytest.raises(Exception, match="option 'normalize' must be true or false"):
        parse_client(json.dumps({"type": "start", "context_id": "c", "voice": "tara", "options": {"normalize": "no"}}))
    async with connect(worker.url) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "n", "voice": "tara", "text": "Hi.",
                                  "options": {"normalize": 1}}))
        reply = json.loads(await ws.recv())
        assert reply["type"] == "error" and reply["code"] == "bad_request" and "normalize" in reply["message"]
