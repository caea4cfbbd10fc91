"""Given transcripts: read them and match them to the uploaded files by file name.

Accepted sources:

- no transcripts file: a sidecar ``<audio stem>.txt`` next to each audio file, where present;
- a JSON manifest: ``{"clip01.wav": "text", ...}`` or ``[{"audio": "clip01.wav", "text": "..."}]``;
- a CSV/TSV manifest with a header naming an audio column (``audio``, ``file``, ``path`` or
  ``file_name``) and a ``text`` column, or LJSpeech-style ``name|text`` lines without header;
- a plain ``.txt`` file when exactly one audio file is uploaded.

Names match on the file name (``clip01.wav``) or on the stem (``clip01``). A transcript that
names no uploaded file, or an upload without transcript, is an error listing both (uploads
without a transcript are left to ASR when an ASR backend is configured).

Every transcripts file is bounded before it is parsed: at most `MAX_TRANSCRIPTS_BYTES` bytes
(a manifest for 30 minutes of speech is ~30 kB) and, for JSON, arrays and objects nested at most
`MAX_JSON_DEPTH` deep; past either it is a TranscriptError (HTTP 400 at the gateway), never a
parser's recursion or memory failure.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lora_training.errors import TranscriptError

MAX_TRANSCRIPTS_BYTES: Final = 1024 * 1024  # one manifest or sidecar .txt
MAX_JSON_DEPTH: Final = 16  # {file: text} is 1 deep, [{audio, text}] 2; room for extra fields, far from recursion
_JSON_TOKEN = re.compile(r'\\.|["\[\]{}]', re.DOTALL)  # an escape, a quote or a bracket: one left-to-right scan

AUDIO_COLUMNS = ("audio", "file", "path", "file_name", "filename", "name")
HOW_TO = (
    "give --transcripts with a JSON ({\"file.wav\": \"text\"}) or CSV (audio,text) manifest, "
    "put a <name>.txt next to each audio file, or turn ASR on (VOICERING_TRAIN_ASR_MODEL: 'bundled', a "
    "faster-whisper model directory or a hub id)"
)


@dataclass(frozen=True)
class Matched:
    """Transcripts found for the uploads: file name -> raw text, and the uploads still without one."""

    texts: dict[str, str]
    missing: tuple[str, ...]


def read_manifest(path: Path, audio_names: list[str]) -> dict[str, str]:
    """Raw entries of a transcripts file: the name it gives -> text."""
    raw = _read_bounded(path, "transcripts file")
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _from_json(raw, path.name)
    if suffix in (".csv", ".tsv"):
        return _from_csv(raw, path.name, "\t" if suffix == ".tsv" else ",")
    if suffix == ".txt":
        first_line = raw.strip().splitlines()[0] if raw.strip() else ""
        if "|" in first_line:
            return _from_csv(raw, path.name, "|")
        if len(audio_names) != 1:
            raise TranscriptError(
                f"{path.name} is plain text but {len(audio_names)} audio files were uploaded: "
                "a plain-text transcript can describe one file only; use a JSON or CSV manifest"
            )
        return {audio_names[0]: raw}
    raise TranscriptError(f"transcripts file {path.name}: use .json, .csv, .tsv or .txt")


def _read_bounded(path: Path, what: str) -> str:
    """The file's text, read only up to the size limit (TranscriptError past it or when unreadable)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_TRANSCRIPTS_BYTES + 1)
    except OSError as err:
        raise TranscriptError(f"cannot read {what} {path.name} ({err.strerror or 'unreadable'})") from None
    if len(data) > MAX_TRANSCRIPTS_BYTES:
        raise TranscriptError(f"{what} {path.name} is larger than {MAX_TRANSCRIPTS_BYTES} bytes, the most a "
                              "transcripts file may hold: give only the file names and their texts")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TranscriptError(f"{what} {path.name} is not UTF-8 text: save it as UTF-8") from None


def nests_deeper(raw: str, limit: int) -> bool:
    """Whether arrays and objects in JSON text nest more than `limit` deep, without parsing it
    (brackets inside strings do not count). One linear scan, stopping at the first level too deep."""
    depth = 0
    in_string = False
    for token in _JSON_TOKEN.finditer(raw):
        t = token.group()
        if t == '"':
            in_string = not in_string
        elif in_string or t[0] == "\\":
            continue
        elif t in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def _from_json(raw: str, source: str) -> dict[str, str]:
    if nests_deeper(raw, MAX_JSON_DEPTH):
        raise TranscriptError(f"{source} nests arrays or objects more than {MAX_JSON_DEPTH} levels deep: a "
                              'manifest is {"file.wav": "text"} or [{"audio": "file.wav", "text": "..."}]')
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TranscriptError(f"{source} is not valid JSON: {err}") from None
    if isinstance(data, dict) and all(isinstance(v, str) for v in data.values()):
        return dict(data)
    if isinstance(data, list):
        out = {}
        for i, item in enumerate(data):
            name = next((item.get(k) for k in AUDIO_COLUMNS if isinstance(item, dict) and item.get(k)), None)
            text = item.get("text") if isinstance(item, dict) else None
            if not isinstance(name, str) or not isinstance(text, str):
                raise TranscriptError(f"{source}: entry {i} needs an 'audio' (file name) and a 'text' string")
            out[name] = text
        return out
    raise TranscriptError(f"{source}: expected an object {{file: text}} or a list of {{audio, text}} entries")


def _from_csv(raw: str, source: str, delimiter: str) -> dict[str, str]:
    try:
        rows = [row for row in csv.reader(raw.splitlines(), delimiter=delimiter) if any(cell.strip() for cell in row)]
    except csv.Error as err:  # a field over csv's field size limit, a NUL byte...
        raise TranscriptError(f"{source} is not a readable CSV/TSV manifest ({err}): one line per file, "
                              "the file name and its text") from None
    if not rows:
        raise TranscriptError(f"{source} is empty")
    header = [cell.strip().lower() for cell in rows[0]]
    audio_col = next((header.index(c) for c in AUDIO_COLUMNS if c in header), None)
    if audio_col is not None and "text" in header:
        text_col, body, first = header.index("text"), rows[1:], 2
    elif delimiter == "|" or len(rows[0]) == 2:
        audio_col, text_col, body, first = 0, len(rows[0]) - 1, rows, 1
    else:
        raise TranscriptError(f"{source}: needs a header with an audio column ({', '.join(AUDIO_COLUMNS)}) and 'text'")
    out = {}
    for line, row in enumerate(body, start=first):
        if len(row) <= max(audio_col, text_col):
            raise TranscriptError(f"{source}, line {line}: expected an audio name and a text")
        out[row[audio_col].strip()] = row[text_col]
    return out


def match(entries: dict[str, str], audio_names: list[str], *, allow_missing: bool) -> Matched:
    """Pair manifest entries with uploads by file name or stem; mismatches are one clear error."""
    by_key: dict[str, str] = {}
    for name in audio_names:
        by_key[name] = name
        by_key.setdefault(Path(name).stem, name)
    texts: dict[str, str] = {}
    unknown = []
    for key, text in entries.items():
        name = by_key.get(Path(key).name) or by_key.get(Path(key).stem if Path(key).suffix else key)
        if name is None:
            unknown.append(key)
        else:
            texts[name] = text
    empty = [name for name, text in texts.items() if not text.strip()]
    missing = tuple(name for name in audio_names if name not in texts or name in empty)
    problems = []
    if unknown:
        problems.append(f"transcripts name files that were not uploaded: {_few(unknown)}")
    if missing and not allow_missing:
        problems.append(f"audio files without a transcript: {_few(missing)}")
    if problems:
        raise TranscriptError("; ".join(problems) + f". Check the file names, or {HOW_TO}")
    return Matched({k: v for k, v in texts.items() if k not in empty}, missing)


def sidecars(audio_paths: list[Path]) -> dict[str, str]:
    """``<stem>.txt`` next to each audio file, where one exists."""
    out = {}
    for path in audio_paths:
        side = path.with_suffix(".txt")
        if side.is_file():
            out[path.name] = _read_bounded(side, "transcript")
    return out


def load(transcripts: Path | None, audio_paths: list[Path], *, allow_missing: bool) -> Matched:
    """Transcripts for the uploads, from a manifest or sidecar files."""
    names = [p.name for p in audio_paths]
    if len(set(names)) != len(names):
        raise TranscriptError("two uploads share a file name; transcripts are matched by name, so rename one")
    entries = read_manifest(transcripts, names) if transcripts is not None else sidecars(audio_paths)
    if not entries and not allow_missing:
        raise TranscriptError(f"no transcripts were given and no ASR backend is configured: {HOW_TO}")
    return match(entries, names, allow_missing=allow_missing)


def _few(names) -> str:
    names = list(names)
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")
