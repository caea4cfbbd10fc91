"""The gateway's upload checks through a real `voicering gateway` process: a faulty upload is one 400
(`upload_checks`) listing every block with its file and time; a clean upload with a warn-level
fault is queued and its warnings and fixes are the voice's `checks` in GET /v1/voices/{name}.

Speech: the session's espeak-ng corpus (32 sentences, ~65 s of speech), faults made here. No
trainer consumes the session gateway's queue, so accepted clones stay queued."""

from __future__ import annotations

import io
import json
import re

import httpx
import numpy as np
import soundfile as sf

from lora_training.quality.thresholds import CheckThresholds
from tests.fixtures.speech import SAMPLE_RATE

CONSENT = "I, the speaker in these recordings, agree that this account may train and serve a clone of my voice."


def wav_bytes(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def clamped(samples: np.ndarray, share: float) -> np.ndarray:
    """The loudest `share` of the samples pushed to full scale (a clipped take, under ingest's 1 %)."""
    out = samples.copy()
    loudest = np.argsort(np.abs(out.astype(np.int32)))[-int(share * out.size):]
    out[loudest] = np.where(out[loudest] >= 0, 32767, -32768)
    return out


def post(gateway, key: str, name: str, files: list[tuple[str, bytes]], manifest: bytes) -> httpx.Response:
    parts = [("files", (filename, content, "audio/wav")) for filename, content in files]
    parts.append(("transcripts", ("transcripts.json", manifest, "application/json")))
    return httpx.post(f"{gateway.url}/v1/voices", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      data={"name": name, "consent": CONSENT}, files=parts)


def corpus_files(creator_corpus) -> tuple[list[tuple[str, np.ndarray]], bytes]:
    files = [(clip.path.name, clip.load()) for clip in creator_corpus]
    manifest = json.dumps({clip.path.name: clip.transcript for clip in creator_corpus}).encode()
    return files, manifest


async def test_a_faulty_upload_is_one_400_listing_every_block_with_file_and_time(gateway, new_tenant, creator_corpus):
    _, key = await new_tenant()
    files, manifest = corpus_files(creator_corpus)
    bad = {files[3][0], files[10][0]}
    sent = [(name, wav_bytes(clamped(samples, 0.008) if name in bad else samples)) for name, samples in files]

    response = post(gateway, key, "clipped", sent, manifest)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("upload_checks", "files")
    findings = error["findings"]
    assert {(f["file"], f["code"], f["level"]) for f in findings} == {(name, "clipping", "block") for name in bad}
    for finding in findings:
        assert finding["file"] in finding["message"] and "input gain" in finding["message"]
        assert 0.0 <= finding["start_s"] <= finding["end_s"]
        assert finding["limit"] == 100 * CheckThresholds().block_clipped_fraction
    assert all(name in error["message"] for name in bad)
    voices = httpx.get(f"{gateway.url}/v1/voices", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    assert "clipped" not in [v["id"] for v in voices["data"]]  # refused: nothing registered


async def test_warnings_of_an_accepted_upload_are_the_voices_checks(gateway, new_tenant, creator_corpus):
    _, key = await new_tenant()
    files, manifest = corpus_files(creator_corpus)
    pop_name, pop = files[5]
    pop = pop.copy()
    at = int(np.argmax(np.abs(pop.astype(np.int32))))
    pop[at:at + 5] = 32767  # five samples held at full scale: a warning, not a block
    gap_name, gap = files[8]
    gap = np.concatenate([gap, np.zeros(12 * SAMPLE_RATE, np.int16)])  # 12 s of silence after the sentence
    changed = {pop_name: pop, gap_name: gap}
    sent = [(name, wav_bytes(changed.get(name, samples))) for name, samples in files]

    response = post(gateway, key, "warned", sent, manifest)
    assert response.status_code == 202, response.text
    assert response.json()["checks"]["findings"]

    voice = httpx.get(f"{gateway.url}/v1/voices/warned", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    checks = voice.json()["checks"]
    assert checks["thresholds_version"] == CheckThresholds().version
    found = {(f["code"], f["level"], f["file"]): f for f in checks["findings"]}
    assert set(found) == {("clipping", "warn", pop_name), ("long_silence", "fixed", gap_name),
                          ("silence_share", "fixed", gap_name), ("speech_amount", "warn", None)}
    clip = found[("clipping", "warn", pop_name)]
    assert abs(clip["start_s"] - at / SAMPLE_RATE) < 0.01 and clip["value"] == 5
    silence = found[("long_silence", "fixed", gap_name)]
    assert silence["end_s"] - silence["start_s"] >= 12.0 and gap_name in silence["message"]


async def test_a_text_file_named_wav_is_refused_in_the_creators_words_and_the_details_are_logged(
        gateway, new_tenant, creator_corpus):
    """Issue 25: the 400 for a renamed text file showed the server's upload path (with its upload id)
    and the decoders' exception names. The answer names the creator's file and what to do; the
    decoders' words go to the gateway's log under the trace id the answer carries."""
    tenant, key = await new_tenant()
    files, manifest = corpus_files(creator_corpus)
    notes = b"Shopping list: eggs, flour, two lemons.\nCall the studio on Monday.\n" * 20
    sent = [(name, wav_bytes(samples)) for name, samples in files] + [("my notes.wav", notes)]
    texts = {**json.loads(manifest), "my notes.wav": "Shopping list."}

    response = post(gateway, key, "renamed", sent, json.dumps(texts).encode())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("bad_audio", "files")
    message = error["message"]
    assert message.startswith("my notes.wav: not a readable audio file")
    assert "export the recording as wav, flac, mp3, ogg/opus or m4a" in message
    assert "/" not in message.replace("ogg/opus", "") and str(gateway.uploads) not in message
    assert "/tmp" not in response.text and str(tenant.id) not in response.text
    for word in ("Error", "InvalidData", "soundfile", "PyAV", "Errno", ".incoming"):
        assert word not in response.text, word
    assert not [m for m in re.findall(r"[0-9a-f]{32}", response.text)]  # no upload id (uuid4 hex folder)

    trace_id = response.headers["x-voicering-trace-id"]
    logged = [line for line in gateway.log_path.read_text().splitlines() if trace_id in line]
    assert len(logged) == 1 and "my notes.wav" in logged[0] and "Format not recognised" in logged[0], logged
    assert "InvalidDataError" in logged[0] and str(gateway.uploads) in logged[0]
