"""The transcript filter alone: Orpheus's known tags leave the agent's transcript wherever the
LLM's pieces cut them, and nothing else is changed (the framework run is in test_livekit_agent.py)."""

from __future__ import annotations

import pytest
from livekit.agents.types import TimedString

from gateway.livekit.transcript import TagFilter, without_tags
from gpu_worker.text.tags import TAGS, strip_tags

TEXTS = [
    "Ha <laugh> yes, that one.",
    "<sigh> Well. I tried <GASP>!",
    "x < 5 and <chuckle>, fine",
    "a <b>bold</b> word and <whisper> stays",
    "Hey<cough>, ok <yawn>",
    "No tags here at all.",
    "<< <laugh>> <la ugh> done",
]


def filtered(pieces: list[str]) -> str:
    tags = TagFilter()
    return "".join(tags.push(p) for p in pieces) + tags.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_every_split_into_two_or_three_pieces_gives_the_whole_text_s_transcript(text):
    whole = filtered([text])
    assert whole == strip_tags(text)  # the batch rule (single spaces here)
    assert not any(f"<{t}>" in whole.lower() for t in TAGS)
    for i in range(len(text) + 1):
        assert filtered([text[:i], text[i:]]) == whole, (text[:i], text[i:])
        for j in range(i, len(text) + 1, 3):
            assert filtered([text[:i], text[i:j], text[j:]]) == whole, (text[:i], text[i:j], text[j:])


def test_word_by_word_as_an_llm_streams_it():
    words = "Well <laugh> that is funny. <sigh> Anyway.".split(" ")
    assert filtered([w if i == 0 else " " + w for i, w in enumerate(words)]) == "Well that is funny. Anyway."


def test_a_held_start_that_never_becomes_a_tag_is_passed_on():
    tags = TagFilter()
    assert tags.push("Oh <la") == "Oh"  # "<la" may still become "<laugh>"
    assert tags.push("ter") == " <later"  # it cannot now: passed on whole
    assert tags.flush() == ""
    assert TagFilter().push("a <b") == "a <b"  # no known tag starts with b: never held


async def test_timed_pieces_keep_their_times():
    async def pieces():
        yield TimedString("Ha ", start_time=0.0, end_time=0.2)
        yield TimedString("<laugh> ", start_time=0.2, end_time=0.6)
        yield TimedString("yes", start_time=0.6, end_time=0.9)

    out = [p async for p in without_tags(pieces())]
    assert "".join(out) == "Ha yes"
    assert [(p.start_time, p.end_time) for p in out if isinstance(p, TimedString)] == [(0.0, 0.2), (0.6, 0.9)]
