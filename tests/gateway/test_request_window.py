"""Each HTTP request counts once against the tenant's `requests_per_minute` (issue 34 item 12), on
a real gateway process and real Redis (no worker: these routes need none).

`POST /v1/voices/consent` counted twice (the `caller` dependency and the route itself), so a
tenant allowed one request a minute could never get a consent phrase: its first call was 429.
"""

from __future__ import annotations

import httpx
import pytest

from tests.fixtures.gateway import start_gateway

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def quiet_gateway(redis_server, adapter_store, tmp_path_factory):
    handle = start_gateway(redis_server.url, adapter_store, tmp_path_factory.mktemp("window-gateway"))
    yield handle
    handle.stop()


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/v1/voices/consent", {"name": "nova"}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/voices", None),
])
async def test_a_tenant_at_one_request_a_minute_gets_one_answer(quiet_gateway, new_tenant, method, path, body):
    _, key = await new_tenant(consent="spoken", requests_per_minute=1)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.request(method, f"{quiet_gateway.url}{path}", headers=headers, json=body)
        second = await http.request(method, f"{quiet_gateway.url}{path}", headers=headers, json=body)
    assert first.status_code == 200, first.text
    if path == "/v1/voices/consent":
        assert first.json()["consent_id"] and first.json()["text_to_read"]
    assert second.status_code == 429 and second.json()["error"]["code"] == "requests_limit_exceeded"
