"""`Finding`: one thing a check found in an upload, with the file and time range it is about, and
the sentence a creator reads. Blocks refuse the clone; warnings and fixes stay with the voice."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Level = Literal["block", "warn", "fixed"]
LEVELS: tuple[Level, ...] = ("block", "warn", "fixed")

__all__ = ["LEVELS", "Finding", "Level", "blocks", "clock", "from_dicts", "to_dicts"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding. `code` is stable for programs (`clipping`, `low_snr`, `second_speaker`...),
    `message` is for the creator and names the file and the time ("another voice speaks at
    0:31–0:48 in interview.wav"). `value` is the measured figure, `limit` the threshold it was
    held to (both in the unit the code implies: dB, LUFS, %, Hz, s)."""

    level: Level
    code: str
    message: str
    file: str | None = None  # None: about the whole upload
    start_s: float | None = None
    end_s: float | None = None
    value: float | None = None
    limit: float | None = None

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> Finding:
        if data.get("level") not in LEVELS:
            raise ValueError(f"finding level {data.get('level')!r} is not one of {LEVELS}")
        return cls(**{k: data.get(k) for k in cls.__slots__})


def blocks(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "block"]


def to_dicts(findings: list[Finding]) -> list[dict]:
    return [f.to_dict() for f in findings]


def from_dicts(items: list[dict]) -> list[Finding]:
    return [Finding.from_dict(item) for item in items]


def clock(seconds: float) -> str:
    """0:31, 1:02:05: times the way a creator reads them in an audio editor."""
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
