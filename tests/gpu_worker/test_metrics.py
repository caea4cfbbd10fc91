"""Observability of a real worker: Prometheus text at GET /metrics (own registry per worker) and
JSON log lines that carry the context id."""

from __future__ import annotations

import asyncio
import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gpu_worker.client import WorkerClient
from gpu_worker.metrics import JsonLogFormatter, WorkerMetrics
from gpu_worker.protocol import ContextOptions

FAMILIES = {
    "voicering_worker_ttfb_seconds", "voicering_worker_real_time_factor", "voicering_worker_stream_tokens_per_second",
    "voicering_worker_tokens", "voicering_worker_invalid_tokens", "voicering_worker_active_streams",
    "voicering_worker_engine_queue_depth", "voicering_worker_codec_queue_depth", "voicering_worker_codec_batch_size",
    "voicering_worker_adapter_loads", "voicering_worker_adapter_evictions", "voicering_worker_adapter_load_seconds",
    "voicering_worker_adapters_resident", "voicering_worker_contexts", "voicering_worker_rejected",
}


def scrape(worker) -> dict[str, dict[str, float]]:
    with urllib.request.urlopen(f"{worker.http}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {family.name: {f"{s.name}{sorted(s.labels.items())}": s.value for s in family.samples}
            for family in text_string_to_metric_families(text)}


async def test_metrics_follow_an_context(worker):
    before = scrape(worker)
    assert FAMILIES <= set(before)
    async with await WorkerClient.connect(worker.url) as client:
        stream = await client.start("tara", "Count me.", options=ContextOptions(max_tokens=7 * 5, seed=9),
                                    context_id="metrics-ctx-1")
        await stream.end()
        pcm = b"".join([chunk async for chunk in stream.audio()])
    assert pcm and stream.done.stats.tokens == 35
    after = scrape(worker)

    def delta(family: str, sample: str) -> float:
        return after[family].get(sample, 0.0) - before[family].get(sample, 0.0)

    assert delta("voicering_worker_ttfb_seconds", "voicering_worker_ttfb_seconds_count[]") == 1
    assert delta("voicering_worker_real_time_factor", "voicering_worker_real_time_factor_count[]") == 1
    assert delta("voicering_worker_tokens", "voicering_worker_tokens_total[]") == 35
    assert delta("voicering_worker_invalid_tokens", "voicering_worker_invalid_tokens_total[]") == 0
    assert delta("voicering_worker_contexts", "voicering_worker_contexts_total[('outcome', 'completed')]") == 1
    assert delta("voicering_worker_codec_batch_size", "voicering_worker_codec_batch_size_count[]") >= 3
    assert after["voicering_worker_active_streams"]["voicering_worker_active_streams[]"] == 0
    assert after["voicering_worker_engine_queue_depth"]["voicering_worker_engine_queue_depth[]"] == 0


async def test_logs_are_json_lines_with_the_context_id(worker):
    async with await WorkerClient.connect(worker.url) as client:
        stream = await client.start("leo", "Log me.", options=ContextOptions(max_tokens=15, seed=1), context_id="log-ctx-7")
        await stream.end()
        _ = [chunk async for chunk in stream.audio()]
    await asyncio.sleep(0.5)
    records = []
    for line in worker.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            records.append(json.loads(line))
    mine = [r for r in records if r.get("context_id") == "log-ctx-7"]
    assert mine and mine[-1]["voice"] == "leo" and mine[-1]["frames"] == 2 and mine[-1]["level"] == "INFO"


def test_each_worker_has_its_own_registry():
    a, b = WorkerMetrics(), WorkerMetrics()
    a.tokens.inc(5)
    assert b"voicering_worker_tokens_total 5.0" in a.render()
    assert b"voicering_worker_tokens_total 0.0" in b.render()
    record = __import__("logging").LogRecord("x", 20, __file__, 1, "hello %s", ("there",), None)
    record.context_id = "c1"
    assert json.loads(JsonLogFormatter().format(record))["context_id"] == "c1"
