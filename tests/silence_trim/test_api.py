"""The public face of silence_trim: names exported, and no heavy import at `import silence_trim`."""

from __future__ import annotations

import subprocess
import sys

import silence_trim


def test_every_public_name_is_importable():
    for name in silence_trim.__all__:
        assert getattr(silence_trim, name) is not None, name


def test_import_pulls_in_no_torch_and_no_model_runtime():
    code = (
        "import sys, silence_trim, silence_trim.cli\n"
        "heavy = [m for m in ('torch', 'onnxruntime', 'soxr', 'silero_vad') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_vad_runs_without_torch_or_silero_python_code(tmp_path):
    code = (
        "import sys, numpy as np, silence_trim\n"
        "vad = silence_trim.SileroVad()\n"
        "print(vad.probabilities(np.zeros(16000, dtype=np.float32)).shape)\n"
        "print('torch' in sys.modules, 'silero_vad' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["(32,)", "False False"]


def test_the_shipped_model_is_found_in_the_installed_wheel():
    path = silence_trim.shipped_model_path()
    assert path.name == "silero_vad.onnx" and path.stat().st_size > 1_000_000
