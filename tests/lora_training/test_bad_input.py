"""Unusable uploads fail the job early, with a reason that tells the creator what to do."""

import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf

from lora_training.errors import AudioError, InputError, SpeechAmountError, TranscriptError, VoiceExistsError
from lora_training.pipeline import JobSpec, run_job
from lora_training.settings import DataParams


@pytest.fixture
def settings(train_settings, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    return train_settings.model_copy(update={"adapter_store": store, "work_dir": tmp_path / "work"})


def _fail(spec, settings, reporter, error):
    with pytest.raises(error) as raised:
        run_job(spec, settings, reporter, console=False)
    assert not raised.value.retryable
    assert not any(settings.adapter_store.glob("**/adapter_config.json"))  # nothing published
    return raised.value.message


def test_corrupt_file(uploads, settings, reporter, tmp_path):
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF" + bytes(1000))
    texts = {**uploads.texts, "broken.wav": "Some text."}
    (tmp_path / "t.json").write_text(json.dumps(texts))
    spec = JobSpec(name="v", tenant="t", audio=[*uploads.audio, broken], transcripts=tmp_path / "t.json")
    assert "broken.wav: not a readable audio file" in _fail(spec, settings, reporter, AudioError)
    assert reporter.states[0][0] == "preprocessing"


def test_ten_seconds_of_audio(uploads, settings, reporter):
    short = uploads.audio[:4]  # four sentences, ~10 s of audio
    spec = JobSpec(name="v", tenant="t", audio=short, transcripts=uploads.manifest, data=DataParams())
    with pytest.raises(TranscriptError):  # the manifest also names files that were not uploaded
        run_job(spec, settings, reporter, console=False)
    manifest = settings.work_dir.parent / "short.json"
    manifest.write_text(json.dumps({p.name: uploads.texts[p.name] for p in short}))
    spec = spec.model_copy(update={"transcripts": manifest})
    message = _fail(spec, settings, reporter, SpeechAmountError)
    assert re.match(r"only \d s of usable speech found; at least 60 s is needed", message) and "10 minutes" in message


def test_all_silent_audio(settings, reporter, tmp_path):
    silent = tmp_path / "quiet.wav"
    sf.write(str(silent), np.zeros(24000 * 90, dtype=np.int16), 24000)
    (tmp_path / "quiet.txt").write_text("Nothing was said.")
    spec = JobSpec(name="v", audio=[silent])
    assert "near-silent" in _fail(spec, settings, reporter, AudioError)


def test_transcripts_that_do_not_match_the_file_names(uploads, settings, reporter, tmp_path):
    renamed = {f"take-{i}.wav": text for i, text in enumerate(uploads.texts.values())}
    (tmp_path / "t.json").write_text(json.dumps(renamed))
    spec = JobSpec(name="v", tenant="t", audio=uploads.audio, transcripts=tmp_path / "t.json")
    message = _fail(spec, settings, reporter, TranscriptError)  # ASR on (the default): stray names still fail
    assert "transcripts name files that were not uploaded: take-0.wav" in message
    message = _fail(spec, settings.model_copy(update={"asr_model": "off"}), reporter, TranscriptError)
    assert "transcripts name files that were not uploaded: take-0.wav" in message
    assert "audio files without a transcript: single-" in message


def test_no_transcripts_and_asr_off(uploads, settings, reporter):
    spec = JobSpec(name="v", tenant="t", audio=uploads.audio)
    message = _fail(spec, settings.model_copy(update={"asr_model": "off"}), reporter, TranscriptError)
    assert "no ASR backend is configured" in message and "--transcripts" in message and "ASR_MODEL" in message


def test_a_voice_name_that_already_exists_for_the_tenant(uploads, settings, reporter, stand_in):
    shutil.copytree(stand_in.voice("tara"), settings.adapter_store / "acme" / "taken")
    spec = JobSpec(name="taken", tenant="acme", audio=uploads.audio, transcripts=uploads.manifest)
    with pytest.raises(VoiceExistsError, match="voice 'acme/taken' already exists"):
        run_job(spec, settings, reporter, console=False)
    assert reporter.states == []  # refused before any work
    other_tenant = spec.model_copy(update={"tenant": "other"})
    assert other_tenant.voice_id == "other/taken"


@pytest.mark.parametrize(("tenant", "name"), [("voicering-staging", "x"), (None, "voicering-staging"),
                                               ("acme", "bad/name"), ("acme", "")])
def test_invalid_or_reserved_voice_ids(tenant, name):
    with pytest.raises(InputError):
        _ = JobSpec(name=name, tenant=tenant, audio=[]).voice_id
