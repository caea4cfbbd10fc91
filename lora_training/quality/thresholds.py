"""`CheckThresholds`: every limit the upload checks hold audio to, in one versioned object.

The version is stored with each voice's `checks` and report, so a finding can always be read
against the limits it was made with. Change a value: bump `version`. Starting values follow
../docs/training.md (commercial services' published requirements), to be calibrated on real
uploads. Speech-amount limits stay in `DataParams` (they decide what a job trains on).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["CheckThresholds"]


class CheckThresholds(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str = "2026-12-2"
    # speech after VAD, whole upload (DataParams.min_speech_s still refuses below its own minimum)
    warn_speech_s: float = 480.0  # < 8 min: the clone will be weaker
    # the file's own sample rate (DataParams.min_sample_rate refuses below its own minimum first)
    block_sample_rate: int = 16_000
    warn_sample_rate: int = 22_050  # below: upsampled to 24 kHz, nothing above rate / 2
    # real bandwidth: the frequency below which 99.9 % of the speech energy lies
    block_rolloff_hz: float = 3_800.0  # phone audio or 8 kHz upsampled: nothing above ~4 kHz
    warn_rolloff_hz: float = 7_000.0
    # clipping: share of speech samples at full scale, and the longest run of them
    block_clipped_fraction: float = 0.005
    warn_clipped_run: int = 3
    # loudness (ITU-R BS.1770 integrated, LUFS)
    block_loudness_lufs: float = -45.0
    warn_loudness_low_lufs: float = -30.0
    warn_loudness_high_lufs: float = -14.0
    # SNR (dB, WADA over speech with the VAD noise floor)
    block_snr_db: float = 15.0
    warn_snr_db: float = 25.0
    # a second speaker: share of the upload's speech
    block_second_speaker_fraction: float = 0.30
    warn_second_speaker_fraction: float = 0.10
    # the upload's windows split in two are one voice while the halves' centroids are at least this
    # alike (cosine, resemblyzer d-vectors; calibration in docs/training.md "Speaker checks")
    second_speaker_centroid_similarity: float = 0.80
    # spoken consent: the recording must reach the upload's own spread (5th-percentile window
    # similarity to the upload's centroid) less this margin, and never less than the floor
    consent_speaker_margin: float = 0.05
    consent_min_similarity: float = 0.75
    # a speech region enters the second-speaker check only if this share of its 40 ms frames is
    # voiced (a pitch peak in 60-400 Hz): noise bursts the level gate let through are not a voice
    # (espeak-ng speech 0.55-0.68, 0.34 at 10 dB SNR; white or low-passed noise 0.0)
    speaker_min_voiced_share: float = 0.2
    # reverberation: the decay time read from the speech's offsets (quality.rooms.reverb_s, s); dry
    # espeak-ng reads 0.27-0.31 s, sox `reverb 30` 0.55 s, an exponential room of RT60 0.6 s 0.59 s
    warn_reverb_s: float = 0.6
    # a voice under the speaker (quality.signal.voice_under): share of a file's 40 ms frames that are
    # quiet and voiced, echo tails left out (clean, noisy, humming and reverberant espeak-ng <= 0.063; a
    # voice 20-30 dB under 0.135-0.21, 12 dB under 0.048-0.092, 0-6 dB under <= 0.03: not seen); it
    # blocks when that voice is also loud: its median level within this many dB of the speaker's
    warn_voice_under_fraction: float = 0.08
    block_voice_under_level_db: float = -28.0
    # spoken consent between rooms: a refused recording that sounds like another room or microphone
    # than the uploads and comes within this much of the limit is refused as "unsure: record where the
    # uploads were made", not as another person (espeak-ng across sox rooms and mics: 120 of 141
    # genuine refusals fall in it, and 220 of 1,372 other voices, refused all the same)
    consent_room_band: float = 0.16
    # silences: share of a file, and one gap (they are trimmed: said as `fixed`)
    warn_silence_fraction: float = 0.40
    long_gap_s: float = 10.0
    # the clone report (lora_training.report): the clone's speaker similarity normalized between the
    # base voices (0) and the creator's own held-out clips (1), and its WER over the base voices' on
    # the same sentences; below / above these the report warns (or, with report_gate "block", fails)
    warn_similarity_normalized: float = 0.5
    warn_wer_over_base: float = 0.15
