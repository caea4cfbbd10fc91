"""The upload checks in a training job: the whole-audio measures on each file as preprocessing
reads it, the upload's totals at the end, and one `UploadCheckError` listing every block.

The job re-runs the cheap checks too (a CLI job never passed a gateway; they cost nothing next to
the decode): `merge` in the pipeline drops those the gateway already reported.
"""

from __future__ import annotations

import numpy as np

from lora_training.errors import UploadCheckError
from lora_training.quality.checks import Clipping, check_recording, check_upload
from lora_training.quality.findings import Finding, blocks, to_dicts
from lora_training.quality.signal import voiced_share
from lora_training.quality.thresholds import CheckThresholds

__all__ = ["JobChecks"]


class JobChecks:
    """Findings gathered over one job's files. `speakers`: also run the second-speaker check
    (lora_training.quality.speakers, a speaker model per job: ~seconds per minute of speech)."""

    def __init__(self, thresholds: CheckThresholds | None = None, *, speakers: bool = False) -> None:
        self.thresholds = thresholds or CheckThresholds()
        self.findings: list[Finding] = []
        self._speakers = speakers
        self._windows: dict = {}
        self._encoder = None

    def file(self, recording, regions: list[tuple[int, int]]) -> None:
        """One decoded file (`ingest.Recording`) and its speech regions (24 kHz samples)."""
        self.findings += check_recording(recording.name, recording.audio, recording.source_rate, regions,
                                         self.thresholds, channels=recording.channels,
                                         clipping=Clipping.of(recording))
        if self._speakers:
            self._embed(recording.name, recording.audio, regions)

    def _embed(self, name: str, audio: np.ndarray, regions: list[tuple[int, int]]) -> None:
        from lora_training.quality.speaker import SpeakerEncoder  # torch: the trainer has it

        if self._encoder is None:
            self._encoder = SpeakerEncoder.load("cpu")
        voiced = [(a, b) for a, b in regions if voiced_share(audio[a:b]) >= self.thresholds.speaker_min_voiced_share]
        self._windows[name] = self._encoder.embed_windows(audio, 24000, voiced)

    def finish(self, speech_s: float) -> list[dict]:
        """The upload's findings as dicts (ClipSet report `checks`); UploadCheckError on any block."""
        self.findings += check_upload(speech_s, self.thresholds)
        if self._speakers and self._windows:
            from lora_training.quality.speakers import second_speaker

            self.findings += second_speaker(self._windows, self.thresholds)
        refused = blocks(self.findings)
        if refused:
            raise UploadCheckError(refused)
        return to_dicts(self.findings)
