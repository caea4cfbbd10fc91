"""Speech with known transcripts from espeak-ng (resampled by sox): a creator's stand-in recordings.

What the demo uploads as a creator's audio, and what tests and benchmarks train and measure on,
so every figure and every dry-run clone is made the same way. Needs the Debian packages espeak-ng
and sox (`make setup` installs them). sox runs with -D (no dither), so silence stays digital zero.
Standard library and subprocess only: light enough for the gateway's demo to import.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SAMPLE_RATE = 24000
VOICES = ("en-us", "en+f3")  # a US male (F0 ~110 Hz) and a British female variant (F0 ~220 Hz)


class MissingTool(RuntimeError):
    """espeak-ng or sox is not installed."""


def require(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise MissingTool(f"{tool} is not installed: `make setup` installs it (apt-get install espeak-ng sox)")
    return found


# A consent phrase is a list of unrelated words, read one by one. espeak-ng reads a list on as
# one run: the bundled tiny ASR merged neighbours in ~1% of fresh phrases ("orange, balloon" heard
# as "in June": 2 of 100 and 1 of 41 failed the reading rule); with 80 ms between words, 0 of 252.
LIST_WORD_GAP_MS = 80


def synthesize(text: str, voice: str, path: Path, sample_rate: int = SAMPLE_RATE, word_gap_ms: int = 0) -> Path:
    """Speak `text` with espeak-ng `voice` into `path`: mono PCM16 at `sample_rate`, with
    ``word_gap_ms`` of silence added between words (espeak-ng counts it in 10 ms)."""
    raw = path.with_suffix(".espeak.wav")
    gap = ["-g", str(round(word_gap_ms / 10))] if word_gap_ms else []
    subprocess.run([require("espeak-ng"), "-v", voice, *gap, "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(
        [require("sox"), "-D", str(raw), "-r", str(sample_rate), "-c", "1", "-b", "16", str(path), "rate", "-v"],
        check=True, capture_output=True,
    )
    raw.unlink()
    return path


# Harvard sentences (IEEE 1969, lists 1-4 excerpts): public domain, phonetically balanced.
HARVARD_SENTENCES = (
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It's easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
    "The source of the huge river is the clear spring.",
    "Kick the ball straight and follow through.",
    "Help the woman get back to her feet.",
    "A pot of tea helps to pass the evening.",
    "Smoky fires lack flame and heat.",
    "The soft cushion broke the man's fall.",
    "The salt breeze came across from the sea.",
    "The girl at the booth sold fifty bonds.",
    "The small pup gnawed a hole in the sock.",
    "The fish twisted and turned on the bent hook.",
    "Press the pants and sew a button on the vest.",
    "The swan dive was far short of perfect.",
    "The beauty of the view stunned the young boy.",
    "Two blue fish swam in the tank.",
    "Her purse was full of useless trash.",
    "The colt reared and threw the tall rider.",
    "It snowed, rained, and hailed the same morning.",
    "Read verse out loud for pleasure.",
    "Hoist the load to your left shoulder.",
    "Take the winding path to reach the lake.",
)
