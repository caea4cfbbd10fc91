"""The plugin's sentence splitter: pure, no workers."""

from __future__ import annotations

import pytest

from gateway.livekit.sentences import Piece, SentenceSplitter


def feed_all(splitter: SentenceSplitter, chunks: list[str]) -> list[Piece]:
    pieces = [p for chunk in chunks for p in splitter.feed(chunk)]
    return pieces + splitter.end()


def segments(pieces: list[Piece]) -> list[str]:
    """The text of each flushed segment, and the unflushed tail last."""
    out, current = [], ""
    for piece in pieces:
        current += piece.text
        if piece.flush:
            out.append(current)
            current = ""
    return out + ([current] if current else [])


TEXT = "Hello there, my old friend. How have you been lately? I missed you! Fine"


@pytest.mark.parametrize("chunking", ["whole", "words", "chars", "llm-like"])
def test_pieces_join_to_the_input_and_cut_after_each_sentence(chunking):
    if chunking == "whole":
        chunks = [TEXT]
    elif chunking == "words":
        words = TEXT.split(" ")
        chunks = [w if i == 0 else " " + w for i, w in enumerate(words)]
    elif chunking == "chars":
        chunks = list(TEXT)
    else:
        chunks = ["Hello", " there", ",", " my old", " friend", ".", " How have", " you been lately", "?", " I missed",
                  " you", "!", " Fine"]
    splitter = SentenceSplitter(min_chars=10)
    pieces = feed_all(splitter, chunks)
    assert "".join(p.text for p in pieces) == TEXT
    assert [s.strip() for s in segments(pieces)] == [
        "Hello there, my old friend.", "How have you been lately?", "I missed you!", "Fine"]


def test_the_first_sentence_is_flushed_as_soon_as_the_next_character_proves_its_end():
    splitter = SentenceSplitter(min_chars=5)
    assert splitter.feed("Hello there") == [Piece("Hello there", False)]
    assert splitter.feed(".") == []  # an end mark alone proves nothing yet ("3.5", "...")
    assert splitter.feed(" And") == [Piece(".", True), Piece(" And", False)]


def test_no_cut_inside_numbers_or_without_whitespace_after_the_mark():
    splitter = SentenceSplitter(min_chars=1)
    assert segments(feed_all(splitter, ["It costs 3.5 dollars", " and v1.2.3 is out"])) == [
        "It costs 3.5 dollars and v1.2.3 is out"]


def test_short_sentences_join_the_next_and_closing_quotes_stay_with_their_sentence():
    splitter = SentenceSplitter(min_chars=20)
    pieces = feed_all(splitter, ['Hi. Yes. She said "go now!" and left. Ok'])
    assert segments(pieces) == ['Hi. Yes. She said "go now!"', " and left. Ok"]


def test_newline_ends_a_segment_and_flush_sentinel_speaks_the_held_marks():
    splitter = SentenceSplitter(min_chars=3)
    assert segments(feed_all(splitter, ["- first item\n- second item"])) == ["- first item\n", "- second item"]
    splitter = SentenceSplitter(min_chars=3)
    assert splitter.feed("Wait...") == [Piece("Wait", False)]
    assert splitter.flush() == [Piece("...", True)]
    assert splitter.end() == []


def test_negative_minimum_is_refused():
    with pytest.raises(ValueError):
        SentenceSplitter(min_chars=-1)


def test_where_the_flushes_fall_does_not_depend_on_the_chunking():
    import random

    text = ("Well. I think so, yes! But 3.5 is not 4... Is it? \"Quite right.\" she said.\nNext line here: ok. "
            "And a tail without an end")
    want = segments(feed_all(SentenceSplitter(min_chars=12), [text]))
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 30)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        pieces = feed_all(SentenceSplitter(min_chars=12), chunks)
        assert "".join(p.text for p in pieces) == text
        assert segments(pieces) == want


# Each was quadratic (or worse) with the regex splitter: a lookahead after `[.!?]+` backtracks over
# the whole run at every position (10k marks then "x": 7 s; 100k: minutes), too-short candidates
# were re-counted from their start at every newline (10k: 3.7 s), and a held run was re-scanned
# with that backtracking on every chunk (10k marks one at a time: over 5 minutes).
# Linear now: 100k characters take milliseconds; the bound is generous for a loaded CI box.
ADVERSARIAL = {
    "a run of end marks never proven": (["." * 100_000 + "x"], 0),
    "newlines too short to speak alone": (["\n" * 100_000], 20),
    "marks fed one at a time": (["."] * 100_000, 20),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
def test_adversarial_text_is_split_in_linear_time(case):
    import time

    chunks, min_chars = ADVERSARIAL[case]
    began = time.perf_counter()
    pieces = feed_all(SentenceSplitter(min_chars=min_chars), chunks)
    elapsed = time.perf_counter() - began
    assert "".join(p.text for p in pieces) == "".join(chunks)
    assert elapsed < 5.0, f"{case}: {elapsed:.1f} s for {sum(map(len, chunks))} characters"
