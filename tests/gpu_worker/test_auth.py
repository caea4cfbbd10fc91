"""Cluster auth on a real worker server over real sockets: with a cluster token, the websocket
handshake, /metrics and /prewarm need `Authorization: Bearer <token>`; /health stays open. The
server runs in-process without an engine (none of these paths reach it; `_NoEngine` only answers
/health's counts), so this module costs no worker process."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gpu_worker.client import NoWorkerAvailable, PoolSettings, WorkerClient, WorkerPool
from gpu_worker.metrics import WorkerMetrics
from hashring.ports import free_port
from gpu_worker.server import WorkerServer
from gpu_worker.context import ContextDeps
from gpu_worker.settings import WorkerSettings

TOKEN = "s3cret-token"


class _NoEngine:
    waiting = 0

    def unfinished_requests(self) -> int:
        return 0


@pytest.fixture
async def server():
    settings = WorkerSettings(model="unused", port=free_port(), cluster_token=TOKEN, log_format="text")
    worker = WorkerServer(settings, ContextDeps(_NoEngine(), None, None, metrics=WorkerMetrics()))
    ws_server = await worker.serve()
    yield f"127.0.0.1:{settings.port}"
    ws_server.close()
    await ws_server.wait_closed()


def get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_websocket_needs_the_token(server):
    for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        with pytest.raises(InvalidStatus) as refused:
            await connect(f"ws://{server}", additional_headers=headers, open_timeout=5)
        assert refused.value.response.status_code == 401
    client = await WorkerClient.connect(f"ws://{server}", token=TOKEN)
    await client.aclose()


async def test_health_stays_open_metrics_and_prewarm_do_not(server):
    import asyncio

    assert await asyncio.to_thread(get, f"http://{server}/health") == 200
    assert await asyncio.to_thread(get, f"http://{server}/metrics") == 401
    assert await asyncio.to_thread(get, f"http://{server}/prewarm?voice=tara") == 401
    assert await asyncio.to_thread(get, f"http://{server}/metrics", TOKEN) == 200


async def test_a_pool_with_the_wrong_token_ejects_the_worker_and_says_so(server):
    async with WorkerPool.static([f"ws://{server}"], PoolSettings(token="wrong")) as pool:
        with pytest.raises(NoWorkerAvailable):
            await pool.start("tara", "Hi.")
        assert pool.ejected() == {f"ws://{server}"}
    async with WorkerPool.static([f"ws://{server}"], PoolSettings(token=TOKEN)) as pool:
        assert await pool.prewarm([f"ws://{server}"]) == 1


async def test_the_trainer_s_validation_sample_sends_the_cluster_token(server):
    """`voicering up` beyond loopback gives the trainer the token (VOICERING_TRAIN_CLUSTER_TOKEN): its
    sample connects with it. Past the handshake this engine-less server cannot open the context (it
    has no sampling defaults): that bug ends the context at once with a retryable internal error,
    so the sampler is told now instead of at its own timeout."""
    import asyncio

    from lora_training.errors import InfrastructureError
    from lora_training.publish import WorkerSampler

    with pytest.raises(InvalidStatus) as refused:
        await asyncio.to_thread(WorkerSampler(f"ws://{server}", timeout_s=10).sample, "tara", "Hi.", max_tokens=7)
    assert refused.value.response.status_code == 401
    with pytest.raises(InfrastructureError, match="busy or failed: internal: internal error opening the context"):
        await asyncio.to_thread(WorkerSampler(f"ws://{server}", timeout_s=60, token=TOKEN).sample, "tara", "Hi.",
                                max_tokens=7)
