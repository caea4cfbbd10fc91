"""The demo's lines through the openai client (`voicering.stack.demo.speak_line`) against a real HTTP
server on loopback that answers in the gateway's SSE shape: a line cut mid-speech (an `error`
event where `speech.audio.done` was due) is said again once and reported; cut twice, the demo
fails. The server is written here because a real worker cannot be made to stall on demand (two
CPU burners beside the suite did it once: the demo's proxied line came back cut)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import uvicorn
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from hashring.ports import free_port
from voicering.stack.demo import DemoFailed, speak_line

PCM = b"\x01\x00" * 2400  # 0.1 s at 24 kHz
CUT = {"type": "error", "error": {"message": "worker w1 stopped sending audio mid-context", "type": "server_error",
                                  "param": None, "code": "worker_timeout"}}
DONE = {"type": "speech.audio.done", "served_by": "w2", "proxied": False, "usage": {}}


def event(body: dict) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


async def serving(cuts: int):
    """A speech route that cuts its first ``cuts`` answers after one chunk; the requests it saw."""
    seen: list[dict] = []

    async def speech(request):
        seen.append(await request.json())
        cut = len(seen) <= cuts

        async def body():
            yield event({"type": "speech.audio.delta", "audio": base64.b64encode(PCM).decode()})
            yield event(CUT if cut else DONE)

        return StreamingResponse(body(), media_type="text/event-stream")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/v1/audio/speech", speech, methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}/v1", seen


@pytest.mark.parametrize("cuts", [0, 1, 2])
async def test_a_line_cut_mid_speech_is_said_again_once(cuts, tmp_path, capsys):
    server, task, url, seen = await serving(cuts)
    client = AsyncOpenAI(base_url=url, api_key="demo")
    try:
        if cuts == 2:
            with pytest.raises(DemoFailed, match="cut mid-speech twice: worker_timeout"):
                await speak_line(client, "owner", "gateway -> ring owner", tmp_path, None)
        else:
            line = await speak_line(client, "owner", "gateway -> ring owner", tmp_path, None)
            assert (line.served_by, line.proxied, line.audio_s) == ("w2", False, 0.1)  # the whole retry's, alone
    finally:
        await client.close()
        server.should_exit = True
        await task
    assert len(seen) == min(cuts + 1, 2) and all(r["seed"] == 7 for r in seen)
    said_again = capsys.readouterr().out.count("cut mid-speech after 0.1 s of audio (worker_timeout")
    assert said_again == min(cuts, 1)
