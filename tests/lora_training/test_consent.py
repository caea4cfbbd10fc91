"""Spoken consent in the job (lora_training.consent), on real espeak-ng speech, the bundled tiny.en
and the resemblyzer speaker model: no worker, no gateway.

Uploads: 16 Harvard sentences read by espeak-ng en-us. The consent: `text_to_read` of a phrase
read by the same voice (passes), by en+f3 (another voice: refused on the speaker, while the phrase
itself is heard), and the same voice reading another phrase (refused on the phrase). And the
replays of issue 34 (item 3): the public word list read twice, the list of 35 words it replaced
read twice, and a consent reading padded with list words around the phrase: each refused, for
every fresh phrase, on the reading rule (the sentence, the phrase, and nothing much besides)."""

from __future__ import annotations

import json
import random

import pytest
import soundfile as sf

from gateway.cloning.consent import PHRASE_WORDS, PHRASE_WORDS_PER_PHRASE, new_phrase, text_to_read
from lora_training.clips import Clip
from lora_training.consent import (CONSENT_SENTENCE, MAX_CONSENT_AUDIO_S, MAX_EXTRA_WORDS, MAX_PHRASE_WORDS_MISSED,
                                   MAX_SENTENCE_WORDS_MISSED, UploadVoice, check_consent, consent_text,
                                   reading_heard, words_in_order)
from lora_training.errors import ConsentError
from lora_training.espeak import HARVARD_SENTENCES, synthesize
from lora_training.settings import DataParams

PHRASE = "tiger castle 47 summer pencil guitar dragon"
OTHER_PHRASE = "rocket music silver 62 lemon carpet island"
UPLOADER, OTHER_VOICE = "en-us", "en+f3"
# the 35 words phrases were drawn from before issue 34: a reading of them twice passed 1,989 of
# 2,000 phrases of 5 of them
OLD_PUBLIC_WORDS = (
    "apple", "basket", "blanket", "camera", "candle", "carpet", "castle", "coffee", "dragon", "garden",
    "guitar", "hammer", "island", "lemon", "magnet", "melon", "mirror", "monkey", "mountain", "music",
    "orange", "paper", "pencil", "pocket", "rocket", "silver", "sugar", "summer", "table", "tiger",
    "tomato", "turtle", "wallet", "winter", "yellow",
)
FRESH_PHRASES = 2000  # fresh phrases each replay is held to


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


def test_the_reading_rule_needs_the_sentence_the_phrase_in_order_and_little_else():
    assert len(set(PHRASE_WORDS)) == len(PHRASE_WORDS) >= 200
    assert set(PHRASE.split()) - {"47"} <= set(PHRASE_WORDS) and set(OTHER_PHRASE.split()) - {"62"} <= set(PHRASE_WORDS)
    assert len(PHRASE.split()) == PHRASE_WORDS_PER_PHRASE + 1
    said = consent_text(PHRASE)
    assert said.startswith(CONSENT_SENTENCE) and reading_heard(PHRASE, said).passed
    # a number counts as one item, heard as digits or words; items out of order count once
    assert words_in_order(PHRASE, "My words are: Tiger, castle... forty-seven, summer pencil guitar dragon.") == 7
    assert words_in_order(PHRASE, "tiger castle 47 summer") == 4
    assert words_in_order(PHRASE, "dragon guitar pencil summer 47 castle tiger") == 1
    # tiny.en's usual errors pass: "I can send ... emphatic", a number run into a word, two misses
    heard = ("I can send to the training and use them as emphatic copy on my voice. My words are tiger, hassle, "
             "47 summer, while it are in, guitar, dragon.")
    assert reading_heard(PHRASE, heard).passed, reading_heard(PHRASE, heard)
    # the phrase without the sentence; the sentence with three phrase words missed
    assert not reading_heard(PHRASE, "My words are: tiger, castle, 47, summer, pencil, guitar, dragon.").passed
    missed = reading_heard(PHRASE, f"{CONSENT_SENTENCE} My words are: tiger, hassle, 47, summer, stencil, guitar.")
    assert not missed.passed and missed.words_heard == 4 and "does not say the phrase" in missed.why_not()
    # the whole text, and more words than it has: a phrase said among other words is not a consent
    padded = f"{said} " + " ".join([w for w in PHRASE_WORDS if w not in PHRASE.split()][:MAX_EXTRA_WORDS + 1])
    result = reading_heard(PHRASE, padded)
    assert not result.passed and result.words_heard == 7 and result.extra_words > MAX_EXTRA_WORDS
    assert "says much more than the consent text" in result.why_not()
    assert MAX_PHRASE_WORDS_MISSED == 2 and MAX_SENTENCE_WORDS_MISSED <= len(CONSENT_SENTENCE.split()) // 2


def test_fresh_phrases_are_six_distinct_listed_words_and_a_number():
    rng = random.Random(34)
    for _ in range(200):
        items = new_phrase(rng).split()
        words = [i for i in items if not i.isdigit()]
        assert len(items) == 7 and len(set(words)) == 6 and set(words) <= set(PHRASE_WORDS)
        assert 21 <= int(next(i for i in items if i.isdigit())) <= 99


def test_the_uploads_voice_reading_the_phrase_passes(tmp_path, clips, models, voice):
    asr, encoder = models
    result = check_consent(recording(tmp_path, UPLOADER, PHRASE), PHRASE, clips, DataParams(), asr=asr,
                           encoder=encoder, voice=voice)
    assert result.passed
    assert result.phrase.words_heard >= result.phrase.words - MAX_PHRASE_WORDS_MISSED
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


GENUINE_SEED, GENUINE_PHRASES = 3401, 4


@pytest.mark.parametrize("voice", [UPLOADER, OTHER_VOICE])
def test_fresh_phrases_read_as_given_pass_the_reading_rule(tmp_path, models, voice):
    """A few fresh phrases (seeded: espeak-ng and tiny.en at temperature 0 are deterministic) read by
    each voice. The pass rate over many is measured in docs/training.md, "Spoken consent"."""
    asr, _ = models
    rng = random.Random(GENUINE_SEED)
    for i in range(GENUINE_PHRASES):
        phrase = new_phrase(rng)
        audio = sf.read(synthesize(text_to_read(phrase), voice, tmp_path / f"genuine-{i}.wav"), dtype="float32")[0]
        result = reading_heard(phrase, asr.transcribe(audio, passage=True).text)
        assert result.passed, result


def _pre_issue_34_rule(phrase: str, heard: str) -> bool:
    """What the job accepted before: the phrase's items in order, two missed allowed, nothing else."""
    return words_in_order(phrase, heard) >= len(phrase.split()) - 2


def test_the_public_word_list_read_twice_consents_to_no_fresh_phrase(tmp_path, models):
    """The replay of issue 34 (item 3), exactly: espeak-ng reading the whole public word list twice.
    The gateway refuses it before anything is kept (tests/gateway/test_consent.py: several times the
    30 s cap); heard here in full by the job's ASR, it holds the words of nearly every fresh phrase
    in order, and the rule refuses every one of them: no consent sentence, hundreds of words more
    than a consent text has."""
    asr, _ = models
    path = synthesize(", ".join(PHRASE_WORDS + PHRASE_WORDS) + ".", UPLOADER, tmp_path / "list-twice.wav")
    audio = sf.read(path, dtype="float32")[0]
    assert len(audio) / 24000 > 4 * MAX_CONSENT_AUDIO_S
    heard = asr.transcribe(audio, passage=True).text
    assert words_in_order(" ".join(PHRASE_WORDS), heard) >= 0.8 * len(PHRASE_WORDS)  # the ASR heard the list
    rng = random.Random(34)
    phrases = [new_phrase(rng) for _ in range(FRESH_PHRASES)]
    words_only = [" ".join(i for i in p.split() if not i.isdigit()) for p in phrases]  # as if numbers were heard
    assert sum(_pre_issue_34_rule(p, heard) for p in words_only) > 0.5 * FRESH_PHRASES  # the old rule: replayable
    results = [reading_heard(p, heard) for p in phrases]
    assert not any(r.passed for r in results)
    assert min(r.extra_words for r in results) > 20 * MAX_EXTRA_WORDS
    with_sentence = f"{CONSENT_SENTENCE} My words are: {heard}"  # and had it been read after the sentence
    assert not any(reading_heard(p, with_sentence).passed for p in phrases)


def test_the_old_35_word_list_read_twice_is_refused_by_the_job(tmp_path, clips, models, voice):
    """The recording the issue sent end to end (25 s: it fits the cap), against a phrase of those
    words in an order it covers, as the gateway issued them before: refused by the job's check."""
    asr, encoder = models
    path = synthesize(" ".join(OLD_PUBLIC_WORDS * 2), UPLOADER, tmp_path / "old-list-twice.wav")  # ~26 s
    assert sf.info(str(path)).duration < MAX_CONSENT_AUDIO_S
    phrase = "castle guitar mountain silver turtle"  # in list order: covered twice over
    with pytest.raises(ConsentError, match="consent") as err:
        check_consent(path, phrase, clips, DataParams(), asr=asr, encoder=encoder, voice=voice)
    heard = err.value.check.phrase
    assert _pre_issue_34_rule(phrase, heard.heard), heard  # what passed before
    assert not heard.passed and err.value.check.speaker is None
    assert heard.extra_words > MAX_EXTRA_WORDS or heard.sentence_words_heard < 14 - MAX_SENTENCE_WORDS_MISSED


def test_a_consent_reading_padded_with_list_words_around_the_phrase_is_refused(tmp_path, clips, models, voice):
    """The best replay that fits 30 s: the sentence read, then list words with a fresh phrase's items
    among them in order (what a recording would need to hold to serve as consent to phrases it was
    not made for). Refused on the words beyond the text, though it says the phrase."""
    asr, encoder = models
    phrase = new_phrase(random.Random(7))
    fillers = iter(w for w in PHRASE_WORDS if w not in phrase.split())
    padded = []
    for item in phrase.split():  # two list words before each of the phrase's items
        padded += [next(fillers), next(fillers), item]
    text = f"{CONSENT_SENTENCE} My words are: {', '.join(padded)}."
    path = synthesize(text, UPLOADER, tmp_path / "padded.wav")
    assert sf.info(str(path)).duration < MAX_CONSENT_AUDIO_S
    with pytest.raises(ConsentError, match="says much more than the consent text") as err:
        check_consent(path, phrase, clips, DataParams(), asr=asr, encoder=encoder, voice=voice)
    heard = err.value.check.phrase
    assert heard.words_heard >= heard.words - MAX_PHRASE_WORDS_MISSED, heard  # the phrase itself was said
    assert heard.extra_words > MAX_EXTRA_WORDS


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


def test_the_uploads_voice_read_in_a_reverberant_room_is_refused_as_unsure_not_as_someone_else(tmp_path, clips,
                                                                                                models, voice):
    """Issue 34 item 4, end to end: the dry uploads' own voice reading the consent in a reverberant
    room (sox reverb) was refused with "the person whose voice is cloned must read the consent
    phrase themselves". It is still refused (the bar is unchanged), in words about the room."""
    import subprocess

    asr, encoder = models
    dry = recording(tmp_path, UPLOADER, PHRASE)
    hall = tmp_path / "consent-hall.wav"
    subprocess.run(["sox", "-D", str(dry), str(hall), "reverb", "60"], check=True, capture_output=True)
    with pytest.raises(ConsentError) as err:
        check_consent(hall, PHRASE, clips, DataParams(), asr=asr, encoder=encoder, voice=voice)
    assert err.value.check.speaker.verdict == "other_room", err.value.check
    assert "another room or microphone" in err.value.message and "echoes more" in err.value.message
    assert "themselves" not in err.value.message
