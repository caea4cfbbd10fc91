"""Where auto chunking may cut streamed text (gpu_worker.chunking): after complete sentences, never
inside what the text front end reads as one token, and past the delay at clause or word breaks
that leave the last words unspoken."""

from __future__ import annotations

import pytest

from gpu_worker.chunking import HOLD_WORDS, SCAN_CHARS, clause_cut, sentence_cut


def cut(text: str, at: int | None) -> str | None:
    return None if at is None else text[:at]


@pytest.mark.parametrize(("text", "spoken_first"), [
    ("I saw Dr. Smith today. Then ", "I saw Dr. Smith today. "),
    ("It costs 3.5 dollars. Ok then ", "It costs 3.5 dollars. "),
    ("Mail bob@x.com. Next one ", "Mail bob@x.com. "),
    ("Ha <laugh>. Fine then ", "Ha <laugh>. "),
    ("Call me at 3:30 p.m. Bye now ", "Call me at 3:30 p.m. "),
    ("We went to St. Louis. Nice ", "We went to St. Louis. "),
    ("One. Two. Three. Four ", "One. Two. Three. "),  # every complete sentence at once
    ("Really?! \"Yes.\" Then ", "Really?! \"Yes.\" "),
])
def test_a_cut_follows_the_last_complete_sentence(text, spoken_first):
    assert cut(text, sentence_cut(text)) == spoken_first


@pytest.mark.parametrize("text", [
    "See Dr. ", "See Dr. Smith",  # no whole word after it yet: "Dr." may be a title
    "It is 3.", "It is 3. ", "Pay $1,200.50 ", "Write to bob@x.", "Ha <laugh", "Ha <laugh>. Fi",
    "No sentence end here at all ", "",
])
def test_no_cut_inside_a_token_or_before_the_next_word_shows_the_end(text):
    assert sentence_cut(text) is None


def test_past_the_delay_the_cut_is_at_a_clause_break_else_a_word_and_keeps_the_last_words():
    text = "Hello, how are you doing on this fine day my friend "
    assert cut(text, clause_cut(text)) == "Hello, "
    plain = "one two three four five six seven "
    assert cut(plain, clause_cut(plain)) == "one two three "  # the last HOLD_WORDS words stay
    assert len(plain[clause_cut(plain):].split()) == HOLD_WORDS
    assert clause_cut("just four words here ") is None
    units = "we paid 5 kg of 3.5 kg for it "
    assert cut(units, clause_cut(units)) == "we paid 5 kg "  # never between a number and its unit


def test_a_long_buffer_is_read_only_at_its_tail():
    head = "word " * (SCAN_CHARS // 5 + 50)
    text = head + "The end. Next "
    assert cut(text, sentence_cut(text)) == head + "The end. "
    assert sentence_cut("Dr. " * 2000) is None  # never a cut, bounded work
