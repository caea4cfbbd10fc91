"""The ASR seam: files without a transcript are cut at pauses and transcribed by the backend.

faster-whisper cannot run here (no model can be downloaded), so the backend is a stand-in that
answers from the known espeak-ng sentence list; everything around it is the real pipeline.
"""

import json

import pytest

from lora_training.asr import make_asr
from lora_training.errors import ConfigError
from lora_training.preprocess import preprocess
from lora_training.settings import DataParams


class ListeningAsr:
    """Returns the next expected sentence for each clip it is asked about, and counts the calls."""

    name = "test-double"

    def __init__(self, sentences: list[str]) -> None:
        self.sentences = list(sentences)
        self.calls = 0

    def transcribe(self, audio) -> str:
        self.calls += 1
        return self.sentences.pop(0) if self.sentences else ""


def test_files_without_transcripts_are_transcribed_by_the_backend(uploads, tmp_path, speech_corpus):
    given = {name: text for name, text in uploads.texts.items() if name != uploads.long_file.name}
    manifest = tmp_path / "partial.json"
    manifest.write_text(json.dumps(given))
    long_sentences = [c.transcript for c in speech_corpus[8:20]]
    asr = ListeningAsr(long_sentences)
    made = []
    clip_set = preprocess(uploads.audio, manifest, DataParams(min_speech_s=30.0, clip_min_s=1.0),
                          asr=lambda: made.append(asr) or asr)
    assert made == [asr] and asr.calls == 12  # loaded once, one call per pause-cut piece of the long take
    from_long = [c for c in clip_set.clips if c.source == uploads.long_file.name]
    assert [c.text for c in from_long] == long_sentences
    assert clip_set.report["transcribed_files"] == [uploads.long_file.name]


def test_asr_settings_errors_are_clear(train_settings, tmp_path):
    assert make_asr(train_settings) is None
    with pytest.raises(ConfigError, match="does not exist"):
        make_asr(train_settings.model_copy(update={"asr_model": tmp_path / "nowhere"}))
    (tmp_path / "model").mkdir()
    try:
        import faster_whisper  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="pip install faster-whisper"):
            make_asr(train_settings.model_copy(update={"asr_model": tmp_path / "model"}))
