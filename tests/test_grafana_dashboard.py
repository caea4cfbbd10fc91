"""The Grafana dashboard (deploy/grafana/voicering.json) and what provisions it: the JSON is a well
formed dashboard (unique ids, panels on the 24-column grid, every query through the `datasource`
variable), every query parses as PromQL (promtool) and reads only metrics a real worker or gateway
exports (scraped from the session's processes) or a recording rule of voicering-rules.yml; the
compose stack mounts the dashboard where its provisioning looks and runs a Prometheus that scrapes
every worker and the gateway; the Kubernetes ConfigMap kustomize generates holds the same JSON.
Grafana itself is not needed: the checks read the files.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.fixtures.metric_names import (GRAFANA_VARIABLE, exported_names, metric_names, scrape,
                                         without_grafana_variables)

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "voicering.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "voicering.yml"
COMPOSE_PROMETHEUS = GRAFANA / "prometheus-compose.yml"
RULES = DEPLOY / "prometheus" / "voicering-rules.yml"
K8S_PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
K8S_COPY = K8S / "grafana" / "voicering.json"
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
PROFILES = ("cpu", "gpu")

GRID_COLUMNS = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's own variables, and a value of each that PromQL accepts where the dashboard uses it
GRAFANA_BUILTINS = {"__rate_interval": "5m", "__interval": "1m", "__range": "6h"}
# series Prometheus writes for every target itself (no process exports them)
SCRAPE_SERIES = {"up"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(.*),)?\s*\w+\s*\)\s*$", re.S)

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed: `make setup` installs it (Debian package prometheus)")


@cache
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    """Every panel, rows' collapsed children too."""
    return [p for top in dashboard()["panels"] for p in (top, *top.get("panels", []))]


def variables() -> dict[str, dict]:
    return {v["name"]: v for v in dashboard()["templating"]["list"]}


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (its label_values metric)."""
    found = [(f"panel {p['id']} {p['title']!r} {t['refId']}", t["expr"])
             for p in panels() for t in p.get("targets", [])]
    for name, var in variables().items():
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            match = _LABEL_VALUES.match(query)
            if match is None:
                pytest.fail(f"variable {name}: only label_values(...) queries are checked, not {query!r}")
            if match[1]:
                found.append((f"variable {name}", match[1]))
    return found


def sample_values() -> dict[str, str]:
    """A value for every variable, as Grafana would fill it in: a textbox its default, a
    multi-value query variable its All regex."""
    values = dict(GRAFANA_BUILTINS)
    for name, var in variables().items():
        values[name] = var["query"] if var["type"] in ("textbox", "constant") else var.get("allValue") or ".*"
    return values


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def exported(worker, gateway, trainer) -> dict[str, set[str]]:
    """What the session's real worker, gateway and trainer export, scraped once for this module."""
    return {"worker": exported_names(scrape(f"{worker.http}/metrics")),
            "gateway": exported_names(scrape(gateway.metrics_url)),
            "trainer": exported_names(scrape(f"{trainer.url}/metrics"))}


# -- the JSON ------------------------------------------------------------------------------------

def test_the_dashboard_is_well_formed():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    assert variables()["datasource"]["type"] == "datasource" and variables()["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels():
        name = f"panel {panel['id']} {panel.get('title')!r}"
        assert panel.get("title"), name
        if panel["type"] == "row":
            assert "targets" not in panel, name
            continue
        assert panel["datasource"] == DATASOURCE, f"{name}: the datasource must be the $datasource variable"
        assert panel["targets"], f"{name}: no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(refs), f"{name}: refIds {refs}"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"{name} {target['refId']}: empty expr"
            assert target.get("datasource", DATASOURCE) == DATASOURCE, name
    for name, var in variables().items():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, f"variable {name}"


def test_panels_tile_the_grid_without_overlapping():
    taken: dict[tuple[int, int], int] = {}
    for panel in panels():
        pos = panel["gridPos"]
        assert pos["w"] >= 1 and pos["h"] >= 1 and pos["x"] >= 0 and pos["y"] >= 0, panel["id"]
        assert pos["x"] + pos["w"] <= GRID_COLUMNS, f"panel {panel['id']} runs past column {GRID_COLUMNS}"
        columns, lines = range(pos["x"], pos["x"] + pos["w"]), range(pos["y"], pos["y"] + pos["h"])
        for cell in ((x, y) for x in columns for y in lines):
            assert cell not in taken, f"panels {taken[cell]} and {panel['id']} overlap at {cell}"
            taken[cell] = panel["id"]


def test_every_variable_a_query_uses_is_defined():
    defined = set(variables()) | set(GRAFANA_BUILTINS)
    used = {next(filter(None, m.groups())) for _, expr in queries() for m in GRAFANA_VARIABLE.finditer(expr)}
    assert used, "no query uses a variable"
    assert used <= defined, f"undefined variables: {sorted(used - defined)}"


def test_grafana_variables_are_taken_out_before_metric_names_are_read():
    expr = ('sum(rate(a_total{w=~"$worker"}[$__rate_interval])) / (count(up == 1) * $max_streams) '
            '+ b[${__range}] * ${cap:raw} + [[old]]')
    assert metric_names(without_grafana_variables(expr)) == {"a_total", "up", "b"}
    assert without_grafana_variables("x[$__rate_interval] * $n", {"__rate_interval": "5m", "n": "32"}) == "x[5m] * 32"


@needs_promtool
def test_promtool_parses_every_query(tmp_path):
    """Each query, its variables filled in as Grafana would, as a recording rule: promtool parses it."""
    values = sample_values()
    records = [{"record": f"grafana:query_{i}", "expr": without_grafana_variables(expr, values)}
               for i, (_, expr) in enumerate(queries())]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(records)} rules found" in result.stdout


def test_the_dashboard_reads_only_metrics_a_process_exports(exported):
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    read_by: dict[str, set[str]] = {}
    for where, expr in queries():
        for name in metric_names(without_grafana_variables(expr)):
            read_by.setdefault(name, set()).add(where)
    known = exported["worker"] | exported["gateway"] | exported["trainer"] | recorded | SCRAPE_SERIES
    unknown = {name: sorted(where) for name, where in read_by.items() if name not in known}
    assert not unknown, f"panels read metrics no worker, gateway or trainer exports and no rule records: {unknown}"
    assert set(read_by) & exported["worker"] and set(read_by) & exported["gateway"] and set(read_by) & exported["trainer"]
    assert set(read_by) & recorded, "the dashboard reads no recording rule (its thresholds at least)"


def test_the_capacity_variable_is_the_workers_max_streams():
    """The workers export no capacity metric: the dashboard's `max_streams` stands in for it, and
    its default is what the workers run with."""
    from gpu_worker.settings import WorkerSettings

    default = variables()["max_streams"]["query"]
    configmap = next(doc for doc in yaml.safe_load_all((K8S / "configmap.yaml").read_text())
                     if doc and doc["metadata"]["name"] == "voicering-worker")
    assert default == str(WorkerSettings.model_fields["max_streams"].default)
    assert default == configmap["data"]["VOICERING_WORKER_MAX_STREAMS"]
    assert any("$max_streams" in expr for _, expr in queries())


# -- compose -------------------------------------------------------------------------------------

@cache
def compose_file() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def mounts(service: dict) -> dict[str, tuple[Path | str, bool]]:
    """container path -> (host path, or a volume's name; read-only)"""
    out = {}
    for volume in service.get("volumes", []):
        source, target, *mode = volume.split(":")
        host = (DEPLOY / source).resolve() if source.startswith(".") else source
        out[target] = (host, mode == ["ro"])
    return out


def services(profile: str) -> dict[str, dict]:
    return {name: s for name, s in compose_file()["services"].items()
            if not s.get("profiles") or profile in s["profiles"]}


def test_compose_grafana_loads_the_dashboard_from_prometheus():
    grafana = compose_file()["services"]["grafana"]
    mounted = mounts(grafana)
    provisioning = PurePosixPath("/etc/grafana/provisioning")
    for kind, path in (("datasources", DATASOURCES), ("dashboards", PROVIDERS)):
        assert mounted[str(provisioning / kind)] == (path.parent, True), f"{kind} provisioning is not mounted read-only"
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file"
    folder = PurePosixPath(provider["options"]["path"])
    in_folder = {path: host for path, (host, ro) in mounted.items() if PurePosixPath(path).parent == folder and ro}
    assert list(in_folder.values()) == [DASHBOARD], f"{folder} must hold deploy/grafana/voicering.json, read-only"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in in_folder
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus"
    host, port = re.fullmatch(r"http://([\w-]+):(\d+)", source["url"]).groups()
    assert host in compose_file()["services"] and "profiles" not in compose_file()["services"][host]
    assert f"{host}:{port}" == "prometheus:9090"  # the image's listen address
    for published in grafana.get("ports", []) + compose_file()["services"]["prometheus"].get("ports", []):
        assert published.startswith("127.0.0.1:"), "the metrics name every tenant: publish on loopback only"


def test_compose_prometheus_runs_the_config_with_its_rules_and_the_token():
    prometheus = compose_file()["services"]["prometheus"]
    assert prometheus["entrypoint"] == ["/bin/sh", "-c"]
    (script,) = prometheus["command"]
    words = shlex.split(script.replace("$$", "$"))
    config_at = PurePosixPath(next(w.split("=", 1)[1] for w in words if w.startswith("--config.file=")))
    mounted = mounts(prometheus)
    assert mounted[str(config_at)] == (COMPOSE_PROMETHEUS, True)
    config = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())
    for rule_file in config["rule_files"]:  # read from the config's own directory
        assert mounted[str(config_at.parent / rule_file)] == (DEPLOY / "prometheus" / rule_file, True)
    (worker_job,) = [job for job in config["scrape_configs"] if "authorization" in job]
    token_file = worker_job["authorization"]["credentials_file"]
    assert re.search(rf'printf %s "\$CLUSTER_TOKEN" > {re.escape(token_file)} && exec ', script.replace("$$", "$"))
    assert prometheus["environment"]["CLUSTER_TOKEN"] == compose_file()["services"]["gateway"]["environment"][
        "VOICERING_GATEWAY_CLUSTER_TOKEN"]


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_prometheus_scrapes_every_worker_and_the_gateway(profile):
    config = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    on_kubernetes = {job["job_name"] for job in yaml.safe_load(K8S_PROMETHEUS.read_text())["scrape_configs"]}
    assert set(jobs) == on_kubernetes, \
        "the job names of deploy/prometheus/prometheus.yml: the rules select them"
    running = services(profile)
    reachable = {}  # host name on the compose network -> service
    for name, service in running.items():
        reachable[name] = service
        for network in (service.get("networks") or {}).values():
            reachable.update({alias: service for alias in (network or {}).get("aliases", [])})
    workers = [s for s in running.values() if "VOICERING_WORKER_WORKER_ID" in s.get("environment", {})]
    scraped = []
    for group in jobs["voicering-worker"]["static_configs"]:
        for target in group["targets"]:
            host, port = target.split(":")
            assert host in reachable, f"{profile}: no service or network alias {host!r} for target {target}"
            service = reachable[host]
            env = service["environment"]
            assert port == env["VOICERING_WORKER_PORT"], target
            assert group["labels"]["worker_id"] == env["VOICERING_WORKER_WORKER_ID"], target
            scraped.append(service)
    assert sorted(map(id, scraped)) == sorted(map(id, workers)), f"{profile}: not every worker is scraped once"
    ((target,),) = [group["targets"] for group in jobs["voicering-gateway"]["static_configs"]]
    host, port = target.split(":")
    assert port == reachable[host]["environment"]["VOICERING_GATEWAY_METRICS_PORT"]
    assert reachable[host]["environment"]["VOICERING_GATEWAY_METRICS_HOST"] == "0.0.0.0"
    ((target,),) = [group["targets"] for group in jobs["voicering-trainer"]["static_configs"]]
    host, port = target.split(":")
    trainers = [s for s in running.values() if "VOICERING_TRAIN_DEVICE" in s.get("environment", {})]
    assert [reachable[host]] == trainers, f"{profile}: the trainer target is not the profile's one trainer"
    assert port == trainers[0]["environment"]["VOICERING_TRAIN_HEALTH_PORT"]
    assert trainers[0]["environment"]["VOICERING_TRAIN_HEALTH_HOST"] == "0.0.0.0"


@needs_promtool
def test_promtool_accepts_the_compose_prometheus_config(tmp_path):
    config = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())
    token = tmp_path / "cluster-token"
    token.write_text("token")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    for rule_file in config["rule_files"]:
        shutil.copy(RULES.parent / rule_file, tmp_path / rule_file)
    result = subprocess.run([PROMTOOL, "check", "config", "prometheus.yml"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(config['rule_files'])} rule files found" in result.stdout


# -- Kubernetes ----------------------------------------------------------------------------------

def test_the_k8s_copy_is_the_dashboard():
    """kustomize reads files only below deploy/k8s: its copy must be the same bytes."""
    assert K8S_COPY.read_bytes() == DASHBOARD.read_bytes(), "cp deploy/grafana/voicering.json deploy/k8s/grafana/"
    (generator,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["configMapGenerator"]
    assert [K8S / f for f in generator["files"]] == [K8S_COPY]
    assert generator["options"]["labels"]["grafana_dashboard"] == "1"
    assert generator["options"]["disableNameSuffixHash"] is True


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (it builds the kustomization)")
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kustomize_generates_a_configmap_with_the_dashboard(tmp_path, version):
    import kubernetes_validate

    root = tmp_path / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("secrets.env"))
    example = (K8S / "secrets.env.example").read_text().splitlines()
    (root / "secrets.env").write_text("".join(f"{line}x\n" for line in example if line and not line.startswith("#")))
    built = subprocess.run(["kubectl", "kustomize", str(root)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    (configmap,) = [doc for doc in yaml.safe_load_all(built.stdout)
                    if doc and doc["kind"] == "ConfigMap" and "grafana_dashboard" in doc["metadata"].get("labels", {})]
    assert configmap["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    kubernetes_validate.validate(configmap, version, strict=True)
