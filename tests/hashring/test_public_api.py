"""Public names of hashring: everything in each module's __all__ imports, and the package root
stays free of Redis and of other voicering packages."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

MODULES = ["hashring", "hashring.ring", "hashring.errors", "hashring.settings", "hashring.records",
           "hashring.store", "hashring.membership", "hashring.placement", "hashring.embedded", "hashring.simulate",
           "hashring.choice", "hashring.sizing", "hashring.fleet_view", "hashring.loops"]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name):
    module = importlib.import_module(name)
    assert module.__all__
    for public in module.__all__:
        assert hasattr(module, public), f"{name}.{public}"


def test_error_hierarchy_and_retryable_flags():
    from hashring import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.RingError)
    assert errors.RingUnavailable("x").retryable and errors.EmptyRing("x").retryable
    assert not errors.UnknownWorker("x").retryable and not errors.InvalidReplicas("x").retryable
    assert errors.RingError("x", retryable=True).retryable


def test_package_imports_nothing_from_other_voicering_packages():
    code = (
        "import sys, hashring, hashring.cli, hashring.membership, hashring.placement, hashring.embedded\n"
        "others = {'voicering', 'gateway', 'gpu_worker', 'lora_training', 'silence_trim', 'bench'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in others)\n"
        "assert not bad, bad\n"
        "import importlib; importlib.reload(hashring)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_module_imports_another_voicering_package_even_lazily():
    # Regression: `voicering ring bench` imported bench inside the command, a lazy import that the
    # check above cannot see; the benches now register themselves from voicering/cli.py.
    others = {"voicering", "gateway", "gpu_worker", "lora_training", "silence_trim", "bench"}
    found = []
    for path in sorted((Path(__file__).parents[2] / "hashring").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in others]
    assert not found, found


def test_package_root_does_not_load_redis():
    code = "import sys, hashring; assert 'redis' not in sys.modules, 'hashring root imported redis'"
    subprocess.run([sys.executable, "-c", code], check=True)
