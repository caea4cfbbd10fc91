"""Frame levels: dBFS of detrended RMS, blind to DC and hum, identical whatever the chunking."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from silence_trim.levels import FLOOR_DB, LevelMeter, frame_length, frame_levels_db
from tests.fixtures.speech import hum, white_noise

SR = 24000
FRAME = frame_length(SR, 5.0)


def test_frame_is_5_ms_at_any_rate():
    assert [frame_length(sr, 5.0) for sr in (8000, 16000, 22050, 24000, 44100, 48000)] == [40, 80, 110, 120, 220, 240]


def test_a_full_scale_sine_reads_minus_3_dbfs_and_silence_reads_the_floor():
    t = np.arange(SR) / SR
    assert np.allclose(frame_levels_db(np.sin(2 * np.pi * 1000 * t), FRAME), -3.01, atol=0.15)
    assert (frame_levels_db(np.zeros(SR), FRAME) == FLOOR_DB).all()


def test_dc_offset_is_invisible():
    assert (frame_levels_db(np.full(SR, 0.25), FRAME) == FLOOR_DB).all()


def test_mains_hum_is_suppressed_by_more_than_30_db():
    for hz in (50.0, 60.0):
        levels = frame_levels_db(hum(SR, SR, -20.0, hz=hz), FRAME)
        assert levels.max() < -20.0 - 30.0, (hz, levels.max())


def test_white_noise_reads_its_rms_level():
    levels = frame_levels_db(white_noise(SR, -45.0), FRAME)
    assert abs(np.median(levels) - (-45.0)) < 0.5


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=3 * SR // 10), max_size=12))
def test_chunked_levels_equal_whole_levels_bit_for_bit(cuts):
    x = white_noise(3 * SR // 10, -30.0, seed=3) + hum(3 * SR // 10, SR, -25.0)
    meter = LevelMeter(FRAME)
    bounds = [0, *sorted(cuts), x.size]
    chunked = [meter.push(x[a:b]) for a, b in zip(bounds, bounds[1:])]
    chunked.append(meter.finish())
    assert np.array_equal(np.concatenate(chunked), frame_levels_db(x, FRAME))
