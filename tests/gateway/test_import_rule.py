"""The gateway and the LiveKit plugin reach workers through the contract and the client side only
(issue 35): `gpu_worker.protocol`, `gpu_worker.errors`, `gpu_worker.trace_context` and
`gpu_worker.client` and `gpu_worker.text` (the packages' own faces, not their modules: the text
front end's rules, standard library only, are part of the contract: what a pronunciation
dictionary is, which tags a voice acts). Two stated exceptions: the creator path reads the adapter
store's format (`gpu_worker.adapters.layout`, `.validation`), and the processes that bind a port
apply the worker's start-up guards (`open_cluster`, `open_files`).
Read from the source (ast), so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACT = {"gpu_worker.protocol", "gpu_worker.errors", "gpu_worker.trace_context", "gpu_worker.client", "gpu_worker.text"}
CREATOR_PATH = {"gpu_worker.adapters.layout", "gpu_worker.adapters.validation"}
START_UP = {"gpu_worker.open_cluster", "gpu_worker.open_files"}
ENTRY_POINTS = {"gateway/serve.py", "gateway/livekit/agent.py", "gateway/livekit/cli.py"}


def module_imports(path: Path) -> set[str]:
    """Every module a source file imports by absolute name (read from its syntax tree)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def imported(path: Path) -> set[str]:
    return {name for name in module_imports(path) if name == "gpu_worker" or name.startswith("gpu_worker.")}


def allowed(relative: str) -> set[str]:
    rule = set(CONTRACT)
    if relative.startswith("gateway/cloning/"):
        rule |= CREATOR_PATH
    if relative in ENTRY_POINTS:
        rule |= START_UP
    return rule


def test_the_gateway_and_the_plugin_import_only_the_contract_and_the_client_side():
    files = sorted((REPO / "gateway").rglob("*.py"))
    assert len(files) > 30
    broken = {}
    for path in files:
        relative = path.relative_to(REPO).as_posix()
        extra = imported(path) - allowed(relative)
        if extra:
            broken[relative] = sorted(extra)
    assert not broken, f"gateway modules reaching past gpu_worker's contract and client side: {broken}"


def test_the_rule_sees_a_forbidden_import(tmp_path):
    """The check itself can fail: a module that imports the pool's internals or the server is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("from gpu_worker.client.links import Links\n\ndef f():\n    import gpu_worker.server\n")
    assert imported(bad) - allowed("gateway/api/bad.py") == {"gpu_worker.client.links", "gpu_worker.server"}
