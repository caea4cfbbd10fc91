"""Public names of lora_training resolve, and importing the package (or its CLI) stays light."""

import subprocess
import sys

import lora_training


def test_every_public_name_resolves():
    for name in lora_training.__all__:
        assert getattr(lora_training, name) is not None, name


def test_package_and_cli_import_nothing_heavy():
    code = ("import sys, lora_training, lora_training.cli, lora_training.jobs, lora_training.consumer; "
            "print(','.join(m for m in ('torch', 'vllm', 'transformers', 'peft') if m in sys.modules))")
    heavy = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert heavy == ""


def test_the_queue_redis_falls_back_to_the_fleet_s_url(monkeypatch):
    """A trainer in a fleet reads the same VOICERING_REDIS_URL as the gateway, agent and ring CLI;
    its own VOICERING_TRAIN_REDIS_URL (or an option) wins."""
    from lora_training.settings import TrainSettings

    monkeypatch.delenv("VOICERING_TRAIN_REDIS_URL", raising=False)
    monkeypatch.setenv("VOICERING_REDIS_URL", "redis://fleet:6379/0")
    assert TrainSettings().redis_url == "redis://fleet:6379/0"
    monkeypatch.setenv("VOICERING_TRAIN_REDIS_URL", "redis://train:6379/1")
    assert TrainSettings().redis_url == "redis://train:6379/1"
    assert TrainSettings(redis_url="redis://given:1/0").redis_url == "redis://given:1/0"
