"""The Prometheus rules in deploy/prometheus: promtool accepts them, the config that loads them, and
their unit tests; every alert is tested firing and silent, is labelled and annotated, and has its
runbook section in docs/operations.md; and every metric the rules read is one that a real worker, gateway
or trainer exports (scraped from the session's processes, not from a list kept here).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fixtures.metric_names import exported_names, metric_names, scrape

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "voicering-rules.yml"
RULE_TESTS = PROMETHEUS / "voicering-rules.test.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
OPERATIONS = REPO / "docs" / "operations.md"
RUNBOOK_SECTION = "## Alerts and runbooks"
SEVERITIES = {"page", "ticket"}

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed: `make setup` installs it (Debian package prometheus)")


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


# -- promtool ------------------------------------------------------------------------------------

@needs_promtool
def test_promtool_accepts_the_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_rules_pass_their_unit_tests():
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_accepts_the_config_that_loads_the_rules(tmp_path):
    """Debian's promtool is built without Kubernetes service discovery, and the worker job's token
    file exists only where Prometheus runs: the check reads a copy with static targets and a token
    file here. Everything else (relabelling, authorization, rule_files beside the config) is as
    shipped, and the rules it loads are checked again through it."""
    config = yaml.safe_load(CONFIG.read_text())
    token = tmp_path / "CLUSTER_TOKEN"
    token.write_text("token\n")
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs"), job["job_name"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    (tmp_path / CONFIG.name).write_text(yaml.safe_dump(config))
    for rule_file in config["rule_files"]:
        shutil.copy(PROMETHEUS / rule_file, tmp_path / rule_file)
    result = promtool("check", "config", CONFIG.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(config['rule_files'])} rule files found" in result.stdout
    assert config["rule_files"] == [RULES.name]


# -- what every alert carries ----------------------------------------------------------------------

def runbook_anchors() -> set[str]:
    """GitHub's anchors of the headings under "Alerts and runbooks" (lower case, spaces as dashes)."""
    text = OPERATIONS.read_text()
    assert RUNBOOK_SECTION in text
    section = text.split(RUNBOOK_SECTION, 1)[1].split("\n## ", 1)[0]
    headings = re.findall(r"^### (.+)$", section, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_has_a_severity_annotations_and_its_runbook():
    anchors = runbook_anchors()
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names))
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES, name
        assert alert["annotations"]["summary"].strip(), name
        links = re.findall(r"docs/operations\.md#([\w-]+)", alert["annotations"]["description"])
        assert links == [name.lower()], f"{name}: its description must link its own runbook section"
        assert name.lower() in anchors, f"{name}: no '### {name}' under '{RUNBOOK_SECTION}' in docs/operations.md"
    assert anchors == {name.lower() for name in names}, "a runbook section without an alert"


def test_every_alert_is_unit_tested_firing_and_silent():
    cases: dict[str, list[list]] = {}
    for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(case.get("exp_alerts") or [])
    for alert in alerts():
        expected = cases.get(alert["alert"], [])
        assert any(expected), f"{alert['alert']}: no case where it fires"
        assert not all(expected), f"{alert['alert']}: no case where it stays silent"
        for fired in filter(None, expected):
            assert all(a["exp_labels"]["severity"] == alert["labels"]["severity"] for a in fired)
            assert all({"summary", "description"} <= set(a["exp_annotations"]) for a in fired)


# -- the metrics the rules read --------------------------------------------------------------------

def test_metric_names_are_read_from_an_expression():
    expr = ('sum by (le) (rate(a_bucket{x="}", le=~"0.5"}[5m])) > on() group_left() b:c:d and d_total offset 5m '
            'or histogram_quantile(0.99, e) * 1e3 unless absent(up{job="w"} == 1)')
    assert metric_names(expr) == {"a_bucket", "b:c:d", "d_total", "e", "up"}


def test_the_rules_read_only_metrics_a_process_exports(worker, gateway, trainer):
    exported = (exported_names(scrape(f"{worker.http}/metrics")) | exported_names(scrape(gateway.metrics_url))
                | exported_names(scrape(f"{trainer.url}/metrics")))
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    read = {name for rule in rules() for name in metric_names(rule["expr"])}
    assert read, "no metric names found in the rules"
    unknown = read - exported - recorded - {"up"}
    assert not unknown, f"the rules read metrics no worker, gateway or trainer exports: {sorted(unknown)}"
    assert read & exported, "the rules read no exported metric at all"


def test_the_rules_select_the_scrape_jobs_of_prometheus_yml():
    jobs = {job["job_name"] for job in yaml.safe_load(CONFIG.read_text())["scrape_configs"]}
    selected = {job for rule in rules() for job in re.findall(r'\bjob\s*=\s*"([^"]+)"', rule["expr"])}
    assert selected == jobs, f"rules select jobs {sorted(selected)}, prometheus.yml has {sorted(jobs)}"
