"""The tenant's retention period over its voices' recordings (`gateway.cloning.retention`), on a real
Redis and real folders, with the clock passed in: due recordings go and the voice record says so,
nothing else is touched, a voice still training never is, and the view shows it."""

from __future__ import annotations

import pytest

from gateway.cloning.retention import DAY_S, Retention, recordings_expire_at
from gateway.cloning.uploads import UploadArea
from gateway.cloning.views import clone_view
from gateway.tenants import TenantPolicy, Tenants, TenantVoice

pytestmark = pytest.mark.timeout(120)
T0 = 1_000_000.0


def test_when_recordings_expire():
    voice = TenantVoice("v", "t_abcdefghij/v", "I agree", T0 - 50, "job1", state="ready", settled_at=T0)
    assert recordings_expire_at(voice, TenantPolicy()) is None  # kept while the voice exists
    assert recordings_expire_at(voice, TenantPolicy(retention_days=0)) == T0
    assert recordings_expire_at(voice, TenantPolicy(retention_days=2)) == T0 + 2 * DAY_S
    old = TenantVoice("v", "t_abcdefghij/v", "I agree", T0 - 50, "job1", state="failed")  # settled before settled_at
    assert recordings_expire_at(old, TenantPolicy(retention_days=1)) == T0 - 50 + DAY_S
    training = TenantVoice("v", "t_abcdefghij/v", "I agree", T0, "job1", state="training")
    assert recordings_expire_at(training, TenantPolicy(retention_days=0)) is None
    gone = TenantVoice("v", "t_abcdefghij/v", "I agree", T0, "job1", state="ready", recordings_deleted_at=T0)
    assert recordings_expire_at(gone, TenantPolicy(retention_days=0)) is None


def _recordings(area: UploadArea, tenant_id: str, name: str, job_id: str):
    folder = area.job_dir(tenant_id, name, job_id)
    (folder / "audio").mkdir(parents=True)
    (folder / "audio" / "take.wav").write_bytes(b"RIFF")
    (folder / "consent-audio.wav").write_bytes(b"RIFF")
    return folder


async def test_the_sweep_deletes_due_recordings_and_records_it(tenants: Tenants, tmp_path):
    area = UploadArea(tmp_path / "uploads")
    retention = Retention(tenants, area)
    short, _ = await tenants.create("short", policy=TenantPolicy(retention_days=3))
    keep, _ = await tenants.create("keep")  # None: while the voice exists
    folders = {}
    for tenant in (short, keep):
        for name, state in (("done", "ready"), ("busy", "training")):
            await tenants.register_voice(tenant, name, consent="I agree", job_id=f"job-{name}", state=state)
            folders[tenant.name, name] = _recordings(area, tenant.id, name, f"job-{name}")
        await tenants.update_voice(tenant, "done", settled_at=T0)

    assert await retention.sweep(now=T0 + 3 * DAY_S - 1) == 0  # not yet
    assert all(f.is_dir() for f in folders.values())
    assert await retention.sweep(now=T0 + 3 * DAY_S) == 1
    assert not folders["short", "done"].exists() and not area.voice_dir(short.id, "done").exists()
    assert folders["short", "busy"].is_dir()  # still training: its trainer reads them
    assert folders["keep", "done"].is_dir() and folders["keep", "busy"].is_dir()
    voice = await tenants.voice(short, "done")
    assert voice.recordings_deleted_at == T0 + 3 * DAY_S and voice.state == "ready"
    view = clone_view(voice, None, None, now=T0 + 3 * DAY_S).to_json()
    assert view["state"] == "ready" and view["recordings_deleted_at"] == int(T0 + 3 * DAY_S)
    assert await retention.sweep(now=T0 + 9 * DAY_S) == 0  # once

    await tenants.set_policy("keep", retention_days=0)  # a period set later applies to voices made before
    assert await retention.sweep(now=T0 + 1) == 1
    assert not folders["keep", "done"].exists() and folders["keep", "busy"].is_dir()


async def test_a_voice_made_again_under_the_same_name_keeps_its_recordings(tenants: Tenants, tmp_path):
    area = UploadArea(tmp_path / "uploads")
    tenant, _ = await tenants.create("again", policy=TenantPolicy(retention_days=0))
    old = await tenants.register_voice(tenant, "v", consent="I agree", job_id="job-old", state="ready")
    await tenants.delete_voice(tenant, "v")
    await tenants.register_voice(tenant, "v", consent="I agree", job_id="job-new", state="ready")
    new_folder = _recordings(area, tenant.id, "v", "job-new")
    assert not await Retention(tenants, area).expire_voice(tenant, old, now=T0)  # the record read before the delete
    assert new_folder.is_dir() and (await tenants.voice(tenant, "v")).recordings_deleted_at is None
