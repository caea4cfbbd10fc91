"""The worker's aligner: one espeak-ng and one silero session per process, their work run off the
event loop on its own threads, and per segment of a context a `SegmentWords` that takes the
segment's engine requests one after another (each a piece of its spoken text and that piece's
audio, exactly as the client received it) and sends the caller's words, timed on the context's
clock. The context's audio never waits for it: audio is queued to the segment's own task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gpu_worker.alignment.espeak import Espeak
from gpu_worker.alignment.reference import reference_for, spoken_spans
from gpu_worker.alignment.speech_check import SpeechChecks
from gpu_worker.alignment.timer import WordTime, WordTimer
from gpu_worker.alignment.words import CallerWords, TimedWord

__all__ = ["Aligner", "SegmentWords", "SendWords"]

log = logging.getLogger(__name__)

SendWords = Callable[[list[TimedWord], bool], Awaitable[None]]  # (words, estimated)


class Aligner:
    """Built once at a worker's start (`EspeakMissing` without libespeak-ng). Without the silero-vad
    wheel every piece is warped, speech or not, and the worker logs so once."""

    def __init__(self, sample_rate: int, *, threads: int = 1) -> None:
        self.sample_rate = sample_rate
        self._espeak = Espeak()
        try:
            self._checks: SpeechChecks | None = SpeechChecks()
        except Exception as err:  # silence_trim's VadUnavailableError: the wheel or onnxruntime is missing
            log.warning("word timings without a speech check (%s): noise would be warped like speech", err)
            self._checks = None
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="aligner")

    def segment(self, words: CallerWords, send: SendWords) -> SegmentWords:
        return SegmentWords(self, words, send)

    async def run(self, fn, *args):  # noqa: ANN001, ANN201 - any call, off the loop
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    def timer(self, text: str, spans: list[tuple[int, int]]) -> WordTimer:
        check = self._checks.new(self.sample_rate) if self._checks is not None else None
        return WordTimer(reference_for(text, self._espeak, spans), self.sample_rate, check=check)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class SegmentWords:
    """`begin(piece, offset_s)` per engine request, `feed(pcm)` its audio as it is sent,
    `end_piece()`; `await close(at_s)` after the segment's last request: every word sent by then.
    None of them but `close` waits: the work runs in the segment's own task, in order."""

    def __init__(self, aligner: Aligner, words: CallerWords, send: SendWords) -> None:
        self._aligner = aligner
        self._words = words
        self._send = send
        self._timer: WordTimer | None = None
        self._base = 0  # spoken words of the pieces before this one
        self._count = 0
        self._offset = 0.0
        self._queue: asyncio.Queue[tuple] = asyncio.Queue()
        self._task = asyncio.create_task(self._work(), name="segment-words")

    @property
    def spoken(self) -> str:
        """What the voice reads for the segment (read once, here: the prompt takes it too)."""
        return self._words.text

    def begin(self, piece: str, offset_s: float) -> None:
        self._queue.put_nowait(("begin", piece, offset_s))

    def feed(self, pcm: np.ndarray) -> None:
        self._queue.put_nowait(("audio", pcm))

    def end_piece(self) -> None:
        self._queue.put_nowait(("end",))

    async def close(self, at_s: float) -> None:
        """Wait until every piece is timed; any word no piece timed is sent at `at_s` (none, normally)."""
        self._queue.put_nowait(("close", at_s))
        await asyncio.shield(self._task)

    def cancel(self) -> None:
        self._task.cancel()

    async def _work(self) -> None:
        while True:
            kind, *args = await self._queue.get()
            if kind == "begin":
                piece, self._offset = args
                spans = spoken_spans(piece)
                self._base += self._count
                self._count = len(spans)
                self._timer = await self._aligner.run(self._aligner.timer, piece, spans) if spans else None
            elif kind == "audio" and self._timer is not None:
                await self._caller(await self._aligner.run(self._timer.push, args[0]))
            elif kind == "end" and self._timer is not None:
                timer, self._timer = self._timer, None
                await self._caller(await self._aligner.run(timer.finish))
            elif kind == "close":
                rest = self._words.rest(args[0])
                if rest:
                    await self._send(rest, True)
                return

    async def _caller(self, timed: list[WordTime]) -> None:
        words = self._words.push((self._base + w.index, self._offset + w.start_s, self._offset + w.end_s)
                                 for w in timed)
        if words:
            await self._send(words, any(w.estimated for w in timed))
