"""Orpheus's tags kept whole; the stated rule for unknown `<...>`; tags through streams and dictionaries."""

from __future__ import annotations

import pytest

from gpu_worker.text import TAGS, Dictionary, PronunciationRule, StreamNormalizer, normalize, strip_tags
from gpu_worker.text.tags import known_tag


@pytest.mark.parametrize("tag", TAGS)
def test_every_tag_kept_whole(tag):
    assert normalize(f"Well <{tag}> I guess.").text == f"Well <{tag}> I guess."
    assert normalize(f"<{tag.upper()}>").text == f"<{tag}>"  # written back as trained
    assert normalize(f"< {tag} >").text == f"<{tag}>"


def test_the_eight_tags():
    assert set(TAGS) == {"laugh", "chuckle", "sigh", "cough", "sniffle", "groan", "yawn", "gasp"}
    assert known_tag("<laugh>") == "<laugh>" and known_tag("<laughs>") is None and known_tag("laugh") is None


@pytest.mark.parametrize(("written", "spoken"), [
    ("Unknown <whisper> tag", "Unknown whisper tag"),
    ('a <break time="1s"/> b', "a break time 1s b"),
    ("<b>bold</b>", "b bold b"),
    ("1 <2", "one two"),  # a `<` stuck to a number opens nothing: dropped
    ("a < b", "a less than b"),
    ("<lau", "lau"),  # unterminated: never swallows what follows
    ("<" + "x" * 100 + ">", "x" * 100),  # over MAX_TAG_CHARS: not a tag, its letters read as a word
])
def test_unknown_tags_are_spoken_as_text(written, spoken):
    assert normalize(written).text == spoken


def test_a_tag_split_across_pieces_is_joined():
    for i in range(1, len("<laugh>")):
        s = StreamNormalizer()
        assert s.push("ha " + "<laugh>"[:i]) + s.push("<laugh>"[i:] + " ok") + s.flush() == "ha <laugh> ok"


def test_dictionaries_never_rewrite_tags():
    d = Dictionary("t", (PronunciationRule("laugh", "larf"), PronunciationRule("sigh", "sy")))
    assert normalize("I laugh <laugh> and sigh <sigh>", dictionary=d).text == "I larf <laugh> and sy <sigh>"


def test_strip_tags_for_transcripts():
    assert strip_tags("Well <laugh> I <whisper> guess <SIGH>.") == "Well I <whisper> guess."
