"""Fixtures of the tenant-layer tests (tenants, quotas, usage): a Redis client of the tenant
layer's own kind and a fresh key prefix per test on the session's real Redis."""

from __future__ import annotations

import uuid

import pytest

from gateway.tenants import Tenants, connect_redis


@pytest.fixture
async def client(redis_url):
    c = connect_redis(redis_url, timeout_s=0.5)
    yield c
    await c.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:tenant-layer:{uuid.uuid4().hex[:10]}"


@pytest.fixture
def tenants(client, prefix) -> Tenants:
    return Tenants(client, prefix)


@pytest.fixture
async def page(browser, gateway):
    """A new tab of the session's headless Chromium on the session gateway's web page."""
    opened = await browser.new_page()
    await opened.goto(f"{gateway.url}/")
    yield opened
    await opened.close()
