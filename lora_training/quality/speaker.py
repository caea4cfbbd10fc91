"""`SpeakerEncoder`: who is speaking, as a 256-number voice print, from resemblyzer 0.1.4's weights.

The weights ship inside the `resemblyzer` wheel (`pretrained.pt`, Apache-2.0, a GE2E d-vector
model). The package itself is never imported (its `__init__` pulls librosa and webrtcvad): only the
file is found through the import system, pinned by sha256 and loaded with `weights_only=True` into
the small module below, which matches the checkpoint's state dict. The front end is rebuilt here:
16 kHz, 25 ms Hann window, 10 ms hop, 40 Slaney mel bands (area-normalised) of the power
spectrum, not logged; level normalised to -30 dBFS; partial contexts of 160 frames (1.6 s).

A window's embedding is a unit vector; a clip's is the normalised mean of its windows'. Scores are
cosine similarities of these vectors: they are not comparable to published SIM-o (WavLM + ECAPA).
torch is imported here only, never by the package `__init__` the gateway imports.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr
import torch
from torch import nn

from lora_training.errors import ConfigError

__all__ = [
    "WEIGHTS_SHA256",
    "MODEL_SAMPLE_RATE",
    "NoSpeech",
    "SpeakerEncoder",
    "SpeakerWeightsError",
    "SpeakerWindows",
    "cosine",
    "mel_filterbank",
    "mel_frames",
    "weights_path",
]

# resemblyzer 0.1.4 `resemblyzer/pretrained.pt`, 17,090,379 bytes
WEIGHTS_SHA256 = "39373b86598fa3da9fcddee6142382efe09777e8d37dc9c0561f41f0070f134e"
WEIGHTS_PACKAGE = "resemblyzer"
WEIGHTS_FILE = "pretrained.pt"

MODEL_SAMPLE_RATE = 16_000
N_FFT = 400  # 25 ms at 16 kHz
HOP = 160  # 10 ms
N_MELS = 40
FRAMES_PER_S = MODEL_SAMPLE_RATE // HOP  # 100
PARTIAL_FRAMES = 160  # 1.6 s: the length the model was trained on
CLIP_HOP_FRAMES = 77  # whole-clip embedding: ~1.3 partials per second, as resemblyzer embeds contexts
MIN_COVERAGE = 0.75  # the last partial is kept if at least this much of it is audio (else dropped)
TARGET_DBFS = -30.0  # level every clip is brought to before the mel front end
HIDDEN = 256
LAYERS = 3
BATCH = 256  # partials per LSTM forward: bounds memory on long uploads (~30 MB of activations)
# The LSTM's per-step matmuls are small ([B, 256] x [256, 1024]): on CPU one thread runs them at
# ~10 ms a window, while two threads on a loaded 2-core box measured 130-820 ms (OpenMP barriers).
CPU_THREADS = 1
# Speech gate used when no VAD regions are given (stand-in for resemblyzer's webrtcvad trim):
GATE_FRAME_S = 0.03
GATE_BELOW_PEAK_DB = 40.0  # a 30 ms frame this far below the clip's loud frames is silence
GATE_KEEP_PAUSE_S = 0.2  # pauses up to this long stay (as resemblyzer keeps short pauses)


class SpeakerWeightsError(ConfigError):
    """The speaker model's weights are missing or are not the pinned file: a trainer set-up fault
    (ConfigError: the job fails at once with it, no retry can fix the install)."""


class NoSpeech(ValueError):
    """A clip given to the encoder holds no speech to embed."""


@dataclass(frozen=True, slots=True)
class SpeakerWindows:
    """Embeddings of 1.6 s windows over a clip's speech. `start_s`/`end_s` [N] are in the clip's own
    time (a window over a trimmed pause spans it); `vectors` [N, 256] float32 are unit vectors."""

    start_s: np.ndarray
    end_s: np.ndarray
    vectors: np.ndarray

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def centroid(self) -> np.ndarray:
        """The normalised mean of the windows: the clip's voice print."""
        return _unit(self.vectors.mean(axis=0))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two embeddings (1: same direction)."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / denom) if denom > 0 else 0.0


def weights_path() -> Path:
    """Where resemblyzer's `pretrained.pt` lies, found without running the package's `__init__`."""
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SpeakerWeightsError(
            "the speaker model's weights are not installed: install resemblyzer==0.1.4 with --no-deps "
            "(its pretrained.pt is used; librosa and webrtcvad are not needed)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / WEIGHTS_FILE


def check_weights(path: Path) -> None:
    """Refuse any file but the pinned one: a changed checkpoint would silently move every score."""
    if not path.is_file():
        raise SpeakerWeightsError(f"speaker model weights not found at {path}: reinstall resemblyzer==0.1.4 --no-deps")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise SpeakerWeightsError(
            f"speaker model weights at {path} have sha256 {digest}, expected {WEIGHTS_SHA256} "
            "(resemblyzer 0.1.4): reinstall resemblyzer==0.1.4 --no-deps, or re-calibrate the speaker "
            "thresholds and update WEIGHTS_SHA256 on purpose"
        )


# ---- mel front end (numpy) ----


def hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear (3 mel per 200 Hz) below 1 kHz, logarithmic above (27 mel per
    factor 6.4), as in the Auditory Toolbox and librosa's default (htk=False)."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / (200.0 / 3.0)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hz >= 1000.0, log_part, linear)


def mel_to_hz(mel: np.ndarray | float) -> np.ndarray:
    """Inverse of `hz_to_mel`."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * (200.0 / 3.0)
    log_part = 1000.0 * np.exp((mel - 15.0) * (np.log(6.4) / 27.0))
    return np.where(mel >= 15.0, log_part, linear)


def mel_filterbank(sample_rate: int = MODEL_SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """[n_mels, n_fft // 2 + 1] triangular filters from 0 Hz to Nyquist, equally spaced in Slaney mel,
    each scaled by 2 / (its width in Hz) so every band has the same area ("slaney" normalisation)."""
    bins_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    edges_hz = mel_to_hz(np.linspace(0.0, float(hz_to_mel(sample_rate / 2.0)), n_mels + 2))
    lo, mid, hi = edges_hz[:-2, None], edges_hz[1:-1, None], edges_hz[2:, None]
    rising = (bins_hz[None, :] - lo) / (mid - lo)
    falling = (hi - bins_hz[None, :]) / (hi - mid)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    return (triangles * (2.0 / (hi - lo))).astype(np.float32)


def mel_frames(wav: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """[T, 40] mel power frames of 16 kHz float audio: centred frames (reflect-padded by half a window,
    T = 1 + len // hop), periodic Hann, |FFT|^2, mel filters. Not logged: the model takes power."""
    pad = N_FFT // 2
    mode = "reflect" if wav.size > pad else "constant"
    padded = np.pad(wav.astype(np.float32), pad, mode=mode)
    count = 1 + (padded.size - N_FFT) // HOP
    frames = np.lib.stride_tricks.as_strided(
        padded, shape=(count, N_FFT), strides=(padded.strides[0] * HOP, padded.strides[0])
    )  # [T, 400]
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # [T, 201]
    return (power.astype(np.float32) @ filters.T).astype(np.float32)  # [T, 40]


# ---- audio preparation ----


def to_float(audio: np.ndarray) -> np.ndarray:
    """Mono float32 at full scale 1.0 (int16 PCM is scaled)."""
    x = np.asarray(audio)
    if x.ndim != 1:
        raise ValueError(f"speaker embedding takes mono audio, got shape {x.shape}: mix it down first")
    if x.dtype == np.int16:
        return x.astype(np.float32) / 32768.0
    return x.astype(np.float32)


def speech_mask(audio: np.ndarray, sample_rate: int, regions: list[tuple[int, int]] | None) -> np.ndarray:
    """Which samples are speech: the given (first, last) sample regions, or, without them, every 30 ms
    frame within 40 dB of the clip's loud frames, short pauses kept."""
    mask = np.zeros(audio.size, dtype=bool)
    if regions is not None:
        for first, last in regions:
            mask[max(0, int(first)):max(0, int(last) + 1)] = True
        return mask
    frame = max(1, round(GATE_FRAME_S * sample_rate))
    count = audio.size // frame + (audio.size % frame > 0)
    padded = np.zeros(count * frame, dtype=np.float32)
    padded[:audio.size] = audio
    energy = (padded.reshape(count, frame).astype(np.float64) ** 2).mean(axis=1)
    if count == 0 or energy.max() <= 0:
        return mask
    loud = np.percentile(energy[energy > 0], 95)
    voiced = energy > loud * 10 ** (-GATE_BELOW_PEAK_DB / 10)
    keep = _close_gaps(voiced, round(GATE_KEEP_PAUSE_S / GATE_FRAME_S))
    return np.repeat(keep, frame)[:audio.size]


def _close_gaps(flags: np.ndarray, max_gap: int) -> np.ndarray:
    """Fill runs of False no longer than `max_gap` that lie between True frames."""
    out = flags.copy()
    on = np.flatnonzero(flags)
    if on.size < 2:
        return out
    gaps = np.flatnonzero(np.diff(on) > 1)
    for g in gaps:
        a, b = on[g], on[g + 1]
        if b - a - 1 <= max_gap:
            out[a + 1:b] = True
    return out


def normalise_level(wav: np.ndarray, target_dbfs: float = TARGET_DBFS) -> np.ndarray:
    """Scale to `target_dbfs` RMS: the model reads power, so level must not decide who speaks."""
    rms = float(np.sqrt(np.mean(wav.astype(np.float64) ** 2))) if wav.size else 0.0
    if rms <= 0:
        return wav
    return (wav * (10 ** (target_dbfs / 20) / rms)).astype(np.float32)


def partial_starts(n_frames: int, hop_frames: int, length: int = PARTIAL_FRAMES) -> list[int]:
    """First frames of the windows covering `n_frames`: a last window at least MIN_COVERAGE full is
    kept (zero-padded), a thinner one dropped, and a clip shorter than one window gives one window."""
    starts = list(range(0, max(1, n_frames - length + hop_frames + 1), hop_frames))
    if len(starts) > 1 and (n_frames - starts[-1]) / length < MIN_COVERAGE:
        starts.pop()
    return starts


def _unit(v: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(v))
    return (v / norm).astype(np.float32) if norm > 0 else v.astype(np.float32)


# ---- the network ----


class DVectorNet(nn.Module):
    """resemblyzer's voice encoder: 3-layer LSTM 40 -> 256, last layer's final hidden state, Linear
    256 -> 256, ReLU, L2 normalisation. Parameter names match `pretrained.pt`'s `model_state`."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, HIDDEN, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN, HIDDEN)
        self.relu = nn.ReLU()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        # mels: [B, 160, 40]
        _, (hidden, _) = self.lstm(mels)  # hidden: [3, B, 256]
        raw = self.relu(self.linear(hidden[-1]))  # [B, 256]
        return raw / torch.linalg.vector_norm(raw, dim=1, keepdim=True).clamp_min(1e-12)


class SpeakerEncoder:
    """Embeds clips and windows of clips. Load once per process (or job) and pass it in."""

    def __init__(self, net: DVectorNet, device: torch.device) -> None:
        self._net = net
        self._device = device
        self._filters = mel_filterbank()

    @classmethod
    def load(cls, device: str = "cpu") -> SpeakerEncoder:
        path = weights_path()
        check_weights(path)
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state = {k: v for k, v in checkpoint["model_state"].items() if k.startswith(("lstm.", "linear."))}
        net = DVectorNet()
        net.load_state_dict(state, strict=True)  # GE2E's similarity_weight/bias are training-only
        net.eval()
        target = torch.device(device)
        return cls(net.to(target), target)

    def embed(self, audio: np.ndarray, sample_rate: int = 24000) -> np.ndarray:
        """One [256] unit vector for the whole clip (its silences trimmed). Raises NoSpeech."""
        mels = self._speech_mels(audio, sample_rate, None)[0]
        vectors = self._forward(mels, partial_starts(mels.shape[0], CLIP_HOP_FRAMES))
        return _unit(vectors.mean(axis=0))

    def embed_windows(
        self,
        audio: np.ndarray,
        sample_rate: int = 24000,
        regions: list[tuple[int, int]] | None = None,
        window_s: float = 1.6,
        hop_s: float = 0.8,
    ) -> SpeakerWindows:
        """Windows of `window_s` every `hop_s` over the clip's speech: over `regions` ((first, last)
        samples at `sample_rate`, e.g. from VAD) when given, else over the clip with silences
        trimmed. Pauses are cut out before windowing, so a window holds `window_s` of speech.
        No speech: zero windows."""
        length = max(1, round(window_s * FRAMES_PER_S))
        hop = max(1, round(hop_s * FRAMES_PER_S))
        try:
            mels, times = self._speech_mels(audio, sample_rate, regions)
        except NoSpeech:
            empty = np.zeros(0, dtype=np.float64)
            return SpeakerWindows(empty, empty.copy(), np.zeros((0, HIDDEN), dtype=np.float32))
        starts = partial_starts(mels.shape[0], hop, length)
        vectors = self._forward(mels, starts, length)
        first = np.array(starts, dtype=np.int64) * HOP  # samples of the speech-only signal
        last = np.minimum(first + length * HOP, times.size) - 1
        return SpeakerWindows(
            start_s=times[np.minimum(first, times.size - 1)].astype(np.float64),
            end_s=times[last].astype(np.float64) + 1.0 / MODEL_SAMPLE_RATE,
            vectors=vectors,
        )

    def _speech_mels(
        self, audio: np.ndarray, sample_rate: int, regions: list[tuple[int, int]] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mel frames [T, 40] of the clip's speech only, at 16 kHz and -30 dBFS, and each of its
        16 kHz samples' time in the original clip (s)."""
        wav = to_float(audio)
        if not np.all(np.isfinite(wav)):
            raise ValueError("audio holds NaN or infinite samples: decode it again")
        mask = speech_mask(wav, sample_rate, regions)
        if sample_rate != MODEL_SAMPLE_RATE:
            wav = soxr.resample(wav, sample_rate, MODEL_SAMPLE_RATE, quality="HQ").astype(np.float32)
            at = np.minimum((np.arange(wav.size) * sample_rate) // MODEL_SAMPLE_RATE, mask.size - 1)
            mask = mask[at] if mask.size else np.zeros(wav.size, dtype=bool)
        kept = np.flatnonzero(mask)
        if kept.size < HOP or not np.any(wav[kept]):
            raise NoSpeech("the clip holds no speech to compare voices on (silent, or shorter than 10 ms)")
        speech = normalise_level(wav[kept])
        return mel_frames(speech, self._filters), kept / MODEL_SAMPLE_RATE

    def _forward(self, mels: np.ndarray, starts: list[int], length: int = PARTIAL_FRAMES) -> np.ndarray:
        """[len(starts), 256] unit vectors: the partials cut from `mels` (zero-padded past its end),
        batched through the network."""
        need = starts[-1] + length
        if need > mels.shape[0]:
            mels = np.pad(mels, ((0, need - mels.shape[0]), (0, 0)))
        index = np.asarray(starts)[:, None] + np.arange(length)[None, :]  # [N, 160]
        partials = mels[index]  # [N, 160, 40]
        out = []
        threads = torch.get_num_threads()
        if self._device.type == "cpu":
            torch.set_num_threads(CPU_THREADS)
        try:
            with torch.inference_mode():
                for i in range(0, len(starts), BATCH):
                    batch = torch.from_numpy(np.ascontiguousarray(partials[i:i + BATCH])).to(self._device)
                    out.append(self._net(batch).cpu().numpy())  # [b, 256]
        finally:
            torch.set_num_threads(threads)
        return np.concatenate(out).astype(np.float32)
