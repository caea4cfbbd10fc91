"""The tenant policy (consent mode, report gate, retention): its rules, its Redis form (old records
included), the registry's create/set_policy, and `voicering tenant create|policy|list` against a real Redis."""

from __future__ import annotations

import json
import uuid

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from gateway.tenants import InvalidPolicy, StoreError, Tenant, TenantLimits, TenantPolicy, Tenants
from gateway.tenants.records import MAX_RETENTION_DAYS, tenant_fields, tenant_from

pytestmark = pytest.mark.timeout(120)


def stored(policy: TenantPolicy | None = None) -> dict[str, str]:
    tenant = Tenant("t_abcdefghij", "acme", TenantLimits(), 1.0)
    if policy is not None:
        tenant = Tenant(tenant.id, tenant.name, tenant.limits, tenant.created_at, False, policy)
    return tenant_fields(tenant)


# -- pure ---------------------------------------------------------------------------------------------


def test_new_tenants_get_spoken_consent_warn_and_keep_while_the_voice_exists():
    assert TenantPolicy() == TenantPolicy("spoken", "warn", None)
    assert Tenant("t_abcdefghij", "acme", TenantLimits(), 1.0).policy == TenantPolicy()


def test_the_policy_round_trips_through_its_redis_form():
    for policy in (TenantPolicy(), TenantPolicy("statement", "block", 0), TenantPolicy("spoken", "off", 30)):
        assert tenant_from(stored(policy)).policy == policy
    assert stored(TenantPolicy())["retention_days"] == "none"


def test_a_tenant_stored_before_policies_reads_as_statement_consent():
    fields = stored()
    for name in TenantPolicy.names():
        del fields[name]
    assert tenant_from(fields).policy == TenantPolicy("statement", "warn", None)


@pytest.mark.parametrize("field,value", [("consent", "typed"), ("report_gate", "maybe"), ("retention_days", "-1"),
                                         ("retention_days", "7.5"), ("retention_days", str(MAX_RETENTION_DAYS + 1))])
def test_a_damaged_policy_field_is_a_store_error_not_a_crash(field, value):
    fields = {**stored(), field: value}
    with pytest.raises(StoreError, match="voicering tenant policy"):
        tenant_from(fields)


@pytest.mark.parametrize("changes", [{"consent": "typed"}, {"report_gate": "on"}, {"retention_days": -1},
                                     {"retention_days": True}, {"retention_days": "7"}, {"keep": 1}])
def test_bad_policy_values_are_refused_with_the_choices(changes):
    with pytest.raises(InvalidPolicy) as caught:
        TenantPolicy().replace(**changes)
    assert any(word in caught.value.message for word in ("must be", "unknown policy field"))


def test_retention_days_parse_from_text():
    assert TenantPolicy.parse_retention_days("none") is None
    assert TenantPolicy.parse_retention_days("NONE") is None
    assert TenantPolicy.parse_retention_days("0") == 0
    assert TenantPolicy.parse_retention_days("30") == 30
    for bad in ("", "-1", "forever", "1e3"):
        with pytest.raises(InvalidPolicy):
            TenantPolicy.parse_retention_days(bad)


# -- the registry against a real Redis -------------------------------------------------------------------


async def test_create_and_set_policy_are_stored_and_authenticate_carries_them(tenants: Tenants):
    tenant, key = await tenants.create("acme", policy=TenantPolicy("statement", "block", 7))
    assert (await tenants.get("acme")).policy == TenantPolicy("statement", "block", 7)
    changed = await tenants.set_policy("acme", consent="spoken", retention_days=None)
    assert changed.policy == TenantPolicy("spoken", "block", None)
    assert (await tenants.authenticate(key)).policy == changed.policy
    assert (await tenants.create("plain"))[0].policy == TenantPolicy()
    with pytest.raises(InvalidPolicy):
        await tenants.set_policy("acme", report_gate="loud")
    assert (await tenants.get(tenant.id)).policy == changed.policy


async def test_an_old_tenant_record_reads_as_statement_and_a_damaged_one_is_an_error(tenants: Tenants, client):
    old, _ = await tenants.create("old")
    await client.hdel(tenants.keys.tenant(old.id), *TenantPolicy.names())
    assert (await tenants.get("old")).policy.consent == "statement"
    assert (await tenants.set_policy("old", retention_days=3)).policy == TenantPolicy("statement", "warn", 3)
    await client.hset(tenants.keys.tenant(old.id), "consent", "nonsense")
    with pytest.raises(StoreError, match="damaged"):
        await tenants.get("old")


async def test_voice_records_carry_the_retention_fields(tenants: Tenants):
    tenant, _ = await tenants.create("voices")
    voice = await tenants.register_voice(tenant, "v1", consent="I agree", job_id="job1", state="training")
    assert voice.settled_at is None and voice.recordings_deleted_at is None
    voice = await tenants.update_voice(tenant, "v1", state="ready", settled_at=10.5, recordings_deleted_at=20.0)
    assert (voice.settled_at, voice.recordings_deleted_at) == (10.5, 20.0)
    assert (await tenants.voice(tenant, "v1")).recordings_deleted_at == 20.0


# -- the CLI ---------------------------------------------------------------------------------------------


@pytest.fixture
def env(redis_url: str) -> dict[str, str]:
    return {"VOICERING_GATEWAY_TENANT_PREFIX": f"test:tenant-policy:{uuid.uuid4().hex[:10]}",
            "VOICERING_GATEWAY_REDIS_URL": redis_url, "VOICERING_REDIS_URL": ""}


def invoke(env: dict[str, str], *args: str):
    return CliRunner().invoke(app, list(args), env=env)


def test_the_cli_sets_shows_and_changes_the_policy(env):
    made = invoke(env, "create", "acme", "--consent", "statement", "--report-gate", "block", "--retention-days", "30",
                  "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["tenant"]["policy"] == {"consent": "statement", "report_gate": "block",
                                                           "retention_days": 30}
    shown = invoke(env, "policy", "acme")
    assert shown.exit_code == 0, shown.output
    assert "has: statement consent, report gate block, recordings kept 30 days after the voice is ready" in shown.stdout
    changed = invoke(env, "policy", "acme", "--consent", "spoken", "--retention-days", "none", "--json")
    assert changed.exit_code == 0, changed.output
    assert json.loads(changed.stdout)["policy"] == {"consent": "spoken", "report_gate": "block", "retention_days": None}
    default = invoke(env, "create", "plain")
    assert default.exit_code == 0 and "policy: spoken consent, report gate warn, recordings kept while the voice " \
                                      "exists" in default.stdout
    listing = invoke(env, "list")
    assert listing.exit_code == 0 and "CONSENT" in listing.stdout and "spoken" in listing.stdout


@pytest.mark.parametrize("args,message", [
    (("policy", "acme", "--consent", "typed"), "consent must be one of spoken, statement"),
    (("policy", "acme", "--retention-days", "forever"), "retention_days must be a whole number"),
    (("create", "other", "--report-gate", "loud"), "report_gate must be one of off, warn, block"),
])
def test_bad_policy_options_are_one_clear_line_and_exit_1(env, args, message):
    assert invoke(env, "create", "acme").exit_code == 0
    result = invoke(env, *args)
    assert result.exit_code == 1, result.output
    assert message in result.stderr and "Traceback" not in result.output
    if args[0] == "create":
        assert invoke(env, "policy", "other").exit_code == 1  # nothing was created
