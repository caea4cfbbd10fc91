"""Training test data: real espeak-ng speech of one voice (tests/fixtures/speech.py `creator_corpus`) padded with 600 ms of head
silence, cut into uploads the way a creator would send them, plus training settings on the stand-in
models. Session-scoped, so the clip and SNAC caches built by the first training test serve the rest.

Uploads (`uploads`): 8 single-sentence wav files, each with 600 ms of digital silence before it, and
one long file of 12 sentences (each preceded by 600 ms of silence, ~35 s) whose transcript is the 12
sentences as one text (so the pipeline must align sentences to pauses). Transcripts: a JSON manifest.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from lora_training.jobs import JobQueue
from tests.fixtures.speech import SAMPLE_RATE, pad_silence

HEAD_PAD_MS = 600.0
SINGLE_FILES = 8
LONG_SENTENCES = 12


@dataclass(frozen=True)
class Uploads:
    folder: Path
    audio: list[Path]
    manifest: Path
    texts: dict[str, str]

    @property
    def long_file(self) -> Path:
        return self.folder / "long-take.wav"


@pytest.fixture(scope="session")
def uploads(creator_corpus, tmp_path_factory) -> Uploads:
    folder = tmp_path_factory.mktemp("uploads")
    texts: dict[str, str] = {}
    paths: list[Path] = []
    for clip in creator_corpus[:SINGLE_FILES]:
        path = folder / f"single-{clip.path.stem}.wav"
        sf.write(str(path), pad_silence(clip.load(), SAMPLE_RATE, HEAD_PAD_MS), SAMPLE_RATE, subtype="PCM_16")
        texts[path.name] = clip.transcript
        paths.append(path)
    long_clips = creator_corpus[SINGLE_FILES:SINGLE_FILES + LONG_SENTENCES]
    long_audio = np.concatenate([pad_silence(c.load(), SAMPLE_RATE, HEAD_PAD_MS) for c in long_clips])
    long_path = folder / "long-take.wav"
    sf.write(str(long_path), long_audio, SAMPLE_RATE, subtype="PCM_16")
    texts[long_path.name] = " ".join(c.transcript for c in long_clips)
    paths.append(long_path)
    manifest = folder / "transcripts.json"
    manifest.write_text(json.dumps(texts, indent=1))
    return Uploads(folder, paths, manifest, texts)


@pytest.fixture(scope="session")
def train_work_dir(tmp_path_factory) -> Path:
    """One work dir for the session: clips and SNAC frames are cached there by content."""
    return tmp_path_factory.mktemp("train-work")


@pytest.fixture(scope="session")
def train_settings(stand_in, adapter_store, train_work_dir):
    from lora_training.settings import DataParams, TrainParams, TrainSettings

    return TrainSettings(
        base_model=str(stand_in.model), codec=str(stand_in.codec), adapter_store=adapter_store,
        work_dir=train_work_dir, device="cpu", validate_sample=False, validate_local_worker=False,
        data=DataParams(min_speech_s=30.0),
        params=TrainParams(rank=8, alpha=16, max_steps=4, save_steps=2, batch_size=1, grad_accum=1, logging_steps=1,
                           eval_max_clips=2),
    )


class RecordingReporter:
    """Keeps every state and progress report of a job, in order."""

    def __init__(self) -> None:
        self.states: list[tuple[str, str]] = []
        self.progress_reports: list[tuple[float, str, dict]] = []

    def state(self, state: str, message: str = "") -> None:
        self.states.append((state, message))

    def progress(self, percent: float, message: str = "", **fields: object) -> None:
        self.progress_reports.append((percent, message, fields))


@pytest.fixture
def reporter() -> RecordingReporter:
    return RecordingReporter()


@pytest.fixture
def queue(redis_url, request):
    """A training queue under a prefix of its own (the test module's name and a random tag)."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    q = JobQueue.connect(redis_url, prefix=f"test-{module}-{uuid.uuid4().hex[:8]}")
    yield q
    q.close()
