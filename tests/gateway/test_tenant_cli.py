"""`voicering tenant ...` against a real Redis: through CliRunner, and once as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from gateway.tenants import Tenant, TenantLimits, Tenants, Unauthorized, connect_redis
from hashring.ports import free_port

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
VOICERING = Path(sys.executable).parent / "voicering"


@pytest.fixture
def prefix() -> str:
    return f"test:tenant-cli:{uuid.uuid4().hex[:10]}"


@pytest.fixture
def env(prefix: str, redis_url: str) -> dict[str, str]:
    return {"VOICERING_GATEWAY_TENANT_PREFIX": prefix, "VOICERING_GATEWAY_REDIS_URL": redis_url,
            "VOICERING_REDIS_URL": ""}


def invoke(env: dict[str, str], *args: str):
    return CliRunner().invoke(app, list(args), env=env)


def authenticate(url: str, prefix: str, key: str) -> Tenant:
    async def work() -> Tenant:
        client = connect_redis(url, timeout_s=0.5)
        try:
            return await Tenants(client, prefix).authenticate(key)
        finally:
            await client.aclose()

    return asyncio.run(work())


def failed(result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_create_prints_the_key_once_and_it_works(env, redis_url, prefix):
    result = invoke(env, "create", "acme", "--max-streams", "3", "--max-upload-bytes", str(50 << 20))
    assert result.exit_code == 0, result.output
    assert "created tenant 'acme' (t_" in result.stdout and "will not be shown again" in result.stdout
    assert "3 streams, 120 requests/min, 50 MiB per upload, 20 voices, 2 training jobs" in result.stdout
    key = result.stdout.strip().splitlines()[-1]
    tenant = authenticate(redis_url, prefix, key)
    assert tenant.name == "acme" and tenant.limits == TenantLimits(max_streams=3, max_upload_bytes=50 << 20)

    data = json.loads(invoke(env, "create", "beta", "--max-voices", "4", "--json").stdout)
    assert data["tenant"]["limits"]["max_voices"] == 4 and data["api_key"].startswith("vr_")
    assert authenticate(redis_url, prefix, data["api_key"]).id == data["tenant"]["id"]


def test_defaults_come_from_the_settings(env, redis_url, prefix):
    result = invoke({**env, "VOICERING_GATEWAY_DEFAULT_MAX_STREAMS": "2"}, "create", "acme", "--json")
    assert json.loads(result.stdout)["tenant"]["limits"]["max_streams"] == 2


def test_list_revoke_limits_and_key(env, redis_url, prefix):
    assert "no tenants yet" in invoke(env, "list").stdout
    first = invoke(env, "create", "acme").stdout.strip().splitlines()[-1]
    invoke(env, "create", "beta")

    table = invoke(env, "list").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "ID", "STATE"]
    assert [line.split()[0] for line in table[1:]] == ["acme", "beta"]
    assert all(" active " in line for line in table[1:])
    listed = json.loads(invoke(env, "list", "--json").stdout)["tenants"]
    assert [t["name"] for t in listed] == ["acme", "beta"]

    shown = invoke(env, "limits", "acme")
    assert shown.exit_code == 0 and "has: 8 streams, 120 requests/min, 200 MiB per upload" in shown.stdout
    changed = invoke(env, "limits", "acme", "--max-streams", "1", "--requests-per-minute", "10", "--json")
    limits = json.loads(changed.stdout)["limits"]
    assert (limits["max_streams"], limits["requests_per_minute"], limits["max_voices"]) == (1, 10, 20)
    assert json.loads(invoke(env, "limits", "acme", "--json").stdout)["limits"] == limits
    assert authenticate(redis_url, prefix, first).limits.max_streams == 1

    extra = invoke(env, "key", "acme")
    assert extra.exit_code == 0 and "will not be shown again" in extra.stdout
    second = extra.stdout.strip().splitlines()[-1]
    assert authenticate(redis_url, prefix, second).name == "acme"

    revoked = invoke(env, "revoke", "acme")
    assert revoked.exit_code == 0 and "is revoked" in revoked.stdout
    for key in (first, second):
        with pytest.raises(Unauthorized):
            authenticate(redis_url, prefix, key)
    assert [line.split()[2] for line in invoke(env, "list").stdout.splitlines()[1:]] == ["revoked", "active"]
    failed(invoke(env, "key", "acme"), "is revoked")


def test_errors_are_one_clear_line_and_exit_1(env):
    invoke(env, "create", "acme")
    failed(invoke(env, "create", "acme"), "error: a tenant named 'acme' already exists")
    failed(invoke(env, "create", "Bad Name"), "is not usable")
    failed(invoke(env, "revoke", "nobody"), "voicering tenant list")
    failed(invoke(env, "limits", "nobody", "--max-voices", "3"), "no tenant")
    failed(invoke(env, "key", "nobody"), "no tenant")
    assert invoke(env, "limits", "acme", "--max-streams", "0").exit_code == 2  # a usage error


def test_unreachable_redis_is_reported_with_the_url(env):
    port = free_port()  # nothing listens there
    url = f"redis://user:secret@127.0.0.1:{port}/0"
    result = invoke(env, "list", "--redis", url)
    failed(result, "unreachable")
    assert f"127.0.0.1:{port}" in result.stderr and "secret" not in result.output


def test_a_real_subprocess(env, redis_url, prefix):
    run_env = {**os.environ, **env, "VOICERING_GATEWAY_REDIS_URL": ""}  # the URL comes from --redis

    def voicering(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(VOICERING), "tenant", *args, "--redis", redis_url], capture_output=True,
                              text=True, timeout=60, env=run_env, cwd=ROOT)

    created = voicering("create", "subproc", "--max-training-jobs", "1")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert authenticate(redis_url, prefix, key).limits.max_training_jobs == 1
    assert [t["name"] for t in json.loads(voicering("list", "--json").stdout)["tenants"]] == ["subproc"]
    duplicate = voicering("create", "subproc")
    assert duplicate.returncode == 1 and "already exists" in duplicate.stderr and "Traceback" not in duplicate.stderr


def test_voicering_help_lists_tenant():
    out = subprocess.run([str(VOICERING), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and any("tenant" in line and "API keys" in line for line in out.stdout.splitlines())
    code = "import sys, voicering.cli; print('redis' in sys.modules, 'gateway.tenants' in sys.modules)"
    light = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert light.stdout.split() == ["False", "False"], light.stderr
