"""One voice-id grammar (hashring.records.VOICE_ID) for the ring's adapters, publish and training,
anchored so nothing trails a valid id, and never echoed whole in an error."""

from __future__ import annotations

import pytest

import gpu_worker.adapters
import hashring.records
from gpu_worker.adapters import AdapterStore, publish_adapter
from gpu_worker.errors import UnknownVoice
from hashring.records import VOICE_ID, shown_voice_id, valid_voice_id


def test_there_is_one_definition():
    assert gpu_worker.adapters.VOICE_ID is hashring.records.VOICE_ID
    assert gpu_worker.adapters.valid_voice_id is hashring.records.valid_voice_id


@pytest.mark.parametrize("voice", ["tara", "acme/tara", "a", "v1.2_x-y", "a" * 128, f"{'t' * 128}/{'n' * 128}"])
def test_valid_ids(voice):
    assert valid_voice_id(voice) and VOICE_ID.match(voice)


@pytest.mark.parametrize("voice", ["tara\n", "acme/tara\n", "\ntara", "", "a" * 129, "a/b/c", "../etc", "a/..",
                                   ".staging/x", "/tara", "tara/", "ta ra", "tära", None, 7])
def test_invalid_ids(voice):
    assert not valid_voice_id(voice)
    if isinstance(voice, str):
        assert VOICE_ID.match(voice) is None  # callers that use .match (lora_training) get the same answer


def test_a_trailing_newline_is_never_published(stand_in, tmp_path):
    with pytest.raises(ValueError, match=r"voice id 'tara\\n' is invalid"):
        publish_adapter(stand_in.voice("tara"), tmp_path / "store", "tara\n")
    assert not (tmp_path / "store").exists()


def test_training_refuses_a_trailing_newline():
    from lora_training.errors import InputError
    from lora_training.publish import voice_id

    with pytest.raises(InputError):
        voice_id("acme", "tara\n")
    assert voice_id("acme", "tara") == "acme/tara"


def test_a_huge_id_is_not_echoed_whole(tmp_path):
    with pytest.raises(UnknownVoice) as err:
        AdapterStore(tmp_path).resolve("x" * 100_000)
    assert len(err.value.message) < 200 and "x" * 64 + "…" in err.value.message
    assert shown_voice_id("tara") == "'tara'" and shown_voice_id("y" * 65) == repr("y" * 64 + "…")
