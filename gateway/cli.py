"""CLI for tenants: `voicering tenant create|list|revoke|limits|policy|key`.

Commands take `--redis URL`; without it they use VOICERING_GATEWAY_REDIS_URL, else VOICERING_REDIS_URL,
else hashring's default URL (GatewaySettings, read once when the command starts). A new API key is
printed once, by `create` and `key`, and is never stored or shown again. Exit status: 0 done,
1 any error (unknown tenant, taken name, bad limit, Redis unreachable), 2 a usage error.
Imports stay lazy: `voicering --help` loads no Redis client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings
    from gateway.tenants import Tenant, TenantLimits, TenantPolicy, Tenants

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Tenants, their API keys and limits (kept in Redis).")

T = TypeVar("T")

RedisOption = typer.Option(None, "--redis", metavar="URL",
                           help="Redis URL (default: $VOICERING_GATEWAY_REDIS_URL, else $VOICERING_REDIS_URL).")
JsonOption = typer.Option(False, "--json", help="Print one JSON object.")
NameArgument = typer.Argument(..., help="Tenant name (or id).")
StreamsOption = typer.Option(None, "--max-streams", min=1, help="Concurrent speech streams.")
RpmOption = typer.Option(None, "--requests-per-minute", min=1, help="API requests per minute.")
UploadOption = typer.Option(None, "--max-upload-bytes", min=1, help="Bytes per upload.")
VoicesOption = typer.Option(None, "--max-voices", min=1, help="Voices the tenant may have.")
TrainingOption = typer.Option(None, "--max-training-jobs", min=1, help="Training jobs at once.")
ConsentOption = typer.Option(None, "--consent", metavar="spoken|statement",
                             help="How speakers consent: a spoken phrase checked against the voice (the default "
                                  "for new tenants), or a typed statement (you keep your own consent records).")
GateOption = typer.Option(None, "--report-gate", metavar="off|warn|block",
                          help="What a poor clone report does to publishing (default warn).")
RetentionOption = typer.Option(None, "--retention-days", metavar="N|none",
                               help="Delete a voice's uploads and consent recording N days after it is ready "
                                    "(0: at once); 'none' keeps them while the voice exists (the default).")


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Create tenants, issue and revoke their API keys, set their limits."""
    from pydantic import ValidationError

    from gateway.settings import GatewaySettings

    try:
        ctx.obj = GatewaySettings()
    except ValidationError as exc:
        typer.secho(f"error: bad VOICERING_GATEWAY_* setting: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from None


def _run(ctx: typer.Context, redis_url: str | None, work: Callable[[Tenants], Awaitable[T]]) -> T:
    """Run `work` against the tenant registry; a TenantError becomes a message and exit status 1."""
    from gateway.tenants import TenantError, Tenants, Unavailable, connect_redis
    from hashring.redis_client import redact_url

    settings: GatewaySettings = ctx.obj
    url = redis_url or settings.default_redis_url()

    async def main() -> T:
        client = connect_redis(url, timeout_s=settings.redis_timeout_s)
        try:
            return await work(Tenants(client, settings.tenant_prefix, auth_cache_s=settings.auth_cache_s))
        finally:
            await client.aclose()

    try:
        return asyncio.run(main())
    except TenantError as exc:
        where = f" (Redis {redact_url(url)}; pass --redis URL or set VOICERING_REDIS_URL)" if isinstance(
            exc, Unavailable) else ""
        typer.secho(f"error: {exc.message}{where}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from None
    except ValueError as exc:  # a malformed URL
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(1) from None


def _changes(**given: int | None) -> dict[str, int]:
    return {name: value for name, value in given.items() if value is not None}


def _policy_changes(consent: str | None, report_gate: str | None, retention_days: str | None) -> dict[str, Any]:
    """The policy fields given on the command line; raises InvalidPolicy (a TenantError) on a bad one."""
    from gateway.tenants import TenantPolicy

    changes: dict[str, Any] = {}
    if consent is not None:
        changes["consent"] = consent
    if report_gate is not None:
        changes["report_gate"] = report_gate
    if retention_days is not None:
        changes["retention_days"] = TenantPolicy.parse_retention_days(retention_days)
    return changes


def _as_dict(tenant: Tenant) -> dict[str, Any]:
    return dataclasses.asdict(tenant)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def _limits_text(limits: TenantLimits) -> str:
    return (f"{limits.max_streams} streams, {limits.requests_per_minute} requests/min, "
            f"{_size(limits.max_upload_bytes)} per upload, {limits.max_voices} voices, "
            f"{limits.max_training_jobs} training jobs at once")


def _policy_text(policy: TenantPolicy) -> str:
    days = policy.retention_days
    kept = "while the voice exists" if days is None else f"{days} days after the voice is ready"
    return f"{policy.consent} consent, report gate {policy.report_gate}, recordings kept {kept}"


def _show_setting(tenant: Tenant, field: str, value: Any, text: str, *, changed: bool, as_json: bool) -> None:
    """What `limits` and `policy` print: the tenant's settings of that kind, as JSON or one line."""
    if as_json:
        _echo_json({"name": tenant.name, "id": tenant.id, field: dataclasses.asdict(value)})
        return
    typer.echo(f"tenant {tenant.name!r} ({tenant.id}) {'now' if changed else 'has'}: {text}")


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def _echo_key(key: str) -> None:
    typer.echo("API key (shown only this once: it is not stored and will not be shown again; keep it now):")
    typer.echo(key)


@app.command()
def create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Unique tenant name: lowercase letters, digits, '._-'."),
    max_streams: int | None = StreamsOption,
    requests_per_minute: int | None = RpmOption,
    max_upload_bytes: int | None = UploadOption,
    max_voices: int | None = VoicesOption,
    max_training_jobs: int | None = TrainingOption,
    consent: str | None = ConsentOption,
    report_gate: str | None = GateOption,
    retention_days: str | None = RetentionOption,
    redis_url: str | None = RedisOption,
    as_json: bool = JsonOption,
) -> None:
    """Create tenant NAME and print its first API key (once)."""
    from gateway.tenants import TenantPolicy

    changes = _changes(max_streams=max_streams, requests_per_minute=requests_per_minute,
                       max_upload_bytes=max_upload_bytes, max_voices=max_voices, max_training_jobs=max_training_jobs)

    async def work(tenants: Tenants) -> tuple[Tenant, str]:
        policy = TenantPolicy().replace(**_policy_changes(consent, report_gate, retention_days))
        return await tenants.create(name, ctx.obj.default_limits().replace(**changes), policy)

    tenant, key = _run(ctx, redis_url, work)
    if as_json:
        _echo_json({"tenant": _as_dict(tenant), "api_key": key})
        return
    typer.echo(f"created tenant {tenant.name!r} ({tenant.id})")
    typer.echo(f"limits: {_limits_text(tenant.limits)}")
    typer.echo(f"policy: {_policy_text(tenant.policy)}")
    _echo_key(key)


@app.command("list")
def list_tenants(ctx: typer.Context, redis_url: str | None = RedisOption, as_json: bool = JsonOption) -> None:
    """Every tenant with its limits, revoked ones included."""

    async def work(tenants: Tenants) -> list[Tenant]:
        return await tenants.list()

    rows = _run(ctx, redis_url, work)
    if as_json:
        _echo_json({"tenants": [_as_dict(t) for t in rows]})
        return
    if not rows:
        typer.echo("no tenants yet: create one with `voicering tenant create NAME`")
        return
    typer.echo(f"{'NAME':24} {'ID':13} {'STATE':7} {'STREAMS':>7} {'REQ/MIN':>7} {'UPLOAD':>9} {'VOICES':>6} "
               f"{'TRAIN':>5} {'CONSENT':9} {'GATE':5} {'KEEP':>5}  CREATED")
    for t in rows:
        lim, pol = t.limits, t.policy
        keep = "voice" if pol.retention_days is None else f"{pol.retention_days}d"
        typer.echo(f"{t.name:24} {t.id:13} {'revoked' if t.revoked else 'active':7} {lim.max_streams:>7} "
                   f"{lim.requests_per_minute:>7} {_size(lim.max_upload_bytes):>9} {lim.max_voices:>6} "
                   f"{lim.max_training_jobs:>5} {pol.consent:9} {pol.report_gate:5} {keep:>5}  {_when(t.created_at)}")


@app.command()
def revoke(ctx: typer.Context, name: str = NameArgument, redis_url: str | None = RedisOption) -> None:
    """Revoke tenant NAME: all its API keys stop working."""

    async def work(tenants: Tenants) -> Tenant:
        return await tenants.revoke(name)

    tenant = _run(ctx, redis_url, work)
    typer.echo(f"tenant {tenant.name!r} ({tenant.id}) is revoked: its API keys no longer work "
               f"(gateways that cannot reach Redis honour them for at most {ctx.obj.auth_cache_s:g}s more)")


@app.command()
def limits(
    ctx: typer.Context,
    name: str = NameArgument,
    max_streams: int | None = StreamsOption,
    requests_per_minute: int | None = RpmOption,
    max_upload_bytes: int | None = UploadOption,
    max_voices: int | None = VoicesOption,
    max_training_jobs: int | None = TrainingOption,
    redis_url: str | None = RedisOption,
    as_json: bool = JsonOption,
) -> None:
    """Show the limits of tenant NAME; change the ones given."""
    changes = _changes(max_streams=max_streams, requests_per_minute=requests_per_minute,
                       max_upload_bytes=max_upload_bytes, max_voices=max_voices, max_training_jobs=max_training_jobs)

    async def work(tenants: Tenants) -> Tenant:
        return await tenants.set_limits(name, **changes)

    tenant = _run(ctx, redis_url, work)
    _show_setting(tenant, "limits", tenant.limits, _limits_text(tenant.limits), changed=bool(changes), as_json=as_json)


@app.command()
def policy(
    ctx: typer.Context,
    name: str = NameArgument,
    consent: str | None = ConsentOption,
    report_gate: str | None = GateOption,
    retention_days: str | None = RetentionOption,
    redis_url: str | None = RedisOption,
    as_json: bool = JsonOption,
) -> None:
    """Show the policy of tenant NAME (consent, report gate, retention); change the fields given."""
    given = (consent, report_gate, retention_days)

    async def work(tenants: Tenants) -> Tenant:
        return await tenants.set_policy(name, **_policy_changes(*given))

    tenant = _run(ctx, redis_url, work)
    _show_setting(tenant, "policy", tenant.policy, _policy_text(tenant.policy),
                  changed=any(v is not None for v in given), as_json=as_json)


@app.command()
def key(ctx: typer.Context, name: str = NameArgument, redis_url: str | None = RedisOption,
        as_json: bool = JsonOption) -> None:
    """Issue another API key for tenant NAME (its other keys keep working)."""

    async def work(tenants: Tenants) -> tuple[Tenant, str]:
        return await tenants.get(name), await tenants.new_key(name)

    tenant, new = _run(ctx, redis_url, work)
    if as_json:
        _echo_json({"name": tenant.name, "id": tenant.id, "api_key": new})
        return
    typer.echo(f"new API key for tenant {tenant.name!r} ({tenant.id})")
    _echo_key(new)
