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
