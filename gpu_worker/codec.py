"""SNAC 24 kHz codec: loading, encode, windowed decode, and the streaming decoder.

Streaming decodes windows of ``left context + new frames + right context`` and keeps exactly the
2048 samples of each new frame. The first chunk is one frame, by default decoded with one frame of
right context (first audio after 2 frames, 14 tokens; ``ChunkSchedule.first_audio_after(1)``: 7
tokens, at a cost in that frame's fidelity); later chunks grow so codec work per emitted second
falls; the final flush emits every remaining frame.

SNAC's NoiseBlock draws fresh noise on every call, so two decodes of the same codes differ. We
replace it with noise indexed by *absolute* sample position (a fixed table per codec, a per-stream
offset from the stream's seed): a window decoded at any offset sees the same noise the offline
decode of the whole context sees, so streamed audio matches offline audio.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from gpu_worker.orpheus import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME, Frame, frames_from_levels, levels_from_frames

LATENT_PER_FRAME = 4  # SNAC 24 kHz: hop 512, level-0 stride 4 -> 2048 samples per frame
NOISE_PERIOD_LATENT = 4096  # noise repeats every 4096 latent steps (~87 s)


@dataclass(frozen=True, slots=True)
class ChunkSchedule:
    """When the streaming decoder emits, and how much context each window carries (in frames).

    The first chunk's right context is the one trade: without it (first audio after 7 tokens) that
    frame is ~19 dB from the offline decode, with one frame (14 tokens, the default) ~38 dB (random
    SNAC weights), and every later window is the same either way (docs/benchmarks.md, "First audio
    after one frame").
    """

    first_frames: int = 1  # frames emitted by the first chunk
    first_right: int = 1  # right context of the first chunk: first audio after 2 frames = 14 tokens
    left: int = 2
    right: int = 2
    growth: float = 2.0
    max_frames: int = 8

    @classmethod
    def first_audio_after(cls, frames: int) -> ChunkSchedule:
        """The default schedule, its first one-frame chunk decoded once ``frames`` frames exist
        (1: no right context; at most ``right + 1``: as much as later chunks carry)."""
        default = cls()
        if not 1 <= frames <= default.right + 1:
            raise ValueError(f"first audio after {frames} frames: choose 1 to {default.right + 1}")
        return replace(default, first_frames=1, first_right=frames - 1)

    @property
    def first_audio_frames(self) -> int:
        return self.first_frames + self.first_right

    def tokens_before_first_audio(self) -> int:
        return FRAME_TOKENS * self.first_audio_frames


@dataclass(frozen=True, slots=True)
class Window:
    """Decode frames [start, end), keep the audio of frames [emit_start, emit_end)."""

    start: int
    emit_start: int
    emit_end: int
    end: int

    @property
    def emitted_frames(self) -> int:
        return self.emit_end - self.emit_start


@dataclass(slots=True)
class ChunkPlanner:
    """Pure bookkeeping: given how many frames exist, which window (if any) to decode next."""

    schedule: ChunkSchedule = field(default_factory=ChunkSchedule)
    emitted: int = 0
    _chunk: int = 0

    def next_window(self, available: int) -> Window | None:
        first = self.emitted == 0
        size = self.schedule.first_frames if first else max(1, self._chunk)
        right = self.schedule.first_right if first else self.schedule.right
        if self.emitted + size + right > available:
            return None
        window = Window(max(0, self.emitted - self.schedule.left), self.emitted, self.emitted + size,
                        self.emitted + size + right)
        self.emitted += size
        grown = math.ceil(size * self.schedule.growth) if not first else size
        self._chunk = min(self.schedule.max_frames, max(grown, 1))
        return window

    def final_window(self, available: int) -> Window | None:
        if self.emitted >= available:
            return None
        window = Window(max(0, self.emitted - self.schedule.left), self.emitted, available, available)
        self.emitted = available
        return window


class _PositionalNoise(nn.Module):
    """Stand-in for snac's NoiseBlock: same math (x + noise * linear(x)), noise by absolute position."""

    def __init__(self, linear: nn.Module, table: torch.Tensor, rate: int, offsets: list[torch.Tensor]) -> None:
        super().__init__()
        self.linear = linear
        self.register_buffer("table", table, persistent=False)  # [P * rate]
        self.rate = rate  # samples of this block per latent step
        self._offsets = offsets  # shared one-element holder: latent offset per batch item [B]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        batch, _, steps = x.shape
        start = self._offsets[0].to(x.device) * self.rate  # [B]
        index = (start[:, None] + torch.arange(steps, device=x.device)[None, :]) % self.table.numel()  # [B, T]
        noise = self.table[index].unsqueeze(1).to(x.dtype)  # [B, 1, T]
        return x + noise * self.linear(x)


class SnacCodec:
    """One SNAC model with deterministic noise. Thread-safe: calls are serialised by a lock."""

    def __init__(self, model: nn.Module, device: str = "cpu", noise_seed: int = 0) -> None:
        self.model = model.eval().to(device)
        self.device = device
        self._lock = threading.Lock()
        self._offsets: list[torch.Tensor] = [torch.zeros(1, dtype=torch.long)]
        generator = torch.Generator().manual_seed(noise_seed)
        rate = 1
        for block in self.model.decoder.model:
            stride = getattr(block, "block", None)
            if stride is None:
                continue
            layers = block.block
            transposed = layers[1]
            rate *= int(transposed.stride[0]) if hasattr(transposed, "stride") else 1
            for i, layer in enumerate(layers):
                if type(layer).__name__ == "NoiseBlock":
                    table = torch.randn(NOISE_PERIOD_LATENT * rate, generator=generator)
                    layers[i] = _PositionalNoise(layer.linear, table.to(device), rate, self._offsets)

    @classmethod
    def load(cls, source: str, device: str | None = None, noise_seed: int = 0) -> SnacCodec:
        """Load SNAC from a local snapshot directory or a hub id (config.json + pytorch_model.bin)."""
        from snac import SNAC

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = SNAC.from_pretrained(source)
        return cls(model, device=device, noise_seed=noise_seed)

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    @torch.inference_mode()
    def decode_frames(self, frames: Sequence[Frame], latent_offset: int = 0) -> np.ndarray:
        """Decode frames (placed at frame index latent_offset/4 of their stream) -> float32 [len*2048]."""
        return self.decode_batch([frames], [latent_offset])[0]

    @torch.inference_mode()
    def decode_batch(self, batch: Sequence[Sequence[Frame]], latent_offsets: Sequence[int]) -> list[np.ndarray]:
        """Equal-length windows from several streams in one call -> one float32 array each."""
        lengths = {len(frames) for frames in batch}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError("decode_batch needs non-empty windows of equal length")
        levels = [levels_from_frames(frames) for frames in batch]
        codes = [torch.tensor([lv[i] for lv in levels], dtype=torch.long, device=self.device) for i in range(3)]
        # codes: [B, T], [B, 2T], [B, 4T]
        with self._lock:
            self._offsets[0] = torch.tensor(list(latent_offsets), dtype=torch.long)
            audio = self.model.decode(codes)  # [B, 1, T * 2048]
        return [row[0].float().cpu().numpy() for row in audio]

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> list[Frame]:
        """24 kHz mono float audio -> frames (audio is zero-padded to whole frames by SNAC)."""
        x = torch.as_tensor(np.asarray(audio, dtype=np.float32), device=self.device)[None, None, :]  # [1, 1, N]
        with self._lock:
            codes = self.model.encode(x)  # [1, T], [1, 2T], [1, 4T]
        return frames_from_levels([c[0].tolist() for c in codes])

    @torch.inference_mode()
    def encode_batch(self, clips: Sequence[np.ndarray]) -> list[list[Frame]]:
        """Several clips in one call (zero-padded to the longest; each result cut to its own length)."""
        if not clips:
            return []
        longest = max(len(c) for c in clips)
        x = torch.zeros((len(clips), 1, longest), dtype=torch.float32)
        for i, clip in enumerate(clips):
            x[i, 0, : len(clip)] = torch.as_tensor(np.asarray(clip, dtype=np.float32))
        with self._lock:
            codes = self.model.encode(x.to(self.device))
        out = []
        for i, clip in enumerate(clips):
            frames = math.ceil(len(clip) / SAMPLES_PER_FRAME)
            out.append(frames_from_levels([c[i].tolist() for c in codes])[:frames])
        return out


def decode_window(codec: SnacCodec, frames: Sequence[Frame], window: Window, stream_offset: int = 0) -> np.ndarray:
    """Decode one planned window and return only the samples of its emitted frames."""
    audio = codec.decode_frames(frames[window.start:window.end], latent_offset=(stream_offset + window.start) * LATENT_PER_FRAME)
    lo = (window.emit_start - window.start) * SAMPLES_PER_FRAME
    hi = (window.emit_end - window.start) * SAMPLES_PER_FRAME
    return audio[lo:hi]


class StreamingDecoder:
    """Frames in, PCM chunks out, for one stream. Synchronous: the server runs it off the event loop.

    ``noise_offset`` (in frames) selects this stream's slice of the noise table; seed it per stream.
    """

    def __init__(self, codec: SnacCodec, schedule: ChunkSchedule | None = None, noise_offset: int = 0) -> None:
        self.codec = codec
        self.frames: list[Frame] = []
        self.planner = ChunkPlanner(schedule or ChunkSchedule())
        self.noise_offset = noise_offset

    def push(self, frame: Frame) -> np.ndarray | None:
        self.frames.append(frame)
        window = self.planner.next_window(len(self.frames))
        return None if window is None else self._decode(window)

    def flush(self) -> np.ndarray | None:
        window = self.planner.final_window(len(self.frames))
        return None if window is None else self._decode(window)

    def _decode(self, window: Window) -> np.ndarray:
        return decode_window(self.codec, self.frames, window, self.noise_offset)


def to_pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def set_cpu_threads(threads: int | None = None) -> int:
    """Torch intra-op threads for codec work on CPU: leave a core to the engine and the event loop."""
    import os

    count = threads or max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(count)
    return count
