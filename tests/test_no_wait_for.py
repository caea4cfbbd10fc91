"""No `asyncio.wait_for` in the processes that serve: on Python 3.11 (CI's and the images')
it returns the awaited result and drops a cancel that lands in the same loop turn (bpo-42130),
so a cancelled context went on speaking its whole backlog. `asyncio.timeout` keeps the cancel.
Checked from the source, like the gateway's import rule."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVING = ("gateway", "gpu_worker", "hashring", "voicering")


def wait_for_calls(source: str) -> list[int]:
    """Lines calling ``asyncio.wait_for`` (a watcher's own ``wait_for`` method is not it)."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"]


def test_the_check_finds_a_call():
    assert wait_for_calls("import asyncio\nasync def f(q):\n    return await asyncio.wait_for(q.get(), 1)\n") == [3]
    assert wait_for_calls("async def f(watcher):\n    await watcher.wait_for(lambda v: v, 1)\n") == []


def test_no_serving_package_calls_asyncio_wait_for():
    found = [f"{path.relative_to(ROOT)}:{line}" for package in SERVING for path in sorted((ROOT / package).rglob("*.py"))
             for line in wait_for_calls(path.read_text())]
    assert found == [], "use `async with asyncio.timeout(...)` instead"
