"""Transcripts files are bounded before they are parsed: too many bytes, JSON nested too deep, a CSV
field over csv's own limit, a file that is not UTF-8 are each a TranscriptError saying what to do,
never a RecursionError, csv.Error or a whole oversized file read into memory."""

import json
from pathlib import Path

import pytest

from lora_training.errors import TranscriptError
from lora_training.transcripts import MAX_JSON_DEPTH, MAX_TRANSCRIPTS_BYTES, load, nests_deeper


def _audio(tmp_path: Path, *names: str) -> list[Path]:
    paths = [tmp_path / n for n in names]
    for p in paths:
        p.write_bytes(b"")
    return paths


@pytest.mark.parametrize("body, words", [
    ("[" * 200_000, f"more than {MAX_JSON_DEPTH} levels deep"),
    ('{"a.wav": ' + "[" * 5_000 + "]" * 5_000 + "}", f"more than {MAX_JSON_DEPTH} levels deep"),
    ('{"a.wav": "' + "x" * (MAX_TRANSCRIPTS_BYTES + 1) + '"}', f"larger than {MAX_TRANSCRIPTS_BYTES} bytes"),
])
def test_an_oversized_or_deeply_nested_json_manifest_is_refused_clearly(tmp_path, body, words):
    manifest = tmp_path / "t.json"
    manifest.write_text(body)
    with pytest.raises(TranscriptError, match=words):
        load(manifest, _audio(tmp_path, "a.wav"), allow_missing=False)


def test_nesting_within_the_limit_and_brackets_inside_strings_are_fine(tmp_path):
    manifest = tmp_path / "t.json"
    manifest.write_text(json.dumps([{"audio": "a.wav", "text": "[[[[ {{{{ \\\" ]]", "meta": [[{"x": [1]}]]}]))
    assert load(manifest, _audio(tmp_path, "a.wav"), allow_missing=False).texts == {"a.wav": "[[[[ {{{{ \\\" ]]"}
    assert not nests_deeper('"\\"[[[["', 1) and nests_deeper("[[]]", 1) and not nests_deeper("[[]]", 2)


def test_a_csv_field_over_the_csv_limit_and_a_non_utf8_or_oversized_sidecar_are_refused(tmp_path):
    audio = _audio(tmp_path, "a.wav")
    manifest = tmp_path / "t.csv"
    manifest.write_text("audio,text\na.wav," + "y" * 200_000 + "\n")  # csv's default field limit is 131072
    with pytest.raises(TranscriptError, match="not a readable CSV/TSV manifest"):
        load(manifest, audio, allow_missing=False)
    sidecar = tmp_path / "a.txt"
    sidecar.write_bytes(b"\xff\xfe caf\xe9")
    with pytest.raises(TranscriptError, match="not UTF-8 text"):
        load(None, audio, allow_missing=False)
    sidecar.write_bytes(b"x" * (MAX_TRANSCRIPTS_BYTES + 1))
    with pytest.raises(TranscriptError, match="larger than"):
        load(None, audio, allow_missing=False)
