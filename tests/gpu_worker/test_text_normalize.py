"""normalize(): the entry point's contract: the word mapping, bad input, bounds, languages, imports."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpu_worker.text as text_pkg
from gpu_worker.errors import TextTooLong
from gpu_worker.text import MAX_TEXT_CHARS, UnknownLanguage, normalize


def test_each_spoken_word_knows_its_written_word():
    n = normalize("Dr. Smith paid $1,200 on Jan. 5 <laugh> ok")
    pairs = [(w.text, n.source(w), w.written_index) for w in n.words]
    assert pairs == [
        ("Doctor", "Dr.", 0), ("Smith", "Smith", 1), ("paid", "paid", 2),
        ("one", "$1,200", 3), ("thousand", "$1,200", 3), ("two", "$1,200", 3), ("hundred", "$1,200", 3),
        ("dollars", "$1,200", 3), ("on", "on", 4), ("January", "Jan. 5", 5), ("fifth", "Jan. 5", 5),
        ("<laugh>", "<laugh>", 7), ("ok", "ok", 8),
    ]
    for w in n.words:  # spans point into the spoken text
        assert n.text[w.start:w.end] == w.text


def test_the_mapping_covers_every_word_of_the_spoken_text():
    n = normalize("Call 555-123-4567 or mail a.b@c.com at 3:30 pm, NASA's FBI & CIA.")
    assert [w.text for w in n.words] == re.findall(r"<[^<>]+>|[\w']+(?:-[\w']+)*", n.text)
    assert "Nasa's" in n.text
    assert all(0 <= w.written_start < w.written_end <= len(n.written) for w in n.words)
    assert [w.written_index for w in n.words] == sorted(w.written_index for w in n.words)


@pytest.mark.parametrize("blank", ["", " ", "\n\t ", "\u200b", "\x00\x01"])
def test_empty_and_blank(blank):
    n = normalize(blank)
    assert n.text == "" and n.words == ()


def test_whitespace_and_odd_characters():
    assert normalize("  Hello\u00a0 world\r\n  ").text == "Hello world"
    assert normalize("“It’s fine,” she said").text == '"It\'s fine," she said'


def test_bad_input():
    with pytest.raises(TypeError):
        normalize(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TextTooLong):
        normalize("a" * (MAX_TEXT_CHARS + 1))
    with pytest.raises(UnknownLanguage, match="supported: en"):
        normalize("hi", language="xx")
    assert normalize("hi", language="en-US").text == normalize("hi", language="EN").text == "hi"


def test_huge_input_is_linear():
    sentence = "On Jan. 5, 2024, Dr. Smith paid $1,200 for 3 tickets at 3:30 pm <laugh>. "
    text = (sentence * (MAX_TEXT_CHARS // len(sentence)))[:MAX_TEXT_CHARS]
    start = time.perf_counter()
    n = normalize(text)
    assert time.perf_counter() - start < 10 and len(n.words) > 20_000
    digits = "9" * 50_000  # one long number: read digit by digit, bounded
    assert normalize(digits).text.count("nine") == 50_000



@pytest.mark.parametrize("unit", ["a.", "1-", "a@", "www.", "Dr.", "1,", "1:", "<a", "$1", "A.", "1/", "(555) ", "+1 ",
                                  "<" * 3 + "@" * 3 + "." * 3, "http://", "9" * 7 + ".", "a_"])
def test_junk_without_spaces_is_linear(unit):
    """Runs without spaces once cost quadratic time (a URL or e-mail pattern rescanning the run from
    every position, context lookups walking the whole run): 90,000 characters took minutes."""
    text = (unit * (90_000 // len(unit)))[:90_000]
    start = time.perf_counter()
    normalize(text)
    assert time.perf_counter() - start < 5


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_text_reads_without_error(text):
    n = normalize(text)
    for w in n.words:
        assert n.text[w.start:w.end] == w.text
        assert 0 <= w.written_start <= w.written_end <= len(text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789$£€%.,:/-–+ <>#@&abcAPMkgm()'", max_size=40))
def test_symbol_and_digit_soup(text):
    normalize(text)


def test_public_names():
    for name in text_pkg.__all__:
        assert getattr(text_pkg, name) is not None


def test_import_is_light():
    code = ("import sys, gpu_worker.text, gpu_worker.text.english; "
            "heavy = {'torch', 'vllm', 'numpy', 'transformers', 'websockets', 'pydantic'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
