"""`voicering bench text --json`: the text normalizer against the case set, and its peers beside it.

The case set (`tests/data/normalize_cases.jsonl`): written inputs, each in a category of issue 36
item 1, with every spoken form accepted (several where speakers differ). A case is right when the
output, made canonical (lower case, hyphens as spaces, punctuation dropped, tags spaced), equals
one accepted form made canonical the same way. `accuracy_letters_lenient` also accepts an output
whose capitals ("PM", "FBI") match when said as letters: a peer that leaves them to the TTS model
is not charged for that. `holdout`: the same figures on `normalize_holdout.jsonl`, 84 cases
written after the rules were, never used to change them.

Timing is the serving path: `gpu_worker.text.normalize(sentence)` per case, `ROUNDS` rounds
interleaved, each sentence timed alone (perf_counter_ns); p50/p99 over all of them. The stream
path (`StreamNormalizer`, pushed word by word) is timed per sentence too.

Peers, measured on the same cases in the same run, each only as far as it goes:

- `num2words` and `inflect` turn numbers into words; neither finds numbers in text, so both get the
  same small scaffold (one regex for amounts with $ £ € or %, ordinals, and plain numbers; a
  four-digit number from 1000 to 2099 read as a year by num2words' `to="year"`; inflect has no
  year or currency reading, so its amounts are the number plus the currency's word). Everything
  else (dates, times, phones, units, tags, URLs, abbreviations) stays as written: they do not do it.
- NVIDIA `nemo-text-processing`'s English normalizer (WFST grammars, `input_case="cased"`,
  `punct_post_process=True`), its grammars compiled in this run (`grammar_compile_s`).

A peer that cannot be imported is reported as `{"absent": "..."}`, never estimated. The suite's
venv installs num2words and inflect (pyproject `dev`); nemo-text-processing needs pynini (a
~165 MB wheel) and is not a project dependency: measure it in its own venv with
`PYTHONPATH=. python -m bench.text --json` (this module needs only the standard library and
`gpu_worker.text`).
"""

from __future__ import annotations

import gc
import json
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

CASES: Final = Path(__file__).resolve().parents[1] / "tests" / "data" / "normalize_cases.jsonl"
# a second, smaller set written after the rules (4 a category), never used to tune them: `holdout`
HOLDOUT: Final = CASES.with_name("normalize_holdout.jsonl")
ROUNDS: Final = 20
TARGETS: Final = {"accuracy": (">=", 0.95), "min_category_accuracy": (">=", 0.85), "serving_ms_p99": ("<=", 1.0)}
# issue 36 item 1's categories, as the case set names them
CATEGORIES: Final = ("cardinal", "decimal", "negative", "ordinal", "year", "currency", "percent", "time", "date",
                     "phone", "unit", "abbreviation", "acronym", "fraction", "range", "roman", "symbol", "email",
                     "url", "tag", "plain")


def load_cases(path: Path = CASES) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def canonical(text: str) -> str:
    """What is compared: lower case, hyphens as spaces, tags set apart, other punctuation dropped."""
    text = text.lower().replace("-", " ").replace("’", "'")
    text = re.sub(r"(<[a-z]+>)", r" \1 ", text)
    text = re.sub(r"[^\w'<> ]", " ", text)
    return " ".join(text.split())


_CAPITALS = re.compile(r"\b(?:[A-Z]\.){2,}|\b[A-Z]{2,6}\b")


def letters_spelled(text: str) -> str:
    """Capitals written out as spaced letters ("PM" -> "P M", "FBI" -> "F B I"): a reading a TTS
    model would likely give them, so a normalizer that leaves capitals for the model is not
    counted wrong for it in `accuracy_letters_lenient`."""
    return _CAPITALS.sub(lambda m: " ".join(m[0].replace(".", "")), text)


def is_right(output: str, accepted: Sequence[str], lenient: bool = False) -> bool:
    forms = {canonical(a) for a in accepted}
    return canonical(output) in forms or (lenient and canonical(letters_spelled(output)) in forms)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(normalize: Callable[[str], str], cases: Sequence[dict], rounds: int) -> dict:
    """Accuracy per category and time per sentence (ms) of one normalizer on the cases."""
    right: dict[str, list[bool]] = defaultdict(list)
    wrong = []
    lenient = 0
    for case in cases:
        out = normalize(case["written"])
        ok = is_right(out, case["spoken"])
        lenient += is_right(out, case["spoken"], lenient=True)
        right[case["category"]].append(ok)
        if not ok:
            wrong.append(case["written"])
    times: list[float] = []
    gc.disable()
    try:
        for _ in range(rounds):
            for case in cases:
                start = time.perf_counter_ns()
                normalize(case["written"])
                times.append((time.perf_counter_ns() - start) / 1e6)
    finally:
        gc.enable()
    per_category = {c: round(sum(v) / len(v), 4) for c, v in sorted(right.items())}
    total = sum(sum(v) for v in right.values())
    return {
        "accuracy": round(total / len(cases), 4),
        "accuracy_letters_lenient": round(lenient / len(cases), 4),
        "min_category_accuracy": min(per_category.values()),
        "per_category": per_category,
        "serving_ms_p50": round(_percentile(times, 0.50), 4),
        "serving_ms_p99": round(_percentile(times, 0.99), 4),
        "wrong": wrong,
    }


# --- peers ----------------------------------------------------------------------------------

_AMOUNT = re.compile(r"(?P<sym>[$£€])(?P<amt>\d[\d,]*(?:\.\d+)?)|(?P<pct>\d[\d,]*(?:\.\d+)?)\s?%"
                     r"|(?P<ord>\d+)(?:st|nd|rd|th)\b|(?P<num>-?\d[\d,]*(?:\.\d+)?)")
_CURRENCY_CODES = {"$": "USD", "£": "GBP", "€": "EUR"}
_CURRENCY_WORDS = {"$": "dollars", "£": "pounds", "€": "euros"}


def _num2words() -> Callable[[str], str]:
    from num2words import num2words

    def number(s: str) -> str:
        s = s.replace(",", "")
        value = float(s) if "." in s else int(s)
        if isinstance(value, int) and 1000 <= value <= 2099 and len(s) == 4:
            return num2words(value, to="year")
        return num2words(value)

    def sub(m: re.Match[str]) -> str:
        if m["sym"]:
            return num2words(float(m["amt"].replace(",", "")), to="currency", currency=_CURRENCY_CODES[m["sym"]])
        if m["pct"]:
            return number(m["pct"]) + " percent"
        if m["ord"]:
            return num2words(int(m["ord"]), to="ordinal")
        return number(m["num"])

    return lambda text: _AMOUNT.sub(sub, text)


def _inflect() -> Callable[[str], str]:
    import inflect

    engine = inflect.engine()

    def number(s: str) -> str:
        return engine.number_to_words(s.replace(",", ""), andword="")

    def sub(m: re.Match[str]) -> str:
        if m["sym"]:
            return f"{number(m['amt'])} {_CURRENCY_WORDS[m['sym']]}"
        if m["pct"]:
            return number(m["pct"]) + " percent"
        if m["ord"]:
            return engine.ordinal(number(m["ord"]))
        return number(m["num"])

    return lambda text: _AMOUNT.sub(sub, text)


def _nemo() -> tuple[Callable[[str], str], float]:
    from nemo_text_processing.text_normalization.normalize import Normalizer

    start = time.perf_counter()
    normalizer = Normalizer(input_case="cased", lang="en")  # no cache_dir: the grammars compile here
    compile_s = time.perf_counter() - start
    return (lambda text: normalizer.normalize(text, punct_post_process=True)), compile_s


def _holdout(normalize: Callable[[str], str]) -> dict:
    figures = measure(normalize, load_cases(HOLDOUT), rounds=1)
    return {k: figures[k] for k in ("accuracy", "min_category_accuracy", "per_category", "wrong")}


def _peer(name: str, cases: Sequence[dict], rounds: int) -> dict:
    try:
        if name == "nemo_text_processing":
            fn, compile_s = _nemo()
            figures = measure(fn, cases, rounds)
            figures["grammar_compile_s"] = round(compile_s, 2)
        else:
            fn = _num2words() if name == "num2words" else _inflect()
            figures = measure(fn, cases, rounds)
        figures["holdout"] = _holdout(fn)
        return figures
    except ImportError as exc:
        return {"absent": f"not importable here ({exc.name or exc}); install it to measure it"}


def run(rounds: int = ROUNDS, peers: Sequence[str] = ("num2words", "inflect", "nemo_text_processing")) -> dict:
    from gpu_worker.text import StreamNormalizer, normalize

    cases = load_cases()
    figures = measure(lambda t: normalize(t).text, cases, rounds)

    def streamed(text: str) -> str:
        s = StreamNormalizer()
        return "".join(s.push(w) for w in re.findall(r"\S+\s*|\s+", text)) + s.flush()

    stream = measure(streamed, cases, max(1, rounds // 4))
    figures.update({
        "holdout": _holdout(lambda t: normalize(t).text),
        "stream_ms_p50": stream["serving_ms_p50"], "stream_ms_p99": stream["serving_ms_p99"],
        "stream_equals_whole": all(streamed(c["written"]) == normalize(c["written"]).text for c in cases),
        "cases": len(cases), "categories": sorted({c["category"] for c in cases}),
        "categories_missing": sorted(set(CATEGORIES) - {c["category"] for c in cases}),
        # peers run fewer rounds: nemo takes tens of ms a sentence
        "peers": {name: _peer(name, cases, max(1, rounds // 10)) for name in peers},
        "config": {"rounds": rounds, "python": sys.version.split()[0]},
    })
    met = {}
    for key, (op, bound) in TARGETS.items():
        value = figures[key]
        met[key] = value >= bound if op == ">=" else value <= bound
    figures["targets"] = {k: f"{op} {bound}" for k, (op, bound) in TARGETS.items()}
    figures["targets_met"] = met
    return figures


if __name__ == "__main__":  # a venv without the project's dependencies (nemo's): PYTHONPATH=. python -m bench.text
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else ROUNDS
    print(json.dumps(run(rounds=rounds), indent=2, sort_keys=True))
