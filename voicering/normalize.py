"""`voicering normalize "TEXT" [--language en] [--dictionary NAME --tenant T]`.

The text front end's command (`gpu_worker.text.cli`), plus a tenant's pronunciation dictionary read
from Redis through the tenant layer (`gateway.tenants.pronunciations`): what the voice reads for a
request that names that dictionary. Redis: `--redis`, else VOICERING_GATEWAY_REDIS_URL /
VOICERING_REDIS_URL (as the gateway reads it); the tenant prefix: `--tenant-prefix`, else the
gateway's setting. Lives here, above both packages, so neither imports the other.
"""

from __future__ import annotations

import asyncio

import typer

from gpu_worker.text.cli import print_readings
from gpu_worker.text.dictionary import Dictionary

__all__ = ["command"]


def command(
    text: str = typer.Argument(..., help='The written text, or "-" to read lines from standard input.'),
    language: str = typer.Option("en", "--language", help="The text's language (rules exist for: en)."),
    dictionary: str | None = typer.Option(None, "--dictionary", help="Apply this pronunciation dictionary of "
                                          "--tenant first (read from Redis)."),
    tenant: str | None = typer.Option(None, "--tenant", help="The tenant (name or id) whose dictionary it is."),
    redis: str | None = typer.Option(None, "--redis", help="Redis URL (default: VOICERING_GATEWAY_REDIS_URL, "
                                     "else VOICERING_REDIS_URL)."),
    tenant_prefix: str | None = typer.Option(None, "--tenant-prefix", help="The gateways' tenant key prefix "
                                             "(default: the gateway's setting)."),
) -> None:
    """Print what the voice reads for TEXT (numbers, dates, money, units, abbreviations spelled out; tags kept)."""
    loaded = None
    if dictionary is not None or tenant is not None:
        if dictionary is None or tenant is None:
            typer.echo("error: --dictionary and --tenant go together: the dictionary NAME of tenant T", err=True)
            raise typer.Exit(2)
        loaded = _load(dictionary, tenant, redis, tenant_prefix)
    print_readings(text, language, loaded)


def _load(name: str, tenant: str, redis_url: str | None, prefix: str | None) -> Dictionary:
    from gateway.settings import GatewaySettings
    from gateway.tenants import TenantError, Tenants, connect_redis
    from gateway.tenants.pronunciations import Pronunciations
    from hashring.redis_client import redact_url

    settings = GatewaySettings()
    url = redis_url or settings.default_redis_url()
    prefix = prefix or settings.tenant_prefix

    async def load() -> Dictionary:
        client = connect_redis(url, timeout_s=settings.redis_timeout_s)
        try:
            found = await Tenants(client, prefix).get(tenant)
            _, loaded = await Pronunciations(client, prefix).get(found, name)
            return loaded
        finally:
            await client.aclose()

    try:
        return asyncio.run(load())
    except TenantError as exc:
        typer.echo(f"error: {exc.message} (Redis {redact_url(url)}, prefix {prefix!r})", err=True)
        raise typer.Exit(2) from None
