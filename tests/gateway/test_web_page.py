"""The web page at `/` in a real headless Chromium, against a real `voicering gateway` process and the
session's real worker: it loads cleanly, lists voices, streams a line through Web Audio (playback
starting before the response ends), says a bad key's error in words (not the API's), and uploads a
clone with upload progress, then shows its training state; with spoken consent (a phrase asked
for, its reading picked as a file) it uploads and shows the voice queued with its upload checks;
a faulty upload's findings are listed, and a consent policy error switches the page to the
account's policy.

The spoken-consent test picks the reading as a file: the page's microphone path (MediaRecorder)
needs a capture device, which the session's headless Chromium does not have (it runs without
Chromium's fake-device flags), so a test of it would prove nothing about a real microphone."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from gateway.cloning.consent import text_to_read
from lora_training.espeak import LIST_WORD_GAP_MS
from tests.fixtures.speech import CREATOR_VOICE, SAMPLE_RATE, synthesize


LINE = "The birch canoe slid on the smooth planks, and the juice of lemons makes fine punch."
SEED, MAX_TOKENS = 7, 140  # 20 frames of 2048 samples: long enough to arrive in many chunks


@pytest.fixture
async def key(new_tenant):
    _, api_key = await new_tenant()
    return api_key


@pytest.fixture(scope="module")
def api_paths(gateway) -> dict[str, set[str]]:
    schema = httpx.get(f"{gateway.url}/openapi.json", timeout=10).json()
    return {path: {m.upper() for m in methods} for path, methods in schema["paths"].items()}


def js(value) -> str:
    return json.dumps(value)


async def use_key(page, key: str) -> None:
    await page.evaluate(f"document.getElementById('api-key').value = {js(key)}; "
                        "document.getElementById('key-use').click()")
    await page.wait_for("!document.getElementById('voices-status').textContent.startsWith('loading')")


async def text_of(page, element_id: str) -> str:
    return await page.evaluate(f"document.getElementById({js(element_id)}).textContent")


async def number_of(page, element_id: str) -> float:
    return float(await text_of(page, element_id))


def voice_list_exists(api_paths) -> bool:
    return "GET" in api_paths.get("/v1/voices", set())


async def test_the_page_loads_without_errors_and_keeps_the_key_in_session_storage(page, gateway, key, api_paths):
    assert await page.evaluate("document.title") == "voicering: try a voice"
    for element_id in ("api-key", "voice", "text", "speak", "clone-files", "clone-consent", "upload-progress"):
        assert await page.evaluate(f"!!document.getElementById({js(element_id)})"), element_id
    await use_key(page, key)
    assert await page.evaluate("sessionStorage.getItem('voicering.apiKey')") == key
    assert await page.evaluate("localStorage.length") == 0
    await page.goto(f"{gateway.url}/")  # a reload keeps the key for this tab
    assert await page.evaluate("document.getElementById('api-key').value") == key
    assert page.console_errors == []
    allowed = set() if voice_list_exists(api_paths) else {f"{gateway.url}/v1/voices"}  # its 404 until it lands
    assert {e.text.rsplit(" ", 1)[-1] for e in page.network_errors} <= allowed, page.network_errors


async def test_the_voice_picker_lists_the_base_voices(page, key, api_paths):
    if not voice_list_exists(api_paths):
        pytest.skip("GET /v1/voices is not in this gateway's OpenAPI schema yet: the page asks for a typed name")
    await use_key(page, key)
    options = await page.evaluate("Array.from(document.querySelectorAll('#voice-options option'), o => o.value)")
    assert {"tara", "leo"} <= set(options)
    assert (await text_of(page, "voices-status")).startswith(f"{len(options)} voices: ")
    assert await page.evaluate("document.getElementById('voice').value") in options
    assert page.console_errors == [] and page.network_errors == []


async def test_a_line_streams_and_plays_before_the_response_ends(page, gateway, key):
    await use_key(page, key)
    await page.evaluate(f"document.getElementById('voice').value = 'tara';"
                        f"document.getElementById('text').value = {js(LINE)};"
                        f"document.getElementById('seed').value = '{SEED}';"
                        f"document.getElementById('max-tokens').value = '{MAX_TOKENS}';"
                        "document.getElementById('speak').click()")
    state = await page.wait_for("['done', 'error'].includes(document.getElementById('speak-state').textContent) && "
                                "document.getElementById('speak-state').textContent", timeout_s=180)
    assert state == "done", await text_of(page, "speak-error")
    # "done" means heard: every buffer had played when the state said so, and Stop was greyed out only then
    assert await text_of(page, "buffers-played") == await text_of(page, "buffers-scheduled")
    assert await page.evaluate("document.getElementById('stop').disabled") is True

    direct = httpx.post(f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {key}"}, timeout=180,
                        json={"model": "tts-1", "voice": "tara", "input": LINE, "response_format": "pcm",
                              "seed": SEED, "max_tokens": MAX_TOKENS})
    assert direct.status_code == 200
    samples = await number_of(page, "samples")
    assert samples == len(direct.content) // 2 > 0  # every sample of the stream reached the page
    assert await number_of(page, "audio-seconds") == pytest.approx(samples / 24000, abs=0.01)

    # the line's words were timed (SSE speech.alignment) and have all played: the caption holds each
    # word as written, once, in order, on the audio's clock, every one lit as said
    caption = await page.evaluate("Array.from(document.querySelectorAll('#caption span'), s => ({text: s.textContent, "
                                  "start: Number(s.dataset.start), end: Number(s.dataset.end), state: s.dataset.state}))")
    assert [w["text"] for w in caption] == [w.strip(",.") for w in LINE.split()]
    assert await text_of(page, "caption") == LINE  # the words, and the line's punctuation between them
    assert {w["state"] for w in caption} == {"said"}
    starts = [w["start"] for w in caption]
    assert starts == sorted(starts) and all(0 <= w["start"] <= w["end"] <= samples / 24000 + 0.01 for w in caption)
    # the stand-in's audio is noise, so the worker sends its estimate and the page says so
    assert "estimates" in await text_of(page, "caption-note")

    ttfb, started, done = [await number_of(page, i) for i in ("ttfb-ms", "play-started-ms", "response-done-ms")]
    chunks = await number_of(page, "chunks")
    assert 0 < ttfb < done and chunks > 1
    assert started < done, f"playback began {started} ms after the request, the response ended at {done} ms"

    scheduled = await number_of(page, "buffers-scheduled")
    assert scheduled >= chunks - 1 and scheduled > 1
    # Web Audio really played them: every scheduled buffer ended (the page counts `ended` events)
    assert await number_of(page, "buffers-played") == scheduled
    assert await page.evaluate("document.getElementById('speak-error').textContent") == ""
    assert page.console_errors == []
    assert not [e for e in page.network_errors if "/v1/audio/speech" in e.text]


async def test_a_worker_that_cannot_time_words_still_speaks_the_line(page, gateway, key):
    """The session's worker has an aligner, so its 500 `alignment_unavailable` is made in the page: the
    first request that asks for word timings gets the API's own error body; the page asks again
    without them (a real request to the real gateway), plays the line and says why there is no caption."""
    await use_key(page, key)
    await page.evaluate("(real => { window.fetch = (url, init) => (init && init.body && "
                        "JSON.parse(init.body).alignment === 'word' && !window.refusedOnce && (window.refusedOnce = true)) "
                        "? Promise.resolve(new Response(JSON.stringify({error: {message: 'no aligner', type: "
                        "'server_error', param: null, code: 'alignment_unavailable'}}), {status: 500})) "
                        ": real(url, init); })(window.fetch)")
    await page.evaluate("document.getElementById('voice').value = 'tara';"
                        "document.getElementById('text').value = 'One short line.';"
                        "document.getElementById('max-tokens').value = '21';"
                        "document.getElementById('speak').click()")
    state = await page.wait_for("['done', 'error'].includes(document.getElementById('speak-state').textContent) && "
                                "document.getElementById('speak-state').textContent", timeout_s=120)
    assert state == "done", await text_of(page, "speak-error")
    assert await page.evaluate("window.refusedOnce") is True
    assert await number_of(page, "samples") == 3 * 2048  # 21 tokens: three frames, all played
    assert await page.evaluate("document.querySelectorAll('#caption span').length") == 0
    assert "does not time words" in await text_of(page, "caption-note")
    assert await text_of(page, "speak-error") == ""


async def test_a_bad_key_shows_the_api_s_error_in_words(page, gateway):
    bad = "vr_this-key-was-never-issued"
    answer = httpx.post(f"{gateway.url}/v1/audio/speech", headers={"Authorization": f"Bearer {bad}"}, timeout=30,
                        json={"model": "tts-1", "voice": "tara", "input": "Hello.", "response_format": "pcm"})
    assert answer.status_code == 401
    code = answer.json()["error"]["code"]
    await use_key(page, bad)
    await page.evaluate("document.getElementById('voice').value = 'tara'; document.getElementById('speak').click()")
    shown = await page.wait_for("document.getElementById('speak-error').textContent", timeout_s=30)
    assert shown == "This key was not accepted. Check that you pasted the whole key, or ask for a new one."
    assert await page.evaluate("document.getElementById('speak-error').dataset.code") == code  # the API's own
    assert "Bearer" not in shown and answer.json()["error"]["message"] != shown
    assert await text_of(page, "speak-state") == "error"
    assert await text_of(page, "samples") == "0"
    assert page.console_errors == []


@pytest.fixture
def manifest(creator_corpus, tmp_path):
    """The 32 espeak-ng sentences' transcripts (~65 s of speech: over the 60 s a clone needs)."""
    path = tmp_path / "transcripts.json"
    path.write_text(json.dumps({clip.path.name: clip.transcript for clip in creator_corpus}))
    return path


async def test_an_upload_shows_its_progress_then_the_training_state(page, gateway, key, api_paths, creator_corpus,
                                                                    manifest):
    if "POST" not in api_paths.get("/v1/voices", set()):
        pytest.skip("POST /v1/voices is not in this gateway's OpenAPI schema yet (voice cloning not built)")
    name = "page-clone"
    await use_key(page, key)
    await page.evaluate(f"document.getElementById('clone-name').value = {js(name)};"
                        "document.getElementById('consent-kind-statement').click();"  # a statement tenant
                        "document.getElementById('clone-consent').value = "
                        "'I am the speaker in these recordings and agree to a clone of my voice.'")
    await page.set_files("#clone-files", [clip.path for clip in creator_corpus])
    await page.set_files("#clone-transcripts", [manifest])
    assert await page.evaluate("document.getElementById('clone-files').files.length") == len(creator_corpus)
    try:
        await page.evaluate("document.getElementById('clone-upload').click()")
        await page.wait_for("document.getElementById('upload-percent').textContent === '100' || "
                            "document.getElementById('clone-error').textContent", timeout_s=60)
        assert await text_of(page, "clone-error") == ""
        assert await page.evaluate("document.getElementById('upload-progress').value") == 100
        assert int(await page.evaluate("document.getElementById('upload-progress').dataset.events || '0'")) >= 1
        state = await page.wait_for(
            "(s => ['queued', 'preprocessing', 'training', 'validating', 'ready', 'failed'].includes(s) && s)"
            "(document.getElementById('train-state').textContent) || "
            "(document.getElementById('clone-error').textContent && 'error')", timeout_s=30)
        assert state not in ("error", "failed"), (await text_of(page, "clone-error"), await text_of(page, "train-reason"))
        answer = httpx.get(f"{gateway.url}/v1/voices/{name}", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert answer.status_code == 200 and answer.json()["state"] == state
        await page.evaluate("document.getElementById('voices-refresh').click()")  # the clone joins the picker
        listed = await page.wait_for(f"(o => o && o.dataset.state)(document.querySelector('#voice-options option[value={js(name)}]'))")
        assert listed == state
        assert page.console_errors == []
    finally:  # the training job is not this test's business: cancel it
        httpx.delete(f"{gateway.url}/v1/voices/{name}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


STATEMENT = "I am the speaker in these recordings and agree to a clone of my voice."


def clone_api(api_paths) -> None:
    if "POST" not in api_paths.get("/v1/voices/consent", set()):
        pytest.skip("POST /v1/voices/consent is not in this gateway's OpenAPI schema yet (spoken consent not built)")


async def upload_from_page(page) -> None:
    await page.evaluate("document.getElementById('clone-upload').click()")
    await page.wait_for("!document.getElementById('clone-upload').disabled", timeout_s=90)  # answered


async def text_of_first(page, selector: str) -> str:
    return await page.evaluate(f"document.querySelector({js(selector)}).textContent")


async def items(page, container_id: str) -> list[dict]:
    return await page.evaluate(f"Array.from(document.querySelectorAll('#{container_id} li'), li => "
                               "({level: li.dataset.level, file: li.dataset.file || null, text: li.textContent}))")


async def test_a_spoken_consent_tenant_clones_from_the_page_with_a_recording_file(page, gateway, new_tenant, api_paths,
                                                                                 creator_corpus, tmp_path):
    clone_api(api_paths)
    _, key = await new_tenant(consent="spoken")
    name = "page-spoken"
    await use_key(page, key)
    await page.evaluate(f"document.getElementById('clone-name').value = {js(name)};"
                        "document.getElementById('consent-kind-statement').click();"
                        f"document.getElementById('clone-consent').value = {js(STATEMENT)}")
    await page.set_files("#clone-files", [clip.path for clip in creator_corpus])  # no transcripts: the job's ASR
    try:
        # typed text on a spoken account: the API's 400 consent_policy switches the page and says why
        await upload_from_page(page)
        assert "consent policy is spoken" in await text_of(page, "clone-error")
        assert await page.evaluate("document.getElementById('consent-policy').dataset.policy") == "spoken"
        assert "reads a one-time phrase aloud" in await text_of(page, "consent-policy")
        assert await page.evaluate("document.getElementById('consent-kind-spoken').checked")
        assert await page.evaluate("document.getElementById('consent-spoken').hidden") is False

        await page.evaluate("document.getElementById('consent-ask').click()")
        state = await page.wait_for("(e => e.dataset.state !== 'asking' && e.dataset.state !== 'none' && "
                                    "e.dataset.state)(document.getElementById('consent-state'))")
        assert state == "issued", await text_of(page, "consent-state")
        assert f"phrase for '{name}'" in await text_of(page, "consent-state")
        assert "left)" in await text_of(page, "consent-state")  # its expiry, counted down
        text = await text_of(page, "consent-text")
        assert text.startswith("I consent to ")
        phrase = text.rsplit("My words are: ", 1)[1].rstrip(".").replace(",", "")
        assert text_to_read(phrase) == text

        reading = synthesize(text, CREATOR_VOICE, tmp_path / "my-consent.wav", word_gap_ms=LIST_WORD_GAP_MS)  # the creator's own voice
        seconds = sf.info(str(reading)).duration
        await page.set_files("#consent-file", [reading])
        chosen = await page.wait_for("(e => e.dataset.state === 'chosen' && e.textContent)"
                                     "(document.getElementById('consent-recording'))")
        assert chosen.startswith("chosen: my-consent.wav, ") and chosen.endswith(" s")
        assert float(chosen.split(", ")[1][:-2]) == pytest.approx(seconds, abs=0.051)  # its length, as decoded

        await upload_from_page(page)
        assert await text_of(page, "clone-error") == ""
        assert await text_of(page, "train-state") == "queued"  # the 202's state
        assert (await text_of(page, "consent-state")).startswith(f"used by the upload of '{name}'")
        voice = httpx.get(f"{gateway.url}/v1/voices/{name}", headers={"Authorization": f"Bearer {key}"},
                          timeout=10).json()
        assert voice["state"] not in ("failed", "ready"), voice  # no trainer here: it stays queued
        findings = voice["checks"]["findings"]
        assert findings  # the clean corpus is short of 8 minutes: a speech_amount warning at least
        await page.wait_for("document.querySelectorAll('#train-checks li').length > 0")
        shown = await items(page, "train-checks")
        assert sorted((i["level"], i["file"], i["text"]) for i in shown) == sorted(
            (f["level"], f["file"], f["message"]) for f in findings)
        assert page.console_errors == []
    finally:
        httpx.delete(f"{gateway.url}/v1/voices/{name}", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def clipped(samples: np.ndarray, share: float) -> np.ndarray:
    """The loudest `share` of the samples pushed to full scale (clipped, under ingest's 1 % refusal)."""
    out = samples.copy()
    loudest = np.argsort(np.abs(out.astype(np.int32)))[-int(share * out.size):]
    out[loudest] = np.where(out[loudest] >= 0, 32767, -32768)
    return out


async def test_a_faulty_upload_shows_every_finding_and_a_statement_account_is_told_its_policy(
        page, gateway, new_tenant, api_paths, creator_corpus, manifest, tmp_path):
    clone_api(api_paths)
    _, key = await new_tenant(consent="statement")
    name = "page-faulty"
    bad = {creator_corpus[3].path.name, creator_corpus[10].path.name}
    folder = tmp_path / "takes"
    folder.mkdir()
    paths = []
    for clip in creator_corpus:
        path = folder / clip.path.name
        sf.write(str(path), clipped(clip.load(), 0.008) if path.name in bad else clip.load(), SAMPLE_RATE,
                 subtype="PCM_16")
        paths.append(path)
    await use_key(page, key)
    await page.evaluate(f"document.getElementById('clone-name').value = {js(name)};"
                        "document.getElementById('consent-ask').click()")  # the page's default: spoken
    await page.wait_for("document.getElementById('consent-policy').dataset.policy")
    assert await page.evaluate("document.getElementById('consent-policy').dataset.policy") == "statement"
    assert "typed consent statement" in await text_of(page, "consent-policy")
    assert await page.evaluate("document.getElementById('consent-statement').hidden") is False

    await page.evaluate(f"document.getElementById('clone-consent').value = {js(STATEMENT)}")
    await page.set_files("#clone-files", paths)
    await page.set_files("#clone-transcripts", [manifest])
    await upload_from_page(page)
    assert (await text_of(page, "clone-error")).startswith("the recordings cannot make a good clone")

    # the same upload straight to the API: the findings the page had to show
    parts = [("files", (p.name, p.read_bytes(), "audio/wav")) for p in paths]
    parts.append(("transcripts", ("transcripts.json", manifest.read_bytes(), "application/json")))
    direct = httpx.post(f"{gateway.url}/v1/voices", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                        data={"name": name, "consent": STATEMENT}, files=parts)
    assert direct.status_code == 400 and direct.json()["error"]["code"] == "upload_checks", direct.text
    findings = direct.json()["error"]["findings"]
    assert {f["file"] for f in findings} == bad
    shown = await items(page, "clone-findings")
    assert sorted((i["level"], i["file"], i["text"]) for i in shown) == sorted(
        (f["level"], f["file"], f["message"]) for f in findings)
    assert (await text_of_first(page, "#clone-findings h3")).startswith("Must be fixed")  # blocks first
    assert await text_of(page, "train-state") == "–"
    assert page.console_errors == []
