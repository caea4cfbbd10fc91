"""The silero-vad model, run from the ONNX file its wheel ships, with onnxruntime (no torch).

`SileroVad` owns one onnxruntime session; construct it once (about 50 ms) and pass it to every
detector that needs it. Each clip or stream gets its own `VadStream`, which carries the model's
recurrent state and the 64-sample context between 512-sample windows at 16 kHz, as the model
expects. The package data is located through the installed distribution's file list, so the
`silero_vad` Python package (which imports torch) is never imported.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np

from silence_trim.errors import VadUnavailableError

SAMPLE_RATE = 16000
WINDOW = 512  # samples per model call at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window prepended to each call
_MODEL_FILE = "silero_vad/data/silero_vad.onnx"
_INSTALL_HINT = "pip install --no-deps silero-vad onnxruntime (the model file is used, not its torch code)"


def shipped_model_path() -> Path:
    """Path of the ONNX model inside the installed silero-vad wheel."""
    try:
        dist = metadata.distribution("silero-vad")
    except metadata.PackageNotFoundError:
        raise VadUnavailableError(f"silero-vad is not installed: {_INSTALL_HINT}") from None
    path = Path(str(dist.locate_file(_MODEL_FILE)))
    if not path.is_file():
        raise VadUnavailableError(f"silero-vad {dist.version} has no {_MODEL_FILE}: reinstall it ({_INSTALL_HINT})")
    return path


class SileroVad:
    """One onnxruntime session of the silero VAD model; streams share it, not their state."""

    def __init__(self, model_path: Path | str | None = None, *, threads: int = 1) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise VadUnavailableError(f"onnxruntime is not installed: {_INSTALL_HINT}") from None
        self.model_path = Path(model_path) if model_path is not None else shipped_model_path()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(
                str(self.model_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # onnxruntime raises its own exception types
            raise VadUnavailableError(f"cannot load the VAD model {self.model_path}: {err}") from err
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def stream(self) -> VadStream:
        """Fresh model state for one clip or stream."""
        return VadStream(self)

    def probabilities(self, audio_16k: np.ndarray) -> np.ndarray:
        """Speech probability of each 32 ms window of a whole 16 kHz clip (the last one zero-padded)."""
        stream = self.stream()
        return np.concatenate([stream.push(audio_16k), stream.finish()])

    def _step(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        # window: [1, CONTEXT + WINDOW] float32; state: [2, 1, 128] float32
        prob, state = self._session.run(None, {"input": window, "state": state, "sr": self._sr})
        return float(prob[0, 0]), state


class VadStream:
    """Per-stream model state: feed 16 kHz float samples, get one probability per 512-sample window."""

    def __init__(self, model: SileroVad) -> None:
        self._model = model
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)

    def push(self, audio_16k: np.ndarray) -> np.ndarray:
        """Probabilities of the windows completed by `audio_16k`."""
        x = np.concatenate([self._pending, audio_16k.astype(np.float32)])
        whole = x.size // WINDOW * WINDOW
        self._pending = x[whole:]
        return np.array([self._window(w) for w in x[:whole].reshape(-1, WINDOW)], dtype=np.float64)

    def finish(self) -> np.ndarray:
        """Probability of the last, partial window (zero-padded), if any."""
        if not self._pending.size:
            return np.zeros(0)
        window = np.zeros(WINDOW, dtype=np.float32)
        window[: self._pending.size] = self._pending
        self._pending = np.zeros(0, dtype=np.float32)
        return np.array([self._window(window)])

    def _window(self, samples: np.ndarray) -> float:
        samples = samples - samples.mean(dtype=np.float32)  # a DC offset is not speech; the model was not trained on it
        framed = np.concatenate([self._context, samples])[None, :]  # [1, CONTEXT + WINDOW]
        prob, self._state = self._model._step(framed, self._state)
        self._context = samples[-CONTEXT:].copy()
        return prob
