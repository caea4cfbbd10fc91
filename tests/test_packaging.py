"""Package boundaries and the CLI surface: light imports stay light, commands exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

LIGHT_MODULES = ["voicering.cli", "gpu_worker.protocol", "gpu_worker.client.connection", "gpu_worker.client.pool", "gpu_worker.client.routers",
                 "gpu_worker.adapters", "gpu_worker.orpheus", "hashring", "silence_trim", "voicering.stack.up",
                 "voicering.stack.demo", "voicering.stack.cli", "lora_training.espeak", "voicering.status",
                 "voicering.status.report", "voicering.status.probes", "voicering.status.terminal",
                 "voicering.status.cli", "gpu_worker.trace_context", "voicering.trace", "gpu_worker.open_cluster",
                 "gpu_worker.open_files"]


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_light_modules_never_import_torch_or_vllm(module):
    code = f"import sys, {module}; heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]; print(heavy)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"{module} pulls in {out.stdout.strip()}"


def test_cli_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "voicering", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in ("tiny-model", "worker", "say", "demo", "up", "gateway", "agent", "tenant", "ring", "trim", "bench",
                    "train", "train-worker", "jobs", "status", "trace"):
        assert command in out.stdout, command


def test_version_is_exposed():
    import voicering

    assert voicering.__all__ == ["__version__"]
    out = subprocess.run([sys.executable, "-m", "voicering", "--version"], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == voicering.__version__


def test_say_reports_an_unreachable_worker_clearly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "voicering", "say", "hi", "--voice", "tara", "--worker", "ws://127.0.0.1:9",
                          "-o", str(tmp_path / "x.wav")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3
    assert "cannot reach worker" in out.stderr


def test_every_package_directory_is_listed_for_the_wheel():
    """pyproject lists its packages (the plugin's namespace package is mapped, which find cannot do):
    a new package directory left off the list would be missing from the wheel."""
    import tomllib

    from tests.fixtures.models import REPO

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = ("voicering", "gateway", "gpu_worker", "hashring", "lora_training", "silence_trim", "bench")
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for root in roots for p in (REPO / root).rglob("__init__.py")}
    mapped = config["package-dir"]
    on_disk -= {".".join(Path(folder).parts) for folder in mapped.values()}  # installed under their mapped names
    assert set(config["packages"]) == on_disk | set(mapped) | {"gateway.api.web"}
    assert (REPO / "gateway" / "api" / "web" / "index.html").is_file()
