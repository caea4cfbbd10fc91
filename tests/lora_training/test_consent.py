"""Spoken consent in the job (lora_training.consent), on real espeak-ng speech, the bundled tiny.en
and the resemblyzer speaker model: no worker, no gateway.

Uploads: 16 Harvard sentences read by espeak-ng en-us. The consent: `text_to_read` of a phrase
read by the same voice (passes), by en+f3 (another voice: refused on the speaker, while the phrase
itself is heard), and the same voice reading another phrase (refused on the phrase)."""

from __future__ import annotations

import json

import pytest
import soundfile as sf

from gateway.cloning.consent import PHRASE_WORDS, PHRASE_WORDS_PER_PHRASE, text_to_read
from lora_training.clips import Clip
from lora_training.consent import (MAX_PHRASE_WORDS_MISSED, UploadVoice, check_consent, phrase_heard,
                                   words_in_order)
from lora_training.errors import ConsentError
from lora_training.espeak import HARVARD_SENTENCES, synthesize
from lora_training.settings import DataParams

PHRASE = "tiger castle summer pencil guitar"
OTHER_PHRASE = "rocket music silver lemon carpet"
UPLOADER, OTHER_VOICE = "en-us", "en+f3"


@pytest.fixture(scope="module")
def models():
    from lora_training.asr import BUNDLED, load_asr, resolve_model
    from lora_training.quality.speaker import SpeakerEncoder

    asr = load_asr(resolve_model(BUNDLED), device="cpu", cpu_threads=2, language="en")
    return asr, SpeakerEncoder.load()


@pytest.fixture(scope="module")
def takes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("consent-uploads")
    return [(synthesize(text, UPLOADER, folder / f"take-{i}.wav"), text) for i, text in enumerate(HARVARD_SENTENCES[:16])]


@pytest.fixture(scope="module")
def clips(takes):
    return [Clip(f"c{i}", path.name, text, sf.read(path, dtype="float32")[0], 0.0, 0.0)
            for i, (path, text) in enumerate(takes)]


@pytest.fixture(scope="module")
def voice(clips, models):
    return UploadVoice.of(clips, models[1])


def recording(tmp_path, voice: str, phrase: str):
    return synthesize(text_to_read(phrase), voice, tmp_path / f"consent-{voice}.wav")


def test_phrase_words_are_distinct_and_the_phrase_rule_counts_words_in_order():
    assert len(set(PHRASE_WORDS)) == len(PHRASE_WORDS) >= 32
    assert words_in_order(PHRASE, "My words are: Tiger, castle... summer pencil guitar.") == 5
    assert words_in_order(PHRASE, "guitar pencil summer castle tiger") == 1  # out of order counts once
    assert phrase_heard(PHRASE, "tiger, while it are in, pencil guitar").passed  # two run together: allowed
    assert not phrase_heard(PHRASE, "tiger, hassle, slimmer, stencil, guitar").passed
    assert MAX_PHRASE_WORDS_MISSED == 2 and len(PHRASE.split()) == PHRASE_WORDS_PER_PHRASE == 5


def test_the_uploads_voice_reading_the_phrase_passes(tmp_path, clips, models, voice):
    asr, encoder = models
    result = check_consent(recording(tmp_path, UPLOADER, PHRASE), PHRASE, clips, DataParams(), asr=asr,
                           encoder=encoder, voice=voice)
    assert result.passed
    assert result.phrase.words_heard >= 3
    assert result.speaker.same and result.speaker.similarity >= result.speaker.limit
    figures = result.to_dict()
    assert figures["passed"] and figures["speaker"]["similarity"] > 0.85, figures


def test_another_voice_reading_the_phrase_is_refused_on_the_speaker(tmp_path, clips, models, voice):
    asr, encoder = models
    with pytest.raises(ConsentError, match="the voice in the consent recording is not the voice in the uploads") as err:
        check_consent(recording(tmp_path, OTHER_VOICE, PHRASE), PHRASE, clips, DataParams(), asr=asr,
                      encoder=encoder, voice=voice)
    check = err.value.check
    assert check.phrase.passed  # the words were said: it is the voice that is refused
    assert not check.speaker.same and check.speaker.similarity < check.speaker.limit
    assert err.value.code == "consent"


# en+f3 readings whisper tiny.en cut after the first sentence when it decoded without timestamps
# ("... copy of my voice. My words are..."): 0 of 5 words heard, which failed a CI run
TRUNCATED_BEFORE = ("table monkey magnet castle orange", "silver guitar wallet magnet apple",
                    "silver mountain basket guitar island")


@pytest.mark.parametrize("phrase", TRUNCATED_BEFORE)
def test_the_whole_reading_is_heard_not_only_its_first_sentence(tmp_path, clips, models, voice, phrase):
    asr, encoder = models
    with pytest.raises(ConsentError, match="the voice in the consent recording is not the voice") as err:
        check_consent(recording(tmp_path, OTHER_VOICE, phrase), phrase, clips, DataParams(), asr=asr,
                      encoder=encoder, voice=voice)
    heard = err.value.check.phrase  # refused on the speaker (another voice), after the phrase was heard
    assert heard.passed and heard.words_heard >= heard.words - 1, heard.heard


def test_the_right_voice_reading_other_words_is_refused_on_the_phrase(tmp_path, clips, models, voice):
    asr, encoder = models
    with pytest.raises(ConsentError, match="the consent recording does not say the phrase") as err:
        check_consent(recording(tmp_path, UPLOADER, OTHER_PHRASE), PHRASE, clips, DataParams(), asr=asr,
                      encoder=encoder, voice=voice)
    assert err.value.check.phrase.words_heard <= 1
    assert err.value.check.speaker is None


def test_a_job_whose_consent_is_another_voice_fails_before_training(takes, train_settings, reporter, tmp_path):
    from lora_training.pipeline import JobSpec, run_job

    store = tmp_path / "store"
    store.mkdir()
    settings = train_settings.model_copy(update={"adapter_store": store, "work_dir": tmp_path / "work"})
    manifest = tmp_path / "transcripts.json"
    manifest.write_text(json.dumps({path.name: text for path, text in takes}))
    spec = JobSpec(name="nova", tenant="t_consenttst", audio=[path for path, _ in takes], transcripts=manifest,
                   data=DataParams(min_speech_s=30.0), consent_audio=recording(tmp_path, OTHER_VOICE, PHRASE),
                   consent_phrase=PHRASE)
    spec = JobSpec.model_validate_json(spec.model_dump_json())  # as the queue carries it
    with pytest.raises(ConsentError, match="not the voice in the uploads") as err:
        run_job(spec, settings, reporter, console=False)
    assert not err.value.retryable
    assert [state for state, _ in reporter.states] == ["preprocessing"]  # never encoded or trained
    assert not any(store.iterdir())
