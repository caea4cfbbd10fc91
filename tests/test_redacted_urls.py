"""Redis URLs are printed with every secret hidden (issue 34 item 6): `redact_url` is the one
function, and every command that prints a Redis URL goes through it.

It hid only the userinfo's password: a `redis+sentinel://...?sentinel_password=...` URL was printed
whole in every RingUnavailable line, `voicering status`, `voicering ring`, `voicering tenant` and
the `voicering up` banner. The commands run here as real processes against a Sentinel URL whose
Sentinel does not answer (each then prints the URL in its error), and the ring store's own
message comes from a real failed call.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hashring.ports import free_port
from hashring.errors import RingUnavailable
from hashring.redis_client import redact_url
from hashring.settings import RetryPolicy, RingSettings
from hashring.store import RingStore

OWN_WORKERS = 1  # `voicering up --workers 1` (tests/fixtures/fleet.py)

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[1]
SECRETS = ("DATAPW", "SENTINELPW", "QUERYPW", "TOKENVALUE")


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://user:DATAPW@host:6379/0", "redis://user:***@host:6379/0"),
    ("redis://:DATAPW@host/0", "redis://:***@host/0"),
    ("redis://DATAPW@host/0", "redis://***@host/0"),  # a lone userinfo is often the password
    ("redis://host:6379/0", "redis://host:6379/0"),
    ("redis+sentinel://:DATAPW@10.0.0.1:26379,10.0.0.2/fleet/2?sentinel_password=SENTINELPW",
     "redis+sentinel://:***@10.0.0.1:26379,10.0.0.2/fleet/2?sentinel_password=***"),
    ("rediss://h:6380/0?password=QUERYPW&ssl_cert_reqs=none", "rediss://h:6380/0?password=***&ssl_cert_reqs=none"),
    ("redis://h/0?auth_token=TOKENVALUE&client_secret=x&api_key=y&db=3",
     "redis://h/0?auth_token=***&client_secret=***&api_key=***&db=3"),
    ("unix:///run/redis.sock?password=QUERYPW&db=1", "unix:///run/redis.sock?password=***&db=1"),
    ("user:DATAPW@host:6379?password=QUERYPW", "***@host:6379?password=***"),  # no scheme: still hidden
    ("redis://[::1:6379/0?password=QUERYPW", "<a Redis URL that could not be parsed>"),
])
def test_every_secret_a_url_can_carry_is_hidden(url, shown):
    assert redact_url(url) == shown
    assert not any(secret in redact_url(url) for secret in SECRETS)


@pytest.fixture
def secret_url() -> str:
    """A Sentinel URL with a data-node password and a Sentinel password, whose Sentinel is not there."""
    return (f"redis+sentinel://admin:DATAPW@127.0.0.1:{free_port()}/fleet/0?sentinel_password=SENTINELPW"
            "&password=QUERYPW")


def run(*args: str, timeout: float = 60) -> str:
    proc = subprocess.run([sys.executable, "-m", "voicering", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "HOME": str(REPO)})
    assert proc.returncode != 0, proc.stdout  # nothing answers: each command fails and says where it looked
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("command", [
    ("ring", "status"), ("status", "--json"), ("tenant", "list"),
])
def test_commands_print_the_url_with_its_secrets_hidden(command, secret_url):
    printed = run(*command, "--redis", secret_url)
    assert "127.0.0.1" in printed and "***" in printed, printed  # the URL is there, redacted
    assert not any(secret in printed for secret in SECRETS), printed


def test_the_up_banner_and_its_errors_hide_them(secret_url, tmp_path):
    ports = [str(free_port()) for _ in range(3)]
    printed = run("up", "--folder", str(tmp_path / "up"), "--redis", secret_url, "--workers", "1", "--no-trainer",
                  "--gateway-port", ports[0], "--worker-port", ports[1], "--agent-port", ports[2], timeout=120)
    assert "cannot use the Redis at redis+sentinel://admin:***@" in printed, printed
    assert not any(secret in printed for secret in SECRETS), printed


async def test_the_ring_store_s_errors_hide_them(secret_url):
    settings = RingSettings(redis_url=secret_url, redis_timeout_s=0.5,
                            retry=RetryPolicy(attempts=1, base_delay_s=0.01, max_delay_s=0.01))
    async with RingStore(settings) as store:
        with pytest.raises(RingUnavailable) as failed:
            await store.snapshot()
    assert "sentinel_password=***" in failed.value.message
    assert not any(secret in failed.value.message for secret in SECRETS), failed.value.message
