"""Given transcripts: manifests and sidecars, matched to uploads by file name; mismatches refused."""

import json
from pathlib import Path

import pytest

from lora_training.errors import TranscriptError
from lora_training.transcripts import load


def _audio(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / n for n in names]
    for p in paths:
        p.write_bytes(b"")
    return paths


def test_json_object_matches_by_name_or_stem(tmp_path):
    audio = _audio(tmp_path, "a.wav", "b.flac")
    manifest = tmp_path / "t.json"
    manifest.write_text(json.dumps({"a.wav": "first", "b": "second"}))
    assert load(manifest, audio, allow_missing=False).texts == {"a.wav": "first", "b.flac": "second"}


def test_json_list_and_csv_and_ljspeech(tmp_path):
    audio = _audio(tmp_path, "a.wav", "b.wav")
    listed = tmp_path / "t.json"
    listed.write_text(json.dumps([{"audio": "a.wav", "text": "one"}, {"file": "b.wav", "text": "two"}]))
    assert load(listed, audio, allow_missing=False).texts == {"a.wav": "one", "b.wav": "two"}
    csv_file = tmp_path / "t.csv"
    csv_file.write_text('audio,text\na.wav,"one, with comma"\nb.wav,two\n')
    assert load(csv_file, audio, allow_missing=False).texts["a.wav"] == "one, with comma"
    lj = tmp_path / "metadata.txt"
    lj.write_text("a|one raw|one\nb|two raw|two\n")
    assert load(lj, audio, allow_missing=False).texts == {"a.wav": "one", "b.wav": "two"}


def test_sidecar_text_files(tmp_path):
    audio = _audio(tmp_path, "a.wav")
    (tmp_path / "a.txt").write_text("sidecar text\n")
    assert load(None, audio, allow_missing=False).texts == {"a.wav": "sidecar text\n"}


def test_names_that_do_not_match_are_refused_with_both_lists(tmp_path):
    audio = _audio(tmp_path, "take1.wav", "take2.wav")
    manifest = tmp_path / "t.json"
    manifest.write_text(json.dumps({"take1.wav": "ok", "tkae2.wav": "typo"}))
    with pytest.raises(TranscriptError) as err:
        load(manifest, audio, allow_missing=False)
    assert "tkae2.wav" in err.value.message and "take2.wav" in err.value.message
    assert not err.value.retryable


def test_missing_transcripts_without_asr_say_how_to_provide_them(tmp_path):
    with pytest.raises(TranscriptError, match="no transcripts were given and no ASR"):
        load(None, _audio(tmp_path, "a.wav"), allow_missing=False)
    assert load(None, _audio(tmp_path, "b.wav"), allow_missing=True).missing == ("b.wav",)


def test_plain_text_describes_one_file_only(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello")
    with pytest.raises(TranscriptError, match="one file only"):
        load(text, _audio(tmp_path, "a.wav", "b.wav"), allow_missing=False)
