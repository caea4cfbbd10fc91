"""Speech responses cut after their first audio, said once, in the gateway's words.

A worker lost under load ends every one of its streams at once. Each such response is cut on
purpose (`speech.py`: raw audio ends without its last chunk, SSE with an `error` event), and
uvicorn would add its own "ASGI callable returned without completing response." for every raw
one: a burst of identical errors that names neither the requests nor the cause. Instead:

- `CutReport.add` notes each cut (worker, reason, trace id, audio sent); the first one of a burst
  arms a timer, and `CUT_REPORT_S` later one warning per worker and reason says how many
  responses were cut, why, and their trace ids (`voicering trace ID` finds each);
- `mark_cut()`, called where the response returns unfinished, marks the request's task, and
  `QuietCutResponses` (on uvicorn's error logger, installed by `gateway.serve`) drops uvicorn's
  line for that task only: any other response uvicorn finds unfinished is still reported.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from contextvars import Context, ContextVar
from dataclasses import dataclass
from typing import Final

__all__ = ["CUT_REPORT_S", "UVICORN_INCOMPLETE", "Cut", "CutReport", "QuietCutResponses", "mark_cut"]

log = logging.getLogger(__name__)

CUT_REPORT_S: Final = 1.0  # a burst's cuts are gathered this long after its first, then said in one line per cause
MAX_TRACES_LISTED: Final = 20  # trace ids named per line; the rest are counted
UVICORN_INCOMPLETE: Final = "ASGI callable returned without completing response."  # uvicorn's words, dropped for ours

_cut_on_purpose: ContextVar[bool] = ContextVar("voicering_response_cut_on_purpose", default=False)


@dataclass(frozen=True, slots=True)
class Cut:
    """One response cut after its first audio."""

    worker: str  # the worker that was serving it
    code: str  # why: the worker error's code (worker_lost, stalled, ...)
    message: str  # the error's own words
    trace_id: str
    audio_s: float  # audio generated before the cut (billed)


class CutReport:
    """The cuts of one gateway process, logged one line per burst and cause (not per request)."""

    def __init__(self, window_s: float = CUT_REPORT_S) -> None:
        self.window_s = window_s
        self._cuts: list[Cut] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, cut: Cut) -> None:
        self._cuts.append(cut)
        if self._timer is None:  # in a context of its own: the line is the burst's, not the first request's trace
            self._timer = asyncio.get_running_loop().call_later(self.window_s, self.flush, context=Context())

    def flush(self) -> None:
        """Log what was gathered (also at shutdown), one warning per worker and reason."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        cuts, self._cuts = self._cuts, []
        groups: dict[tuple[str, str], list[Cut]] = defaultdict(list)
        for cut in cuts:
            groups[(cut.worker, cut.code)].append(cut)
        for (worker, code), group in groups.items():
            traces = " ".join(c.trace_id for c in group[:MAX_TRACES_LISTED])
            more = f" and {len(group) - MAX_TRACES_LISTED} more" if len(group) > MAX_TRACES_LISTED else ""
            log.warning("cut %d speech response(s) after their first audio (%.1f s of audio in all): worker %s "
                        "failed (%s: %s); each client got an unfinished body (raw audio) or an SSE error event; "
                        "traces %s%s", len(group), sum(c.audio_s for c in group),
                        worker or "?", code, group[0].message, traces, more)


def mark_cut() -> None:
    """This request's response returns unfinished on purpose, and was reported (`CutReport`)."""
    _cut_on_purpose.set(True)


class QuietCutResponses(logging.Filter):
    """For uvicorn's error logger: drops its "returned without completing response" line for a
    request marked by `mark_cut` (the record is made in that request's task), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == UVICORN_INCOMPLETE and _cut_on_purpose.get())
