"""The speech endpoint's `speed` (0.25 to 4.0): time-stretch the PCM without moving its pitch.

`SpeedChanger` streams like the encoders (feed PCM, get back the stretched PCM ready now, close
for the rest) through ffmpeg's `atempo` filter in a PyAV filter graph. atempo overlap-adds
windows of some 40 ms at a new spacing, so the voice keeps its pitch. One atempo takes 0.5 to
100 in the ffmpeg PyAV bundles (only up to 2.0 in old ffmpeg): speeds under 0.5 run as a chain
of 0.5 stages, and speeds over 2 run in one filter, since a 2 x 2 chain holds back about twice
as much. speed 1.0 builds no graph: feed returns its input, the same bytes.

Audio held back (input fed but not yet answered), measured at 24 kHz with 2048-sample (85 ms)
and 1024-sample chunks, asserted for 2048 by tests/gateway/test_speed.py:

    speed        held back at most        first output returned by
    0.25 - 1.25  1326 samples (55 ms)     the first 2048-sample chunk
    1.5 - 2.5    2037 samples (85 ms)     the first 2048-sample chunk
    3.0 - 4.0    2532 samples (106 ms)    the second chunk: atempo at 3 to 4 needs ~2600 samples

Input goes into the graph in 256-sample frames because atempo hands on one output frame per
input frame once that frame is full: a whole 2048-sample frame would come out a chunk later.
Output is `speed` times shorter than the input to within 60 ms (the flush drops a part window).
"""

from __future__ import annotations

import math
from fractions import Fraction
from types import TracebackType

import av

from gateway.api.encode import PcmCarry, pcm_frame

__all__ = ["MAX_SPEED", "MIN_SPEED", "SpeedChanger", "atempo_stages", "check_speed"]

MIN_SPEED = 0.25
MAX_SPEED = 4.0
_MIN_STAGE = 0.5  # the slowest one atempo filter goes
_PUSH_BYTES = 2 * 256  # 256 samples per frame pushed into the graph


def check_speed(speed: float) -> float:
    """`speed` itself when OpenAI's API accepts it; ValueError saying the range otherwise."""
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed:g}")
    return speed


def atempo_stages(speed: float) -> tuple[float, ...]:
    """atempo factors whose product is `speed`, none slower than one filter goes (0.25 -> 0.5 x 0.5)."""
    stages: list[float] = []
    while speed < _MIN_STAGE:
        stages.append(_MIN_STAGE)
        speed /= _MIN_STAGE
    return (*stages, speed)


def _build_graph(stages: tuple[float, ...], sample_rate: int) -> av.filter.Graph:
    """abuffer -> atempo per stage -> aformat (back to mono s16 at the input rate) -> abuffersink."""
    graph = av.filter.Graph()
    source = graph.add_abuffer(
        sample_rate=sample_rate, format="s16", layout="mono", time_base=Fraction(1, sample_rate)
    )
    tempos = [graph.add("atempo", tempo=repr(stage)) for stage in stages]
    output = graph.add("aformat", sample_fmts="s16", sample_rates=str(sample_rate), channel_layouts="mono")
    graph.link_nodes(source, *tempos, output, graph.add("abuffersink")).configure()
    return graph


def _drain(graph: av.filter.Graph) -> bytes:
    """Every frame the graph has ready, as s16le bytes."""
    out: list[bytes] = []
    while True:
        try:
            frame = graph.pull()
        except (av.BlockingIOError, av.EOFError):
            return b"".join(out)
        out.append(frame.to_ndarray().tobytes())  # [1, n] int16


class SpeedChanger:
    """Time-stretches one stream of mono s16le PCM by `speed`, keeping its pitch.

    Output is `speed` times shorter (to within one atempo window). ValueError for a speed
    outside 0.25 to 4.0 or not finite. A context manager: exit releases the graph.
    """

    def __init__(self, speed: float, sample_rate: int = 24000) -> None:
        self.speed = check_speed(speed)
        self._sample_rate = sample_rate
        self._graph = None if self.speed == 1.0 else _build_graph(atempo_stages(self.speed), sample_rate)
        self._carry = PcmCarry()
        self._pts = 0
        self._closed = False

    def feed(self, pcm: bytes) -> bytes:
        """Stretch s16le PCM of any length; return the stretched PCM ready now, possibly b""."""
        if self._closed:
            raise ValueError("feed() after close(): make a new SpeedChanger for each stream")
        if self._graph is None:
            return pcm
        samples = self._carry.whole(pcm)
        for start in range(0, len(samples), _PUSH_BYTES):
            frame = pcm_frame(samples[start:start + _PUSH_BYTES], self._sample_rate, self._pts)
            self._pts += frame.samples
            self._graph.push(frame)
        return _drain(self._graph)

    def close(self) -> bytes:
        """Flush the filter and return the rest; later calls return b"". A stray odd byte is dropped."""
        if self._closed:
            return b""
        self._closed = True
        graph, self._graph = self._graph, None
        if graph is None:
            return b""
        graph.push(None)
        return _drain(graph)

    def __enter__(self) -> SpeedChanger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
