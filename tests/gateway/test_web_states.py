"""The web page's states tell the truth (issue 25), in a real headless Chromium against the session's
real gateway and worker: a refused upload stays refused while an earlier clone is polled; Stop and the
state line follow playback, not the download, with a waveform, a buffer gauge and a playable,
downloadable history of the session's lines; "My voices" comes from the API and survives a reload;
the keyboard alone speaks and stops; nothing is sent that the API would refuse; errors are said in
words, without the API's or the server's, and fit a 400 px screen.

Real input where it matters: keys and clicks go through DevTools' Input domain (the browser's own
event path: focus moves, `change` fires), not through JS `click()`. With VOICERING_WEB_SCREENSHOTS
set to a folder, the main states are saved there as PNGs (docs/web/ holds the ones docs/web.md shows).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import re

import httpx
import pytest

STATEMENT = "I am the speaker in these recordings and agree to a clone of my voice."
LONG_LINE = ("The birch canoe slid on the smooth planks. Glue the sheet to the dark blue background. "
             "It is easy to tell the depth of a well. These days a chicken leg is a rare dish.")
KEYS = {"Enter": ("Enter", 13), "Escape": ("Escape", 27)}


def js(value) -> str:
    return json.dumps(value)


@pytest.fixture
def manifest(creator_corpus, tmp_path):
    path = tmp_path / "transcripts.json"
    path.write_text(json.dumps({clip.path.name: clip.transcript for clip in creator_corpus}))
    return path


async def shot(page, name: str, first: str, last: str) -> None:
    """Save the part of the page from element `first` to element `last` (selectors), when
    VOICERING_WEB_SCREENSHOTS names a folder: the states docs/web.md shows."""
    folder = os.environ.get("VOICERING_WEB_SCREENSHOTS")
    if not folder:
        return
    clip = await page.evaluate(
        f"(([a, b]) => ({{x: 0, y: a.top + scrollY - 8, width: document.documentElement.clientWidth, "
        f"height: b.bottom - a.top + 16, scale: 1}}))([document.querySelector({js(first)}).getBoundingClientRect(), "
        f"document.querySelector({js(last)}).getBoundingClientRect()])")
    png = await page.send("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True})
    Path(folder, f"{name}.png").write_bytes(base64.b64decode(png["data"]))


async def press(page, key: str, *, ctrl: bool = False) -> None:
    """A real key press (keydown, then keyup); Enter without Ctrl also types "\\r" (activates a button)."""
    code, vk = KEYS[key]
    base = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": 2 if ctrl else 0}
    down = {"type": "keyDown", "text": "\r"} if key == "Enter" and not ctrl else {"type": "rawKeyDown"}
    await page.send("Input.dispatchKeyEvent", {**down, **base})
    await page.send("Input.dispatchKeyEvent", {"type": "keyUp", **base})


async def click(page, selector: str) -> None:
    """A real mouse click at the element's centre (it takes the focus, as a user's click does)."""
    x, y = await page.evaluate(f"(e => {{ e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); "
                               "return [r.x + r.width / 2, r.y + r.height / 2]; })"
                               f"(document.querySelector({js(selector)}))")
    for kind in ("mousePressed", "mouseReleased"):
        await page.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})


async def type_into(page, element_id: str, text: str) -> None:
    await page.evaluate(f"document.getElementById({js(element_id)}).focus()")
    await page.send("Input.insertText", {"text": text})


async def text_of(page, element_id: str) -> str:
    return await page.evaluate(f"document.getElementById({js(element_id)}).textContent")


async def requests_to(page, path: str) -> int:
    """Requests the page has made to `path` (fetch and XHR alike), from the browser's resource timing."""
    return await page.evaluate(f"performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname === "
                               f"{js(path)}).length")


async def use_key(page, key: str) -> None:
    await page.evaluate(f"document.getElementById('api-key').value = {js(key)}; "
                        "document.getElementById('key-use').click()")
    await page.wait_for("(t => t && !t.startsWith('loading'))(document.getElementById('voices-status').textContent)")


SAID = "document.querySelectorAll('#caption span[data-state=said]').length"


async def caption_states(page) -> str:
    """The caption's words as letters: s(aid), n(ow), a(head)."""
    return await page.evaluate("Array.from(document.querySelectorAll('#caption span'), s => s.dataset.state[0]).join('')")


async def fits_400_px(page) -> None:
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"the page is {width} px wide on a 400 px screen"


async def clone_form(page, name: str, files: list[Path], manifest: Path | None = None) -> None:
    await page.evaluate(f"document.getElementById('clone-name').value = {js(name)};"
                        "document.getElementById('consent-kind-statement').click();"
                        f"document.getElementById('clone-consent').value = {js(STATEMENT)}")
    await page.set_files("#clone-files", files)
    if manifest is not None:
        await page.set_files("#clone-transcripts", [manifest])


async def upload_from_page(page) -> None:
    """Click Upload and wait for its answer. The button is disabled while the upload is in flight;
    a refusal can come and go between two polls of a loaded box (the page answered a 429 and
    enabled the button again while the test still waited to see it disabled: seen beside two CPU
    burners), so an observer notes the moment it was disabled at all."""
    await page.evaluate("""(() => {
        const button = document.getElementById('clone-upload');
        window.uploadWasSent = false;
        new MutationObserver((records, observer) => {
            if (records.some(r => r.oldValue === null)) { window.uploadWasSent = true; observer.disconnect(); }
        }).observe(button, {attributes: true, attributeFilter: ['disabled'], attributeOldValue: true});
        button.click();
    })()""")
    await page.wait_for("window.uploadWasSent", timeout_s=10)
    await page.wait_for("!document.getElementById('clone-upload').disabled", timeout_s=120)  # answered


async def row_states(page) -> dict[str, str]:
    return await page.evaluate("Object.fromEntries(Array.from(document.querySelectorAll('#my-voices tbody tr'), "
                               "r => [r.dataset.voice, r.dataset.state]))")


async def test_a_refused_upload_stays_refused_and_my_voices_survives_a_reload(page, gateway, new_tenant,
                                                                               creator_corpus, manifest):
    _, key = await new_tenant(max_training_jobs=1)
    auth = {"Authorization": f"Bearer {key}"}
    await use_key(page, key)
    assert "no voices of your own yet" in await text_of(page, "my-voices-status")
    files = [clip.path for clip in creator_corpus]
    try:
        await clone_form(page, "page-first", files, manifest)
        await upload_from_page(page)
        assert await text_of(page, "clone-error") == ""
        assert await text_of(page, "train-state") == "queued"
        await page.wait_for("!!document.querySelector('#my-voices tr[data-voice=\"page-first\"]')")

        # a second clone while the first holds the account's one training slot: 429, and it stays said
        await clone_form(page, "page-second", files, manifest)
        await upload_from_page(page)
        assert await page.evaluate("document.getElementById('clone-error').dataset.code") == \
            "training_jobs_limit_exceeded"
        refused = await text_of(page, "clone-error")
        assert "this upload was refused and the voice was not created" in refused and "tenant" not in refused
        listed = await requests_to(page, "/v1/voices")
        await page.wait_for(f"performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname === "
                            f"'/v1/voices').length >= {listed + 2}", timeout_s=30)  # >= 4 s of polling since
        assert await text_of(page, "clone-error") == refused
        assert await text_of(page, "train-state") == "–"
        assert await text_of(page, "train-message") == "Not uploaded: the voice page-second was not created."
        assert await row_states(page) == {"page-first": "queued"}
        assert "queued: waiting for a trainer" in await page.evaluate(
            "document.querySelector('#my-voices tr[data-voice=\"page-first\"] .state').textContent")
        await shot(page, "refused-upload", "#clone-upload", "#voices-section")

        # the table is the API's, not the page's memory: a reload shows it again
        await page.goto(f"{gateway.url}/")
        await page.wait_for("!!document.querySelector('#my-voices tr[data-voice=\"page-first\"]')")
        assert await row_states(page) == {"page-first": "queued"}
        assert await text_of(page, "clone-error") == ""

        # Delete asks once more, then deletes through the API
        await click(page, '#my-voices tr[data-voice="page-first"] [data-action=delete]')
        await page.wait_for("document.querySelector('#my-voices [data-action=delete]').textContent === "
                            "'Really delete?'")
        await click(page, '#my-voices tr[data-voice="page-first"] [data-action=delete]')
        await page.wait_for("document.querySelectorAll('#my-voices tbody tr').length === 0", timeout_s=30)
        assert httpx.get(f"{gateway.url}/v1/voices/page-first", headers=auth, timeout=10).status_code == 404
        assert await text_of(page, "my-voices-error") == ""
        assert page.console_errors == []
    finally:
        for name in ("page-first", "page-second"):
            httpx.delete(f"{gateway.url}/v1/voices/{name}", headers=auth, timeout=30)


async def speak_long_line(page) -> None:
    await page.evaluate(f"document.getElementById('voice').value = 'tara';"
                        f"document.getElementById('text').value = {js(LONG_LINE)};"
                        "document.getElementById('seed').value = '3';"
                        "document.getElementById('max-tokens').value = '350';"  # 50 frames: ~4.3 s of audio,
                        "document.getElementById('speed').value = '0.25'")  # played over ~17 s: the download ends first


async def test_stop_works_while_downloaded_audio_still_plays(page, new_tenant):
    _, key = await new_tenant()
    await use_key(page, key)
    await speak_long_line(page)
    await click(page, "#speak")
    state = await page.wait_for("(s => ['playing', 'done', 'error'].includes(s) && s)"
                                "(document.getElementById('speak-state').textContent)", timeout_s=180)
    assert state == "playing", await text_of(page, "speak-error")
    # the whole response is in, audio is still queued: the line is not done and Stop still works
    assert await text_of(page, "response-done-ms") != "–"
    scheduled = int(await text_of(page, "buffers-scheduled"))
    assert int(await text_of(page, "buffers-played")) < scheduled
    assert await page.evaluate("document.getElementById('stop').disabled") is False
    assert "still playing" in await text_of(page, "speak-summary")
    assert float(await page.evaluate("document.getElementById('buffer-gauge').value")) > 0.2  # queued audio, shown
    drawn = ("(c => c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v, i) => i % 4 === 3 && v))"
             "(document.getElementById('waveform'))")
    assert await page.evaluate(drawn)

    # the caption lights the word being played: said, then the one playing, then the rest, and it moves
    words = len(LONG_LINE.split())
    await page.wait_for(f"document.querySelectorAll('#caption span').length === {words}")
    assert await page.evaluate("Array.from(document.querySelectorAll('#caption span'), s => s.textContent)") \
        == [w.strip(".") for w in LONG_LINE.split()]  # each word as written, once, in order
    said = await page.wait_for(f"(n => n > 0 && n < {words} && n)({SAID})", timeout_s=60)
    assert re.fullmatch(r"s*n?a*", await caption_states(page)), await caption_states(page)
    await page.wait_for(f"{SAID} > {said}", timeout_s=60)  # playback moved on, and the caption with it
    assert re.fullmatch(r"s*n?a*", await caption_states(page))
    await shot(page, "playing", "#speak-section", "#speak-section")

    await click(page, "#stop")
    assert await text_of(page, "speak-state") == "stopped"
    # frozen where the audio stopped: the words after it stay unsaid while the audio clock runs on
    stopped_at = await caption_states(page)
    assert "a" in stopped_at
    # (nothing to await here but time: 1.5 s of animation frames, over two words at speed 0.25)
    await page.evaluate("new Promise(r => { const t = performance.now(); "
                        "(function tick() { performance.now() > t + 1500 ? r() : requestAnimationFrame(tick); })(); })")
    assert await caption_states(page) == stopped_at
    assert await page.evaluate("document.getElementById('stop').disabled") is True
    assert await page.evaluate("document.activeElement.id") == "speak"  # the focus was on Stop: kept on the page

    # the line joins the session's history: what was received, playable, and a WAV to download
    samples = int(await text_of(page, "samples"))
    entry = await page.evaluate("(li => ({voice: li.dataset.voice, seconds: Number(li.dataset.seconds), "
                                "outcome: li.dataset.outcome, text: li.textContent}))"
                                "(document.querySelector('#history li'))")
    assert entry["voice"] == "tara" and entry["outcome"] == "stopped"
    assert entry["seconds"] == pytest.approx(samples / 24000, abs=0.001) and LONG_LINE[:40] in entry["text"]
    wav = await page.evaluate("fetch(document.querySelector('#history li a[download]').href).then(r => r.arrayBuffer())"
                              ".then(b => ({size: b.byteLength, head: String.fromCharCode(...new Uint8Array(b, 0, 4)),"
                              " rate: new DataView(b).getUint32(24, true)}))")
    assert wav == {"size": 44 + 2 * samples, "head": "RIFF", "rate": 24000}
    duration = await page.evaluate("(a => new Promise(r => { a.onloadedmetadata = () => r(a.duration); a.preload = "
                                   "'metadata'; a.load(); }))(document.querySelector('#history li audio'))")
    assert duration == pytest.approx(samples / 24000, abs=0.01)  # the browser decodes it: playable
    assert page.console_errors == []


async def test_the_keyboard_alone_speaks_and_stops(page, new_tenant):
    _, key = await new_tenant()
    await use_key(page, key)
    await speak_long_line(page)
    await page.evaluate("document.getElementById('text').focus()")
    await press(page, "Enter", ctrl=True)
    await page.wait_for("['streaming', 'playing'].includes(document.getElementById('speak-state').textContent)",
                        timeout_s=120)
    await press(page, "Escape")
    assert await text_of(page, "speak-state") == "stopped"
    assert await page.evaluate("document.getElementById('stop').disabled") is True

    # Stop reached with the keyboard: Enter on it stops, and the focus moves to Speak, not to nowhere
    await press(page, "Enter", ctrl=True)
    await page.wait_for("['streaming', 'playing'].includes(document.getElementById('speak-state').textContent)",
                        timeout_s=120)
    await page.evaluate("document.getElementById('stop').focus()")
    await press(page, "Enter")
    await page.wait_for("document.getElementById('speak-state').textContent === 'stopped'")
    assert await page.evaluate("document.activeElement.id") == "speak"
    assert await page.evaluate("document.getElementById('speak-state').closest('[aria-live=polite]') !== null")
    assert await page.evaluate("document.getElementById('train-state').closest('[aria-live=polite]') !== null")
    assert page.console_errors == []


async def test_nothing_the_api_would_refuse_is_sent(page, gateway, new_tenant, tmp_path):
    _, key = await new_tenant()
    await use_key(page, key)
    limit = httpx.get(f"{gateway.url}/openapi.json", timeout=10).json()[
        "components"]["schemas"]["SpeechRequest"]["properties"]["input"]["maxLength"]
    await page.wait_for(f"document.getElementById('text-count').textContent.endsWith('/ {limit} characters')")

    cases = [("document.getElementById('voice').value = ''", "Pick a voice first."),
             ("document.getElementById('voice').value = 'tara'; document.getElementById('text').value = '   '",
              "Type something for the voice to say."),
             (f"document.getElementById('text').value = 'a'.repeat({limit + 1});"
              "document.getElementById('text').dispatchEvent(new Event('input'))",
              f"The text is {limit + 1} characters; one line can have at most {limit}.")]
    for setup, said in cases:
        await page.evaluate(setup)
        await click(page, "#speak")
        assert (await text_of(page, "speak-error")).startswith(said)
    assert await page.evaluate("document.getElementById('text-count').dataset.over") == "true"

    notes = tmp_path / "notes.pdf"
    notes.write_bytes(b"%PDF-1.4 not a recording")
    await clone_form(page, "page-checked", [notes])
    await click(page, "#clone-upload")
    assert (await text_of(page, "clone-error")).startswith("notes.pdf: not recordings. Pick audio files")
    assert await requests_to(page, "/v1/audio/speech") == 0
    assert await requests_to(page, "/v1/voices") == 1  # the listing when the key was used; no upload
    assert page.console_errors == []


async def test_a_bad_key_is_said_in_words_and_forgotten_once_a_good_key_is_used(page, new_tenant):
    _, key = await new_tenant()
    await type_into(page, "api-key", "vr_this-key-was-never-issued")
    await click(page, "#key-use")
    said = await page.wait_for("document.getElementById('key-error').textContent")
    assert said == "This key was not accepted. Check that you pasted the whole key, or ask for a new one."
    await page.evaluate("document.getElementById('voice').value = 'tara'")
    await click(page, "#speak")
    await page.wait_for("document.getElementById('speak-error').dataset.code === 'invalid_api_key'")
    assert await text_of(page, "speak-error") == said

    # the key fixed the way a person does it (typed, then Use key clicked): one listing, old errors gone
    await page.evaluate("document.getElementById('api-key').value = ''")
    await type_into(page, "api-key", key)
    before = await requests_to(page, "/v1/voices")
    await click(page, "#key-use")
    await page.wait_for("document.getElementById('voices-status').textContent.includes('voices: ')")
    await page.evaluate("new Promise(r => setTimeout(r, 500))")  # a second listing would have answered by now
    assert await requests_to(page, "/v1/voices") == before + 1
    assert await text_of(page, "key-error") == "" and await text_of(page, "speak-error") == ""
    assert page.console_errors == []


async def test_a_renamed_text_file_is_refused_in_words_that_fit_a_400_px_screen(page, gateway, new_tenant, tmp_path):
    _, key = await new_tenant()
    await page.send("Emulation.setDeviceMetricsOverride", {"width": 400, "height": 900, "deviceScaleFactor": 1,
                                                           "mobile": False})
    try:
        await use_key(page, key)
        name = "studio-session-of-tuesday-morning-take-number-seventeen-final-final-really-final-version.wav"
        fake = tmp_path / name
        fake.write_text("Shopping list: eggs, flour, two lemons. Call the studio on Monday.\n" * 30)
        await clone_form(page, "page-renamed", [fake])
        await page.evaluate("document.getElementById('clone-transcript-text').value = 'Hello there.'")
        await upload_from_page(page)
        said = await text_of(page, "clone-error")
        assert said.startswith(f"{name}: not a readable audio file"), said
        for leak in ("/tmp", str(gateway.uploads), "Error", "InvalidData", "soundfile", "PyAV"):
            assert leak not in said, leak
        assert await page.evaluate("document.getElementById('clone-error').dataset.code") == "bad_audio"
        await fits_400_px(page)
        await page.evaluate(f"document.getElementById('text').value = 'a'.repeat(5000);"
                            "document.getElementById('text').dispatchEvent(new Event('input'))")
        await click(page, "#speak")  # the longest message the page writes itself
        assert (await text_of(page, "speak-error")).startswith("The text is 5000 characters")
        await fits_400_px(page)
        await shot(page, "narrow-400px-errors", "#speak-section", "#clone-findings")
        assert page.console_errors == []
    finally:
        await page.send("Emulation.clearDeviceMetricsOverride")


@pytest.fixture
async def tenants(redis_url):
    from gateway.tenants import Tenants, connect_redis
    from tests.fixtures.gateway import GATEWAY_TENANT_PREFIX

    redis = connect_redis(redis_url, timeout_s=2.0)
    yield Tenants(redis, GATEWAY_TENANT_PREFIX)
    await redis.aclose()


async def test_my_voices_follows_several_clones_from_the_api_and_tries_a_failed_one_again(page, gateway, new_tenant,
                                                                                         tenants):
    tenant, key = await new_tenant()
    why = "take-03.wav: the transcript does not follow the audio; check that it belongs to this file"
    await tenants.register_voice(tenant, "page-warm", consent=STATEMENT, state="warming")  # validating, 99 %
    await tenants.register_voice(tenant, "page-failed", consent=STATEMENT, state="failed", note=why)
    await use_key(page, key)
    await page.wait_for("document.querySelectorAll('#my-voices tbody tr').length === 2")
    assert await row_states(page) == {"page-warm": "validating", "page-failed": "failed"}
    failed_row = "document.querySelector('#my-voices tr[data-voice=\"page-failed\"]')"
    assert why in await page.evaluate(f"{failed_row}.querySelector('.state').textContent")
    assert await page.evaluate(f"!!{failed_row}.querySelector('[data-action=again]')")
    assert await page.evaluate("document.querySelector('#my-voices tr[data-voice=\"page-warm\"] progress').value") == 99

    # the voice changes where the page cannot see it: the table follows the API while a clone is on its way
    await tenants.update_voice(tenant, "page-warm", state="ready")
    await page.wait_for("document.querySelector('#my-voices tr[data-voice=\"page-warm\"]').dataset.state === 'ready'",
                        timeout_s=30)
    await page.wait_for("!!document.querySelector('#voice-options option[value=\"page-warm\"]')")  # and the picker
    await click(page, '#my-voices tr[data-voice="page-warm"] [data-action=use]')  # a ready one: speak with it
    assert await page.evaluate("document.getElementById('voice').value") == "page-warm"
    assert await page.evaluate("document.activeElement.id") == "text"

    await click(page, '#my-voices tr[data-voice="page-failed"] [data-action=again]')
    await page.wait_for("document.querySelectorAll('#my-voices tbody tr').length === 1", timeout_s=30)
    assert await page.evaluate("document.getElementById('clone-name').value") == "page-failed"
    assert await page.evaluate("document.activeElement.id") == "clone-files"  # pick the recordings again
    assert "page-failed" in await text_of(page, "train-message")
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{gateway.url}/v1/voices/page-failed", headers=auth, timeout=10).status_code == 404
    await shot(page, "my-voices", "#voices-section", "#voices-section")
    assert page.console_errors == []
