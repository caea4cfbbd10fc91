"""`voicering trace` and one request followed through the session gateway to the session worker.

- The command on logs written here (a text gateway log, a JSON worker log, in subfolders): the
  path in order, `--json`, a trace that is not there (exit 1), a bad id (exit 2), a file too
  large to read (skipped and named).
- A speech request with a caller's `traceparent` is answered with its trace id (`traceresponse`,
  `x-voicering-trace-id`); the worker's log carries that trace id, and `voicering trace` shows
  the gateway and the worker as one path, each a child of the span before. A websocket context's
  `done.stats` carry the trace id its `start` named; a malformed one is refused.
The proxied path (gateway -> entry -> owner) is in tests/gpu_worker/test_relay_timeouts.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

from gpu_worker.trace_context import Hop, TraceContext
from voicering import trace as trace_cli

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE}-00f067aa0ba902b7-01"


def voicering(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voicering", *args], capture_output=True, text=True, timeout=120)


def write_logs(root: Path) -> tuple[Hop, Hop, Hop]:
    gateway = Hop("gateway", TRACE, "1" * 16, "00f067aa0ba902b7", "", "worker-a", "clu/v1", "ctx-g", 100.0, 30.5,
                  90.0, "completed")
    entry = Hop("entry", TRACE, "2" * 16, gateway.span, "worker-a", "worker-b", "clu/v1", "ctx-g", 100.01, 25.0,
                85.0, "completed")
    owner = Hop("owner", TRACE, "3" * 16, entry.span, "worker-b", "", "clu/v1", "ctx-e", 100.02, 20.0, 80.0,
                "completed")
    other = Hop("owner", "5" * 32, "4" * 16, "", "worker-b", "", "tara", "x", 100.0, 1.0, 2.0, "completed")
    (root / "gw").mkdir(parents=True)
    (root / "workers").mkdir()
    (root / "gw" / "gateway.log").write_text(
        f"2024-01-01 10:00:00 INFO gateway.api.speech: tenant t1 began trace={TRACE}\n"
        f"2024-01-01 10:00:01 INFO gateway.api.speech: {gateway.line()}\n")
    lines = [{"level": "INFO", "message": hop.line(), "hop": hop.fields(), "trace_id": hop.trace}
             for hop in (owner, other, entry)]
    (root / "workers" / "worker.log").write_text("not json {\n" + "\n".join(map(json.dumps, lines)) + "\n")
    (root / "workers" / "notes.txt").write_text(gateway.line().replace("gateway", "owner") + "\n")  # not a *.log
    return gateway, entry, owner


def test_trace_prints_the_path_in_order_from_text_and_json_logs(tmp_path):
    gateway, entry, owner = write_logs(tmp_path)
    done = voicering("trace", TRACE, "--logs", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"trace {TRACE}: gateway -> entry worker-a -> owner worker-b"
    rows = [line.split() for line in done.stdout.splitlines()[3:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("gateway", "-", gateway.span), ("entry", "worker-a", entry.span),
                                                   ("owner", "worker-b", owner.span)]
    assert "missing hops" not in done.stdout
    as_json = voicering("trace", CALLER, "--logs", str(tmp_path / "gw"), "--logs", str(tmp_path / "workers"), "--json")
    hops = json.loads(as_json.stdout)["hops"]
    assert [h["hop"] for h in hops] == ["gateway", "entry", "owner"]
    assert Hop(**{k: v for k, v in hops[1].items() if k != "log"}) == entry
    assert hops[0]["log"].endswith("gateway.log") and hops[2]["log"].endswith("worker.log")


def test_a_trace_not_in_the_logs_exits_1_and_a_bad_id_exits_2(tmp_path):
    write_logs(tmp_path)
    missing = voicering("trace", "6" * 32, "--logs", str(tmp_path))
    assert missing.returncode == 1 and "no hop of it" in missing.stderr
    assert voicering("trace", "6" * 32, "--logs", str(tmp_path), "--json").returncode == 1
    bad = voicering("trace", "not-a-trace", "--logs", str(tmp_path))
    assert bad.returncode == 2 and "32 hex" in bad.stderr
    assert voicering("trace", TRACE, "--logs", str(tmp_path / "nowhere")).returncode == 2


def test_a_partial_path_names_what_is_missing_and_a_huge_log_is_skipped(tmp_path, monkeypatch):
    gateway, entry, owner = write_logs(tmp_path)
    (tmp_path / "gw" / "gateway.log").unlink()
    found = trace_cli.find_hops(TRACE, [tmp_path])
    assert [f.hop for f in found] == [entry, owner]
    assert f"the parent {gateway.span} of entry worker-a" in trace_cli.render(TRACE, found)
    monkeypatch.setattr(trace_cli, "MAX_LOG_BYTES", 10)
    skipped: list[Path] = []
    assert trace_cli.find_hops(TRACE, [tmp_path], skipped) == [] and skipped == [tmp_path / "workers" / "worker.log"]


async def wait_for_hops(trace_id: str, roots: list[Path], kinds: list[str], timeout: float = 30):
    """The hops of a trace once the logs hold every kind named (each process logs its hop at its end)."""
    deadline = time.monotonic() + timeout
    while True:
        found = trace_cli.find_hops(trace_id, roots)
        if [f.hop.hop for f in found] == kinds:
            return found
        assert time.monotonic() < deadline, f"hops of {trace_id} in the logs: {[f.hop for f in found]}"
        await asyncio.sleep(0.2)


async def test_a_speech_request_is_followed_from_the_gateway_to_the_worker(gateway, worker, new_tenant):
    _, key = await new_tenant()
    caller = TraceContext.new()
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(f"{gateway.url}/v1/audio/speech", json={
            "model": "tts-1", "voice": "tara", "input": "Follow me.", "response_format": "pcm", "seed": 2,
            "max_tokens": 15}, headers={"Authorization": f"Bearer {key}", "traceparent": caller.traceparent})
        untraced = await http.post(f"{gateway.url}/v1/audio/speech", json={
            "model": "tts-1", "voice": "tara", "input": "Me too.", "response_format": "pcm", "max_tokens": 15},
            headers={"Authorization": f"Bearer {key}", "traceparent": "00-garbage"})
    assert response.status_code == 200 and response.content
    assert response.headers["x-voicering-trace-id"] == caller.trace_id
    gateway_span = response.headers["traceresponse"].split("-")[2]
    assert response.headers["traceresponse"] == f"00-{caller.trace_id}-{gateway_span}-01"
    assert untraced.status_code == 200 and untraced.headers["x-voicering-trace-id"] != caller.trace_id  # a new trace

    roots = [gateway.log_path, worker.log_path]
    gw, owner = [f.hop for f in await wait_for_hops(caller.trace_id, roots, ["gateway", "owner"])]
    assert (gw.span, gw.parent, gw.to, gw.outcome) == (gateway_span, caller.span_id, response.headers["x-voicering-worker"],
                                                       "completed")
    assert (owner.parent, owner.worker, owner.voice, owner.outcome) == (gw.span, "worker-a", "tara", "completed")
    assert gw.ttfb_ms is not None and owner.ttfb_ms is not None
    assert caller.trace_id in worker.log_path.read_text()
    assert "00-garbage" not in gateway.log_path.read_text()

    shown = voicering("trace", caller.trace_id, "--logs", str(gateway.log_path.parent), "--logs",
                      str(worker.log_path.parent))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"trace {caller.trace_id}: gateway -> owner worker-a"


async def test_a_stream_context_is_traced_by_its_start_and_a_malformed_traceparent_is_refused(gateway, new_tenant):
    _, key = await new_tenant()
    caller = TraceContext.new()
    async with connect(f"{gateway.ws_url}/v1/tts/stream", additional_headers={"Authorization": f"Bearer {key}"},
                       max_size=1 << 22) as ws:
        await ws.send(json.dumps({"type": "start", "context_id": "bad", "voice": "tara", "text": "No.",
                                  "traceparent": "00-" + "z" * 52}))
        refused = json.loads(await asyncio.wait_for(ws.recv(), 30))
        await ws.send(json.dumps({"type": "start", "context_id": "a", "voice": "tara", "text": "Traced.",
                                  "traceparent": caller.traceparent, "options": {"max_tokens": 15}}))
        await ws.send(json.dumps({"type": "end", "context_id": "a"}))
        while isinstance(message := await asyncio.wait_for(ws.recv(), 120), bytes) or \
                json.loads(message)["type"] not in ("done", "error"):
            pass
    done = json.loads(message)
    assert (refused["type"], refused["code"], refused["context_id"]) == ("rejected", "bad_request", "bad")
    assert "traceparent" in refused["message"] and "zzzz" not in refused["message"]
    assert done["type"] == "done" and done["stats"]["trace_id"] == caller.trace_id
    hops = await wait_for_hops(caller.trace_id, [gateway.log_path], ["gateway"])
    assert hops[0].hop.parent == caller.span_id and hops[0].hop.outcome == "completed"
