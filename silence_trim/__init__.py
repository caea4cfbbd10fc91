"""silence_trim: measure and remove head-of-line silence, offline for datasets and live on streams.

Pure audio math on numpy (soxr and onnxruntime for the VAD, loaded only when it is used); no torch.

    measure(audio, sr, "energy" | "vad")            -> SilenceReport
    trim(audio, sr, TrimOptions())                  -> TrimResult      (arrays)
    trim_file(src, dst) / trim_folder(src, dst)     -> FileTrim / [FileTrim]
    StreamTrimmer(24000).push(chunk) ... .flush()   -> audio to send on; .result -> HeadDrop
    SileroVad()                                     the VAD model session: build once, pass it in
"""

from silence_trim.audio_io import AudioFile, read_audio, write_audio
from silence_trim.detect import Detector, make_detector, measure
from silence_trim.energy import EnergyDetector, EnergyParams
from silence_trim.errors import (
    AudioFileError,
    ChannelLayoutError,
    InvalidAudioError,
    InvalidOptionsError,
    NonFiniteAudioError,
    SilenceTrimError,
    StreamClosedError,
    UnsupportedDtypeError,
    VadUnavailableError,
)
from silence_trim.report import DETECTORS, DetectorName, Onset, SilenceReport
from silence_trim.stream import HeadDrop, StreamOptions, StreamTrimmer
from silence_trim.trim import FileTrim, TrimOptions, TrimResult, summarize, trim, trim_file, trim_folder
from silence_trim.vad import SileroVad, shipped_model_path
from silence_trim.vad_detector import VadDetector, VadParams

__all__ = [
    "DETECTORS",
    "AudioFile",
    "AudioFileError",
    "ChannelLayoutError",
    "Detector",
    "DetectorName",
    "EnergyDetector",
    "EnergyParams",
    "FileTrim",
    "HeadDrop",
    "InvalidAudioError",
    "InvalidOptionsError",
    "NonFiniteAudioError",
    "Onset",
    "SilenceReport",
    "SilenceTrimError",
    "SileroVad",
    "StreamClosedError",
    "StreamOptions",
    "StreamTrimmer",
    "TrimOptions",
    "TrimResult",
    "UnsupportedDtypeError",
    "VadDetector",
    "VadParams",
    "VadUnavailableError",
    "make_detector",
    "measure",
    "read_audio",
    "shipped_model_path",
    "summarize",
    "trim",
    "trim_file",
    "trim_folder",
    "write_audio",
]
