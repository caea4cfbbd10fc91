"""`/v1/pronunciations` and the `pronunciations` field, through a real `voicering gateway` process to
the session's real worker (which reads the dictionaries from the session Redis): seeded speech is
byte-identical for identical prompts, so "Dr. Who" read with a rule Who -> "Hoo" must equal
"Doctor Hoo" spoken directly with the same seed and options."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from gateway.tenants.pronunciations import MAX_DICTIONARIES
from gpu_worker.client import WorkerClient
from gpu_worker.protocol import AudioChunk, ContextOptions
from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX

pytestmark = pytest.mark.timeout(300)
EXTRA = {"seed": 11, "max_tokens": 15}
WHO = [{"written": "Who", "spoken": "Hoo"}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def api(gateway, key: str, method: str, path: str, **kwargs) -> httpx.Response:
    return httpx.request(method, f"{gateway.url}/v1/pronunciations{path}", headers=auth(key), timeout=30, **kwargs)


async def direct(worker, text: str) -> bytes:
    async with await WorkerClient.connect(worker.url) as client:
        return (await client.say("tara", text, options=ContextOptions(seed=11, max_tokens=15))).pcm


async def speak(gateway, key: str, text: str, **extra) -> bytes:
    client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    response = await client.audio.speech.create(model="voicering-orpheus", voice="tara", input=text,
                                                response_format="pcm", extra_body={**EXTRA, **extra})
    return response.content


def assert_error(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and set(error) >= {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param
    return error


async def test_create_list_get_replace_delete(gateway, new_tenant):
    _, key = await new_tenant()
    made = api(gateway, key, "POST", "", json={"name": "names", "rules": WHO})
    assert made.status_code == 201 and made.json()["rule_count"] == 1 and made.json()["object"] == "pronunciation_dictionary"
    listed = api(gateway, key, "GET", "").json()
    assert listed["object"] == "list" and [d["name"] for d in listed["data"]] == ["names"]
    one = api(gateway, key, "GET", "/names").json()
    assert one["rules"] == [{"written": "Who", "spoken": "Hoo", "case_sensitive": False, "whole_word": True}]
    replaced = api(gateway, key, "PUT", "/names", json={"rules": [{"written": "Who", "spoken": "Whom"}]})
    assert replaced.status_code == 200 and replaced.json()["version"] != made.json()["version"]
    assert api(gateway, key, "GET", "/names").json()["rules"][0]["spoken"] == "Whom"
    assert_error(api(gateway, key, "POST", "", json={"name": "names", "rules": WHO}), 409, "pronunciation_exists")
    assert_error(api(gateway, key, "PUT", "/names", json={"name": "other", "rules": WHO}), 400, "invalid_value", "name")
    deleted = api(gateway, key, "DELETE", "/names")
    assert deleted.status_code == 200 and deleted.json() == {"object": "pronunciation_dictionary.deleted",
                                                               "name": "names", "deleted": True}
    for method, body in (("GET", None), ("DELETE", None), ("PUT", {"rules": WHO})):
        assert_error(api(gateway, key, method, "/names", json=body), 404, "pronunciation_not_found")
    assert api(gateway, key, "GET", "").json()["data"] == []
    assert_error(httpx.get(f"{gateway.url}/v1/pronunciations", timeout=10), 401, "invalid_api_key")


async def test_a_hostile_client_is_refused_clearly_and_nothing_is_stored(gateway, new_tenant):
    _, key = await new_tenant()
    hostile = [
        ({"name": "bad name", "rules": WHO}, 400, "invalid_pronunciation", "name"),
        ({"name": "x" * 65, "rules": WHO}, 400, "invalid_pronunciation", "name"),
        ({"name": "ok", "rules": [{"written": "a" * 101, "spoken": "b"}]}, 400, "invalid_pronunciation", "rules"),
        ({"name": "ok", "rules": [{"written": "a", "spoken": "<laugh>"}]}, 400, "invalid_pronunciation", "rules"),
        ({"name": "ok", "rules": [{"written": f"w{i}", "spoken": "b"} for i in range(1001)]}, 400,
         "invalid_pronunciation", "rules"),
        ({"name": "ok", "rules": [{"written": "a", "spoken": "b", "ipa": "x"}]}, 400, "invalid_pronunciation", "rules"),
        ({"name": "ok", "rules": "a->b"}, 400, "invalid_pronunciation", "rules"),
        ({"name": "ok"}, 400, "missing_field", "rules"),
        ({"rules": WHO}, 400, "missing_field", "name"),
        ({"name": "ok", "rules": WHO, "voice": "tara"}, 400, "invalid_value", "voice"),
    ]
    for body, status, code, param in hostile:
        assert_error(api(gateway, key, "POST", "", json=body), status, code, param)
    assert_error(api(gateway, key, "POST", "", content=b"[1, 2]"), 400, "invalid_json")
    huge = json.dumps({"name": "ok", "rules": [{"written": "a", "spoken": "b" * 200}] * 6000}).encode()
    assert_error(api(gateway, key, "POST", "", content=huge), 413, "request_too_large")
    oversize = [{"written": f"{i:04d}" + "w" * 96, "spoken": "s" * 200} for i in range(1000)]
    error = assert_error(api(gateway, key, "POST", "", json={"name": "ok", "rules": oversize}), 400,
                         "invalid_pronunciation", "rules")
    assert "bytes stored" in error["message"]
    assert api(gateway, key, "GET", "").json()["data"] == []
    for i in range(MAX_DICTIONARIES):
        assert api(gateway, key, "POST", "", json={"name": f"d{i}", "rules": WHO}).status_code == 201
    error = assert_error(api(gateway, key, "POST", "", json={"name": "one-more", "rules": WHO}), 429,
                         "pronunciations_limit_exceeded")
    assert "delete one" in error["message"]
    assert len(api(gateway, key, "GET", "").json()["data"]) == MAX_DICTIONARIES
    for names in (["d0", "d0"], ["d0", "d1", "d2", "d3"], ["bad name"]):
        response = httpx.post(f"{gateway.url}/v1/audio/speech", headers=auth(key), timeout=30,
                              json={"model": "tts-1", "voice": "tara", "input": "Hi.", "pronunciations": names, **EXTRA})
        assert response.status_code == 400 and response.json()["error"]["param"].startswith("pronunciations")


async def test_speech_reads_the_dictionary_and_a_replace_takes_effect_on_the_next_request(gateway, worker, new_tenant):
    _, key = await new_tenant()
    assert api(gateway, key, "POST", "", json={"name": "names", "rules": WHO}).status_code == 201
    hoo, who, whom = (await direct(worker, "Doctor Hoo."), await direct(worker, "Doctor Who."),
                      await direct(worker, "Doctor Whom."))
    assert len({hoo, who, whom}) == 3
    assert await speak(gateway, key, "Dr. Who.") == who  # no dictionary named: as before
    began = time.perf_counter()
    assert await speak(gateway, key, "Dr. Who.", pronunciations=["names"]) == hoo
    first_ms = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    assert await speak(gateway, key, "Dr. Who.", pronunciations=["names"]) == hoo
    cached_ms = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    assert api(gateway, key, "PUT", "/names", json={"rules": [{"written": "Who", "spoken": "Whom"}]}).status_code == 200
    assert await speak(gateway, key, "Dr. Who.", pronunciations=["names"]) == whom  # the very next request
    replaced_ms = (time.perf_counter() - began) * 1000
    print(f"speech with a dictionary: first {first_ms:.0f} ms, cached {cached_ms:.0f} ms; PUT + next request "
          f"{replaced_ms:.0f} ms (it read the new rule)")
    assert api(gateway, key, "DELETE", "/names").status_code == 200
    response = httpx.post(f"{gateway.url}/v1/audio/speech", headers=auth(key), timeout=30,
                          json={"model": "tts-1", "voice": "tara", "input": "Dr. Who.", "pronunciations": ["names"],
                                **EXTRA})
    assert_error(response, 404, "pronunciation_not_found", "pronunciations")


async def test_normalize_false_still_applies_the_dictionary(gateway, worker, new_tenant):
    _, key = await new_tenant()
    api(gateway, key, "POST", "", json={"name": "names", "rules": WHO})
    async with await WorkerClient.connect(worker.url) as client:
        as_written = (await client.say("tara", "Dr. Hoo.", options=ContextOptions(seed=11, max_tokens=15,
                                                                                 normalize=False))).pcm
    assert await speak(gateway, key, "Dr. Who.", pronunciations=["names"], normalize=False) == as_written


async def test_tenant_b_cannot_read_or_use_a_s_dictionary(gateway, new_tenant):
    a, key_a = await new_tenant()
    _, key_b = await new_tenant()
    assert api(gateway, key_a, "POST", "", json={"name": "secret", "rules": WHO}).status_code == 201
    assert api(gateway, key_b, "GET", "").json()["data"] == []
    for method, body in (("GET", None), ("PUT", {"rules": WHO}), ("DELETE", None)):
        assert_error(api(gateway, key_b, method, "/secret", json=body), 404, "pronunciation_not_found")
    response = httpx.post(f"{gateway.url}/v1/audio/speech", headers=auth(key_b), timeout=30,
                          json={"model": "tts-1", "voice": "tara", "input": "Who?", "pronunciations": ["secret"], **EXTRA})
    assert_error(response, 404, "pronunciation_not_found", "pronunciations")
    assert api(gateway, key_a, "GET", "/secret").status_code == 200  # still A's, unchanged
    # a forged reference to A's hash on B's stream is refused before anything reaches a worker
    forged = {"key": f"{GATEWAY_TENANT_PREFIX}:t:{a.id}:pronunciations", "name": "secret", "version": "ab"}
    async with await connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers=auth(key_b)) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "f", "voice": "tara", "text": "Who?",
                                  "options": {**EXTRA, "pronunciations": [forged]}}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert error["type"] == "error" and error["code"] == "bad_request" and "not for callers" in error["message"]
        await ws.send(json.dumps({"type": "start", "context_id": "g", "voice": "tara", "text": "Who?",
                                  "pronunciations": ["secret"], "options": EXTRA}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert error["type"] == "error" and error["code"] == "pronunciation_not_found" and error["context_id"] == "g"


async def test_a_stream_start_names_dictionaries(gateway, worker, new_tenant):
    _, key = await new_tenant()
    api(gateway, key, "POST", "", json={"name": "names", "rules": WHO})
    async with await connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers=auth(key), max_size=1 << 22) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "a", "voice": "tara", "text": "Dr. ",
                                  "pronunciations": ["names"], "options": EXTRA}))
        await ws.send(json.dumps({"type": "text", "context_id": "a", "text": "Who."}))
        await ws.send(json.dumps({"type": "end", "context_id": "a"}))
        pcm = b""
        while True:
            raw = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(raw, bytes):
                pcm += AudioChunk.decode(raw).pcm
                continue
            message = json.loads(raw)
            if message["type"] in ("done", "error"):
                break
    assert message["type"] == "done", message
    assert pcm == await direct(worker, "Doctor Hoo.")


async def test_a_voice_s_default_dictionaries_apply_unless_the_request_names_its_own(gateway, worker, new_tenant):
    _, key = await new_tenant()
    api(gateway, key, "POST", "", json={"name": "names", "rules": WHO})
    api(gateway, key, "POST", "", json={"name": "other", "rules": [{"written": "Who", "spoken": "Whom"}]})
    voice = f"{gateway.url}/v1/voices/tara/pronunciations"
    assert httpx.get(voice, headers=auth(key), timeout=30).json()["pronunciations"] == []
    response = httpx.put(voice, headers=auth(key), timeout=30, json={"pronunciations": ["names"]})
    assert response.status_code == 200 and response.json()["pronunciations"] == ["names"]
    hoo, who, whom = (await direct(worker, "Doctor Hoo."), await direct(worker, "Doctor Who."),
                      await direct(worker, "Doctor Whom."))
    assert await speak(gateway, key, "Dr. Who.") == hoo  # the voice's default, named by nobody
    assert await speak(gateway, key, "Dr. Who.", pronunciations=["other"]) == whom  # the request's own list instead
    assert await speak(gateway, key, "Dr. Who.", pronunciations=[]) == who  # none at all
    assert_error(api(gateway, key, "DELETE", "/names"), 409, "pronunciation_in_use")  # a default is not deleted
    for body in ({"pronunciations": ["missing"]}, {"pronunciations": "names"}, {"other": []}):
        response = httpx.put(voice, headers=auth(key), timeout=30, json=body)
        assert response.status_code in (400, 404) and response.json()["error"]["param"] == "pronunciations"
    assert_error(httpx.put(f"{gateway.url}/v1/voices/nobody/pronunciations", headers=auth(key), timeout=30,
                           json={"pronunciations": ["names"]}), 404, "voice_not_found", "voice")
    assert httpx.get(voice, headers=auth(key), timeout=30).json()["pronunciations"] == ["names"]  # unchanged by those
    assert httpx.put(voice, headers=auth(key), timeout=30, json={"pronunciations": []}).status_code == 200
    assert await speak(gateway, key, "Dr. Who.") == who
    assert api(gateway, key, "DELETE", "/names").status_code == 200
