"""Pronunciation dictionaries: validation, matching rules, and the written-word mapping kept."""

from __future__ import annotations

import pytest

from gpu_worker.text import Dictionary, InvalidDictionary, PronunciationRule, apply, normalize
from gpu_worker.text.dictionary import MAX_RULES, MAX_SPOKEN_CHARS, MAX_WRITTEN_CHARS


def d(*rules: PronunciationRule) -> Dictionary:
    return Dictionary("test", rules)


def test_whole_word_and_case():
    dictionary = d(PronunciationRule("Nguyen", "win"), PronunciationRule("SQL", "sequel", case_sensitive=True),
                   PronunciationRule("ing", "ING", whole_word=False))
    assert apply(dictionary, "Mr. nguyen uses SQL, not sql.").text == "Mr. win uses sequel, not sql."
    assert apply(dictionary, "Nguyens").text == "NguyENGs"[:0] + "Nguyens"  # whole word: no match inside
    assert apply(dictionary, "singing").text == "sINGING"


def test_longest_form_wins_then_earliest_rule():
    dictionary = d(PronunciationRule("New York", "noo york"), PronunciationRule("New York City", "the big apple"),
                   PronunciationRule("York", "yorrk"))
    assert apply(dictionary, "New York City and New York and York").text == "the big apple and noo york and yorrk"


def test_mapping_through_normalize_points_at_the_written_phrase():
    dictionary = d(PronunciationRule("voicering", "voice ring"), PronunciationRule("Nguyen", "win"))
    n = normalize("voicering cost $5 for Nguyen.", dictionary=dictionary)
    assert n.text == "voice ring cost five dollars for win."
    assert [(w.text, n.source(w), w.written_index) for w in n.words] == [
        ("voice", "voicering", 0), ("ring", "voicering", 0), ("cost", "cost", 1), ("five", "$5", 2),
        ("dollars", "$5", 2), ("for", "for", 3), ("win", "Nguyen", 4)]


def test_replacements_are_normalized_once_and_not_rewritten_again():
    dictionary = d(PronunciationRule("a", "b"), PronunciationRule("b", "c"), PronunciationRule("X1", "ex 1"))
    assert apply(dictionary, "a b").text == "b c"
    assert normalize("X1", dictionary=dictionary).text == "ex one"


def test_source_span_maps_back():
    rw = apply(d(PronunciationRule("ab", "xxxxx")), "ab cd ab")
    assert rw.text == "xxxxx cd xxxxx"
    assert rw.source_span(0, 5) == (0, 2) and rw.source_span(6, 8) == (3, 5) and rw.source_span(9, 14) == (6, 8)
    assert rw.source_span(2, 3) == (0, 2)


@pytest.mark.parametrize("rule", [
    dict(written="", spoken="x"), dict(written=" a", spoken="x"), dict(written="a", spoken=""),
    dict(written="a" * (MAX_WRITTEN_CHARS + 1), spoken="x"), dict(written="a", spoken="x" * (MAX_SPOKEN_CHARS + 1)),
    dict(written="<laugh>", spoken="x"), dict(written="a", spoken="<laugh>"), dict(written="a\nb", spoken="x"),
    dict(written="a b c d e f g", spoken="x"),
])
def test_rule_validation(rule):
    with pytest.raises(InvalidDictionary):
        PronunciationRule(**rule)


def test_dictionary_validation():
    with pytest.raises(InvalidDictionary, match="twice"):
        d(PronunciationRule("a", "b"), PronunciationRule("A", "c"))
    d(PronunciationRule("a", "b", case_sensitive=True), PronunciationRule("A", "c", case_sensitive=True))
    with pytest.raises(InvalidDictionary, match="limit"):
        Dictionary("big", tuple(PronunciationRule(f"w{i}", "x") for i in range(MAX_RULES + 1)))
    with pytest.raises(InvalidDictionary, match="name"):
        Dictionary("bad name!", ())
    with pytest.raises(InvalidDictionary):
        Dictionary.from_json({"name": "x", "rules": [{"written": "a", "spoken": "b", "extra": 1}]})
    assert Dictionary.from_json({"name": "x", "rules": [{"written": "a", "spoken": "b"}]}).rules[0].spoken == "b"


def test_a_large_dictionary_stays_fast():
    import time

    dictionary = Dictionary("big", tuple(PronunciationRule(f"word{i}", f"said {i}") for i in range(MAX_RULES)))
    normalize("warm up word1", dictionary=dictionary)
    start = time.perf_counter()
    for _ in range(100):
        normalize("A sentence with word10 and word999 in it, 20 words or so, nothing else at all.", dictionary=dictionary)
    assert (time.perf_counter() - start) / 100 < 0.005


def test_version_is_a_hash_of_the_rules_and_the_stored_form_round_trips():
    d = Dictionary("d", (PronunciationRule("Who", "Hoo"), PronunciationRule("SQL", "sequel", case_sensitive=True)))
    again = Dictionary.from_json(d.to_json())
    assert again == d and again.version == d.version and len(d.version) == 16
    assert Dictionary("other-name", d.rules).version == d.version  # the rules', not the name's
    changed = Dictionary("d", (PronunciationRule("Who", "Whom"), d.rules[1]))
    assert changed.version != d.version
    flipped = Dictionary("d", (d.rules[0], PronunciationRule("SQL", "sequel")))
    assert flipped.version != d.version  # a case rule is part of the rule


@pytest.mark.parametrize("rules", [
    [{"written": "a", "spoken": "b", "extra": 1}],
    [{"written": "a"}],
    ["a"],
    [{"written": "a", "spoken": "b", "whole_word": 1}],
    [{"written": "w", "spoken": "s"}] * (MAX_RULES + 1),
])
def test_from_json_refuses_what_is_not_a_rule(rules):
    with pytest.raises(InvalidDictionary):
        Dictionary.from_json({"name": "d", "rules": rules})


def test_merge_keeps_the_first_named_and_the_rule_bound():
    from gpu_worker.text.dictionary import merge

    a = Dictionary("a", (PronunciationRule("Who", "Hoo"),))
    b = Dictionary("b", (PronunciationRule("who", "Hu"), PronunciationRule("SQL", "sequel")))
    assert merge([]) is None and merge([a]) is a
    merged = merge([a, b])
    assert [r.spoken for r in merged.rules] == ["Hoo", "sequel"]
    assert normalize("Who wrote SQL?", dictionary=merged).text == "Hoo wrote sequel?"
    big = Dictionary("big", tuple(PronunciationRule(f"w{i}", "x") for i in range(MAX_RULES)))
    with pytest.raises(InvalidDictionary, match="together"):
        merge([big, b])
