"""`voicering bench chunking`: where streamed LLM text is cut into segments, the worker's auto
chunking (`gpu_worker.chunking`) beside the LiveKit plugin's own splitter (`gateway.livekit.sentences`).

Replies are lists of sentences (so the true sentence ends are known) full of what fools a
punctuation splitter: titles ("Dr.", "Mr."), decimals, times with "p.m.", e-mail addresses,
"e.g.", "No. 5", "St. Louis", tags. Each reply is streamed in LLM-sized pieces (about 3
characters, as tokens come) through both, without a flush; every cut either makes is checked
against the true ends. Figures per splitter: `wrong_cuts` (a cut inside a sentence: the voice
would pause and restart its prosody mid-sentence), `ends_cut_share` (true sentence ends cut while
the reply streams, the last one excluded: the plugin merges sentences under its 20 characters by
design, so its share is lower for short ones), `chars_after_end_p50` (how many characters past a
sentence end the cut came: the worker waits for the next whole word). Pure text, no engine.
"""

from __future__ import annotations

import statistics

REPLIES = (
    ("Sure, Dr. Smith can see you at 3:30 p.m. today.", "She is free then.", "Shall I book it?"),
    ("The total is $12.50 for two items.", "That includes tax, e.g. the 8.5 percent state rate.", "Anything else?"),
    ("Mr. Jones lives at No. 5 Baker St. in London.", "He moved there in 2019.", "Want his number?"),
    ("Email me at jane.doe@example.com when you are ready.", "I reply within a day.", "Thanks!"),
    ("We fly to St. Louis on Jan. 5 at 9 a.m. sharp.", "The gate opens at 8:15.", "Bring your passport."),
    ("Ha <laugh> that was a good one.", "Version 2.1.3 fixed it, i.e. the crash on start.", "Try it now."),
    ("Prof. Lee and Mrs. Park will join us.", "The meeting is in room 4.2 on the third floor.", "See you there."),
    ("It weighs 3.5 kg, about 7.7 lb.", "Shipping takes 2-3 days in the U.S. mainland.", "Okay?"),
    ("Hello there!", "How can I help you today?", "I can check orders, returns and refunds."),
    ("Your order shipped yesterday.", "It should arrive on Friday.", "Is there anything else I can do for you?"),
)
PIECE_CHARS = 3
TARGETS = ("worker_wrong_cuts",)


def _pieces(text: str) -> list[str]:
    return [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def _worker_cuts(text: str) -> list[tuple[int, int]]:
    """(cut position, characters streamed when it was made), as a context with chunking auto cuts."""
    from gpu_worker.chunking import sentence_cut

    cuts, buffer, offset, streamed = [], "", 0, 0
    for piece in _pieces(text):
        buffer += piece
        streamed += len(piece)
        at = sentence_cut(buffer)
        if at:
            cuts.append((offset + at, streamed))
            offset, buffer = offset + at, buffer[at:]
    return cuts


def _plugin_cuts(text: str) -> list[tuple[int, int]]:
    from gateway.livekit.sentences import SentenceSplitter

    splitter = SentenceSplitter()
    cuts, sent, streamed = [], 0, 0
    for piece in _pieces(text):
        streamed += len(piece)
        for part in splitter.feed(piece):
            sent += len(part.text)
            if part.flush:
                cuts.append((sent, streamed))
    return cuts


def _score(cut_fn) -> dict:
    wrong, found, ends, after = 0, 0, 0, []
    for sentences in REPLIES:
        text = " ".join(sentences)
        true_ends, at = set(), 0
        for sentence in sentences[:-1]:
            at += len(sentence) + 1
            true_ends.add(at)  # where the next sentence starts
        for cut, streamed in cut_fn(text):
            end = cut if cut in true_ends else cut + 1 if cut + 1 in true_ends else None  # before or after the space
            if end is None:
                wrong += 1
                continue
            found += 1
            after.append(streamed - end)
        ends += len(true_ends)
    return {"wrong_cuts": wrong, "ends_cut_share": round(found / ends, 3) if ends else 0.0,
            "chars_after_end_p50": statistics.median(after) if after else None}


def run() -> dict:
    worker, plugin = _score(_worker_cuts), _score(_plugin_cuts)
    return {"worker_wrong_cuts": worker["wrong_cuts"], "plugin_wrong_cuts": plugin["wrong_cuts"],
            "worker": worker, "plugin": plugin,
            "targets_met": {"worker_wrong_cuts": worker["wrong_cuts"] == 0},
            "config": {"replies": len(REPLIES), "sentences": sum(len(r) for r in REPLIES), "piece_chars": PIECE_CHARS,
                       "plugin_min_sentence_chars": 20}}
