"""The deploy configs (deploy/): Kubernetes manifests, the compose file, the Dockerfiles.

Offline, in seconds, nothing started: every manifest is validated by `kubernetes-validate`
(strict, against each version in KUBERNETES_VERSIONS), the compose file by Debian's
`docker-compose config` for both profiles (it needs no Docker daemon), and then what neither
tool knows about voicering:

- every VOICERING_* name anywhere in deploy/ (and docs/operations.md) is a real setting, derived
  from the pydantic settings classes and the CLI's own env vars, never from a list kept here;
- each container's environment (image ENV + compose / ConfigMap / env, $(VAR) expanded) builds
  its process's settings object: types, JSON tuples and Literal values are checked by pydantic;
- every `voicering ...` command line (CMD, compose command, k8s args and hooks, systemd
  ExecStart, the docs' code blocks) parses against the real CLI (typer/click);
- Dockerfiles run as a non-root USER with a HEALTHCHECK for their role, and copy only what
  /.dockerignore lets into the context;
- ports agree between settings, containers, Services, probes and advertised URLs; the workers'
  preStop drain and grace period; NetworkPolicies, PDBs, HPA and Prometheus jobs select the pods
  they mean to.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any
from unittest import mock

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
K8S_STORAGE = K8S / "storage"
DOCKER = DEPLOY / "docker"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE_ENV_EXAMPLE = DEPLOY / "compose.env.example"
SECRETS_EXAMPLE = K8S / "secrets.env.example"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
OPERATIONS = REPO / "docs" / "operations.md"

# The oldest Kubernetes the manifests are written for, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
PROFILES = ("cpu", "gpu")
# values for the compose file's required ${...:?} secrets while validating it
COMPOSE_SECRETS = {"CLUSTER_TOKEN": "t" * 64, "LIVEKIT_API_KEY": "APIvoicering", "LIVEKIT_API_SECRET": "s" * 40,
                   **{f"REDIS_PASSWORD_{u.upper()}": f"{u}{'p' * 24}" for u in ("gateway", "worker", "agent", "trainer",
                                                                           "operator")}}
# ... and every other ${...:?} it requires (the address LiveKit advertises: a documentation address)
COMPOSE_REQUIRED = {**COMPOSE_SECRETS, "LIVEKIT_NODE_IP": "192.0.2.10"}
HEALTH_ROLE = {"worker": "worker", "gateway": "gateway", "agent": "agent", "train-worker": "trainer"}
# containers that take no requests (no Service, no readiness): /health on their internal port is
# their liveness probe (see deploy/README.md)
NO_TRAFFIC = {"train-worker"}
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
VOICERING_NAME = re.compile(r"\bVOICERING_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])")


# -- the code's own truth ------------------------------------------------------------------------

def settings_classes() -> dict[str, type]:
    """The settings class each `voicering` subcommand builds."""
    from gateway.livekit.settings import AgentSettings
    from gateway.settings import GatewaySettings
    from voicering.stack.settings import UpSettings
    from gpu_worker.settings import WorkerSettings
    from lora_training.settings import TrainSettings

    return {"worker": WorkerSettings, "gateway": GatewaySettings, "train-worker": TrainSettings, "agent": AgentSettings,
            "up": UpSettings}


@cache
def cli_root():
    import typer.main

    import voicering.cli

    return typer.main.get_command(voicering.cli.app)


def walk_cli(command=None) -> Iterator[Any]:
    command = command or cli_root()
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from walk_cli(sub)


@cache
def real_env_names() -> frozenset[str]:
    """Every environment variable voicering reads: each settings field under its prefix or its
    aliases (nested models with the delimiter), hashring's Redis URL, the CLI's envvar options, and
    the passwords `voicering redis-acl` reads."""
    from pydantic import AliasChoices, BaseModel

    from hashring.settings import ADMIT_FACTOR_ENV, HEARTBEAT_ENV, REDIS_URL_ENV, REFRESH_ENV, SHARE_FLOOR_ENV
    from voicering.redis_acl import USERS, password_env

    names = {REDIS_URL_ENV, HEARTBEAT_ENV, REFRESH_ENV, ADMIT_FACTOR_ENV, SHARE_FLOOR_ENV, *map(password_env, USERS)}
    for cls in settings_classes().values():
        prefix = cls.model_config.get("env_prefix", "")
        delimiter = cls.model_config.get("env_nested_delimiter")
        for name, field in cls.model_fields.items():
            alias = field.validation_alias
            if isinstance(alias, AliasChoices):
                names.update(c.upper() for c in alias.choices if isinstance(c, str))
            elif isinstance(alias, str):
                names.add(alias.upper())
            else:
                names.add(f"{prefix}{name}".upper())
            nested = field.annotation
            if delimiter and isinstance(nested, type) and issubclass(nested, BaseModel):
                names.update(f"{prefix}{name}{delimiter}{sub}".upper() for sub in nested.model_fields)
    for command in walk_cli():
        for param in getattr(command, "params", []):
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else envvar or [])
    return frozenset(names)


def parse_cli(argv: list[str]) -> tuple[str, dict]:
    """Parse `voicering ARGV...` as the real CLI would (no callback runs); returns the subcommand
    path ('ring drain') and its parameters. Raises the CLI's usage error on anything it refuses."""
    command = cli_root()
    ctx = command.make_context("voicering", list(argv))
    path = []
    while hasattr(command, "resolve_command"):
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return " ".join(path), ctx.params


def voicering_commands(argv: list[str], env: dict[str, str]) -> list[list[str]]:
    """The `voicering` invocations in a command: itself, or those inside `sh -c SCRIPT` (split at
    &&, ||, ;), with $VAR / "$VAR" taken from `env`."""
    if argv[:2] == ["sh", "-c"]:
        found = []
        for part in re.split(r"&&|\|\||;", argv[2]):
            words = shlex.split(re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m[1], m[0]), part))
            if words[:1] == ["exec"]:
                words = words[1:]
            if words[:1] == ["voicering"]:
                found.append(words[1:])
        return found
    return [argv[1:]] if argv[:1] == ["voicering"] else []


CONTAINER_ROOT = REPO / ".cache" / "test-deploy-container-paths"


def as_here(env: dict[str, str]) -> dict[str, str]:
    """Weights named by a path exist inside the container (a volume), not on this machine, and a
    worker checks that such a folder exists: map each to an empty folder of the same path here."""
    out = dict(env)
    for name, value in env.items():
        if name.endswith(("_MODEL", "_CODEC")) and value.startswith("/") and not Path(value).is_dir():
            here = CONTAINER_ROOT / value.lstrip("/")
            here.mkdir(parents=True, exist_ok=True)
            out[name] = str(here)
    return out


def build_settings(subcommand: str, env: dict[str, str]):
    """The settings object `voicering SUBCOMMAND` builds in this environment (only that env)."""
    with mock.patch.dict(os.environ, as_here(env), clear=True):
        return settings_classes()[subcommand]()


# -- reading the configs -------------------------------------------------------------------------

@cache
def k8s_files() -> tuple[Path, ...]:
    """The application's manifests and, in storage/, those applied once and never deleted with it."""
    return tuple(sorted(p for folder in (K8S, K8S_STORAGE) for p in folder.glob("*.yaml")
                        if p.name != "kustomization.yaml"))


@cache
def k8s_docs() -> tuple[dict, ...]:
    return tuple(doc for path in k8s_files() for doc in yaml.safe_load_all(path.read_text()) if doc)


def k8s(kind: str, name: str | None = None) -> list[dict]:
    return [d for d in k8s_docs() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(kind: str, name: str) -> dict:
    (doc,) = k8s(kind, name)
    return doc


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def generated_secret() -> dict:
    """The Secret kustomize's secretGenerator makes of secrets.env (here: of the example, filled)."""
    (gen,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["secretGenerator"]
    keys = env_file(SECRETS_EXAMPLE)
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]}, "type": "Opaque",
            "stringData": {k: "x" * 40 for k in keys}}


def workloads() -> list[dict]:
    return [d for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")]


def pod_labels(workload: dict) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels + matchExpressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def container_env(workload: dict, container: dict) -> dict[str, str]:
    """A container's environment as the kubelet builds it: image ENV, then envFrom ConfigMaps,
    then env (fieldRefs and secretKeyRefs filled with stand-ins, $(VAR) expanded in order)."""
    env = dockerfile_env(dockerfile_for_image(container["image"]))
    for source in container.get("envFrom", []):
        env.update(one("ConfigMap", source["configMapRef"]["name"])["data"])
    name = f"{workload['metadata']['name']}-0"
    fields = {"metadata.name": name, "metadata.namespace": "voicering"}
    secret = generated_secret()
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = VAR.sub(lambda m: env.get(m[1], m[0]), item["value"])
        elif "fieldRef" in item["valueFrom"]:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"], f"{container['name']}: unknown Secret {ref['name']}"
            assert ref["key"] in secret["stringData"], f"{container['name']}: {ref['key']} is not in {SECRETS_EXAMPLE.name}"
            env[item["name"]] = secret["stringData"][ref["key"]]
    return env


def containers() -> Iterator[tuple[dict, dict]]:
    """Every voicering container (Redis runs its own image) with its workload."""
    for workload in workloads():
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if container["image"].split(":")[0].startswith("voicering"):
                yield workload, container


def subcommand_of(argv: list[str]) -> str:
    return argv[1] if argv[:1] == ["voicering"] else ""


# Dockerfiles

def dockerfile_lines(path: Path) -> list[str]:
    """Instructions with line continuations joined and comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def final_stage(path: Path) -> list[str]:
    lines = dockerfile_lines(path)
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return lines[last_from:]


def dockerfile_env(path: Path) -> dict[str, str]:
    env = {}
    for line in final_stage(path):
        if line.upper().startswith("ENV "):
            for word in shlex.split(line[4:]):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def json_instruction(path: Path, keyword: str) -> list[str]:
    (line,) = [line for line in final_stage(path) if line.split()[0].upper() == keyword]
    return json.loads(line[len(keyword):].strip())


def healthcheck_command(path: Path) -> list[str]:
    (line,) = [line for line in final_stage(path) if line.split()[0].upper() == "HEALTHCHECK"]
    return json.loads(line.split(" CMD ", 1)[1])


def dockerfiles() -> list[Path]:
    return sorted(DOCKER.glob("*.Dockerfile"))


# compose

def run_compose(profile: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.fail("docker-compose is not installed: `make setup` installs it (Debian package docker-compose)")
    # the example as the env file (its secrets are empty: they come from `env`), so that an
    # operator's deploy/.env never leaks into the check
    return subprocess.run([tool, "-f", str(COMPOSE_FILE), "--env-file", str(COMPOSE_ENV_EXAMPLE), "--profile", profile,
                           "config"],
                          capture_output=True,
                          text=True, timeout=60, cwd=REPO,
                          env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env})


@cache
def compose(profile: str) -> dict:
    done = run_compose(profile, COMPOSE_REQUIRED)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    # Debian's docker-compose 1.29 `config` prints every service; `up` starts only the active ones
    config["services"] = {name: s for name, s in config["services"].items()
                          if not s.get("profiles") or profile in s["profiles"]}
    return config


@cache
def compose_images() -> dict[str, Path]:
    """Image repository -> the Dockerfile compose builds it from."""
    images = {}
    for profile in PROFILES:
        for service in compose(profile)["services"].values():
            if "build" in service:
                images[service["image"].split(":")[0]] = REPO / service["build"]["dockerfile"]
    return images


def dockerfile_for_image(image: str) -> Path:
    repo = image.split(":")[0]
    assert repo in compose_images(), f"image {image}: no Dockerfile builds it (compose builds {sorted(compose_images())})"
    return compose_images()[repo]


def service_command(service: dict) -> list[str]:
    command = service.get("command")
    if command is None:
        return json_instruction(dockerfile_for_image(service["image"]), "CMD")
    return shlex.split(command) if isinstance(command, str) else list(command)


def service_env(service: dict) -> dict[str, str]:
    env = dockerfile_env(dockerfile_for_image(service["image"]))
    env.update({k: "" if v is None else str(v) for k, v in (service.get("environment") or {}).items()})
    return env


def voicering_services(profile: str) -> dict[str, dict]:
    return {name: s for name, s in compose(profile)["services"].items()
            if s["image"].split(":")[0] in compose_images()}


# -- Kubernetes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(version):
    import kubernetes_validate

    docs = [*k8s_docs(), generated_secret()]
    assert len(docs) > 15
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except Exception as exc:  # the validator's message names the field
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} is not valid Kubernetes {version}: {exc}")


def test_kustomization_lists_every_manifest_and_generates_the_secret():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in k8s_files() if p.parent == K8S)
    storage = yaml.safe_load((K8S_STORAGE / "kustomization.yaml").read_text())
    assert sorted(storage["resources"]) == sorted(p.name for p in k8s_files() if p.parent == K8S_STORAGE)
    assert kustomization["secretGenerator"][0]["envs"] == ["secrets.env"]
    assert "secrets.env" in (K8S / ".gitignore").read_text().split()
    assert ".env" in (DEPLOY / ".gitignore").read_text().split(), "deploy/.env holds the compose secrets"
    assert not k8s("Secret"), "secrets come from secrets.env through the generator, never from git"
    # every key the example names is used by some container, and every container's key exists
    every = [c for w in workloads() for kind in ("initContainers", "containers")
             for c in w["spec"]["template"]["spec"].get(kind, [])]  # Redis's and its init container too
    used = {item["valueFrom"]["secretKeyRef"]["key"] for c in every for item in c.get("env", [])
            if "secretKeyRef" in item.get("valueFrom", {})}
    assert used == set(env_file(SECRETS_EXAMPLE))


def test_every_container_runs_a_real_command_with_valid_settings():
    seen = set()
    for workload, container in containers():
        argv = container.get("args") or json_instruction(dockerfile_for_image(container["image"]), "CMD")
        assert "command" not in container, "keep the image's ENTRYPOINT (tini, PID 1); set args"
        env = container_env(workload, container)
        if argv[:1] == ["voicering"]:
            sub, _ = parse_cli(argv[1:])
            seen.add(sub)
            settings = build_settings(sub, env)
            if sub == "worker":
                assert settings.worker_id == f"{workload['metadata']['name']}-0"
        for hook in (container.get("lifecycle") or {}).values():
            for argv in [hook["exec"]["command"]] if "exec" in hook else []:
                for cmd in voicering_commands(argv, env):
                    parse_cli(cmd)
    assert seen == {"worker", "gateway", "agent", "train-worker"}


# the Redis ACL user of each process (voicering/redis_acl.py)
REDIS_USER = {"worker": "worker", "gateway": "gateway", "agent": "agent", "train-worker": "trainer"}


def fleet_agreement(settings_by_process: list[tuple[str, Any]]) -> None:
    """What every process of a fleet must agree on: one Redis, one ring prefix, one training queue,
    one cluster token, one adapter-rank limit, one base model and codec."""
    def values(fields: dict[str, str]) -> set:
        return {str(getattr(s, fields[sub])) for sub, s in settings_by_process if sub in fields}

    urls = [(sub, urlsplit(str(s.redis_url))) for sub, s in settings_by_process if hasattr(s, "redis_url")]
    redis = {u._replace(netloc=u.netloc.rsplit("@", 1)[-1]).geturl() for _, u in urls}  # one Redis, ...
    users = {sub: u.username for sub, u in urls}  # ... each process as its own ACL user (voicering redis-acl)
    assert all(users[sub] == REDIS_USER[sub] for sub in users), users
    prefixes = values({"worker": "ring_prefix", "gateway": "ring_prefix", "agent": "ring_prefix"})
    queues = values({"gateway": "train_prefix", "train-worker": "queue_prefix"})
    tokens = {s.cluster_token if isinstance(s.cluster_token, str) or s.cluster_token is None
              else s.cluster_token.get_secret_value() for sub, s in settings_by_process if hasattr(s, "cluster_token")}
    ranks = values({"worker": "max_lora_rank", "train-worker": "max_lora_rank"})
    # adapters are trained on the model the workers serve (a worker refuses any other base)
    models = values({"worker": "model", "train-worker": "base_model"})
    codecs = values({"worker": "codec", "train-worker": "codec"})
    for agreed in (redis, prefixes, queues, ranks, models, codecs):
        assert len(agreed) == 1, agreed
    assert len(tokens) == 1 and None not in tokens


def test_every_k8s_process_agrees_on_redis_ring_queue_and_token():
    fleet_agreement([(sub, build_settings(sub, container_env(w, c))) for w, c in containers()
                     if (sub := subcommand_of(c.get("args") or []))])


@pytest.mark.parametrize("profile", PROFILES)
def test_every_compose_process_agrees_on_redis_ring_queue_and_token(profile):
    found = []
    for service in voicering_services(profile).values():
        env = service_env(service)
        for sub in [parse_cli(c)[0] for c in voicering_commands(service_command(service), env)]:
            if sub in settings_classes():
                found.append((sub, build_settings(sub, env)))
    fleet_agreement(found)


def test_worker_statefulset_drains_before_it_stops_and_waits_long_enough():
    sts = one("StatefulSet", "voicering-worker")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_env(sts, container)
    settings = build_settings("worker", env)
    (drain,) = voicering_commands(container["lifecycle"]["preStop"]["exec"]["command"], env)
    sub, params = parse_cli(drain)
    assert sub == "ring drain" and params["worker"] == settings.worker_id
    # the drain CLI reaches the same Redis and ring prefix as the worker itself
    from hashring.settings import REDIS_URL_ENV

    assert env[REDIS_URL_ENV] == settings.redis_url and env["VOICERING_RING_PREFIX"] == settings.ring_prefix
    # hook + SIGTERM drain grace + the engine's shutdown (a real GPU engine takes tens of seconds)
    assert pod["terminationGracePeriodSeconds"] >= settings.drain_grace_s + 30
    assert settings.drain_grace_s >= 60, "streams of a long reply need more than the 30 s default"
    assert sts["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1 == container["resources"]["requests"]["nvidia.com/gpu"]
    assert settings.cluster_token and settings.redis_url


def test_worker_ids_addresses_and_ports_agree():
    sts = one("StatefulSet", "voicering-worker")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    settings = build_settings("worker", container_env(sts, container))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"ws": settings.port}
    service = one("Service", sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(sts))
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(settings.port, "ws")]
    # the advertised URL is this pod's DNS name under the headless Service, on the worker's port
    expected = f"ws://{settings.worker_id}.{service['metadata']['name']}.voicering.svc:{settings.port}"
    assert settings.advertise_url == expected
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "ws"}


def test_service_ports_probes_and_settings_agree_for_every_workload():
    for workload, container in containers():
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        argv = container.get("args") or []
        sub = subcommand_of(argv)
        settings = build_settings(sub, container_env(workload, container))
        if sub == "gateway":  # the API, and the internal metrics server (never in a Service)
            assert ports == {"http": settings.port, "metrics": settings.metrics_port}
        if sub == "agent":  # livekit-agents' health server, and its Prometheus server
            assert ports == {"health": settings.http_port, "metrics": settings.metrics_port}
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            assert int(annotations["prometheus.io/port"]) == settings.metrics_port
        if sub in NO_TRAFFIC:  # /health and /metrics on the pod network; liveness only (it takes no requests)
            assert ports == {"health": settings.health_port} and settings.health_host == "0.0.0.0"
            annotations = workload["spec"]["template"]["metadata"]["annotations"]
            assert int(annotations["prometheus.io/port"]) == settings.health_port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container and "httpGet" in container[probe]:
                assert container[probe]["httpGet"]["port"] in ports, f"{container['name']} {probe}"
        if sub in NO_TRAFFIC:
            assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "health"}
            assert "readinessProbe" not in container
        elif sub:
            assert {"readinessProbe", "livenessProbe"} <= set(container), container["name"]
    for service in k8s("Service"):
        targets = [w for w in workloads() if selects({"matchLabels": service["spec"]["selector"]}, pod_labels(w))]
        assert len(targets) == 1, service["metadata"]["name"]
        ports = {p["name"]: p["containerPort"] for c in targets[0]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports and port["port"] == ports[port["targetPort"]]


def test_gateway_hpa_pdbs_and_pod_security():
    hpa = one("HorizontalPodAutoscaler", "voicering-gateway")
    target = hpa["spec"]["scaleTargetRef"]
    assert one(target["kind"], target["name"])["kind"] == "Deployment"
    assert hpa["spec"]["minReplicas"] >= 2
    gateway = one("Deployment", "voicering-gateway")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    grace = parse_cli(container["args"][1:])[1]["grace"]
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    pod_grace = gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert pod_grace >= grace + sleep
    # a gentle scale-down: at most one pod per period, and a period longer than a pod's whole stop,
    # so streams are never cut on several gateways at once
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300 and down.get("selectPolicy", "Max") == "Min"
    assert all(p["type"] == "Pods" and p["value"] == 1 and p["periodSeconds"] >= pod_grace for p in down["policies"])
    covered = set()
    for pdb in k8s("PodDisruptionBudget"):
        matched = [w for w in workloads() if selects(pdb["spec"]["selector"], pod_labels(w))]
        assert len(matched) == 1, pdb["metadata"]["name"]
        covered.add(matched[0]["metadata"]["name"])
    assert {"voicering-worker", "voicering-gateway", "voicering-agent"} <= covered
    for workload in workloads():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_network_policy_lets_only_gateways_agents_and_workers_reach_workers():
    (policy,) = [p for p in k8s("NetworkPolicy") if selects(p["spec"]["podSelector"], pod_labels(
        one("StatefulSet", "voicering-worker")))]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    worker_port = build_settings("worker", container_env(*next(
        (w, c) for w, c in containers() if w["kind"] == "StatefulSet" and "worker" in c["name"]))).port
    same_namespace = {w["metadata"]["name"]: pod_labels(w) for w in workloads()}
    allowed = set()
    for rule in policy["spec"]["ingress"]:
        assert [p["port"] for p in rule["ports"]] == [worker_port]
        for peer in rule["from"]:
            if "namespaceSelector" in peer:  # another namespace: the monitoring rule only
                assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
                continue
            allowed |= {name for name, labels in same_namespace.items() if selects(peer["podSelector"], labels)}
    assert allowed == {"voicering-gateway", "voicering-agent", "voicering-worker"}
    # nothing in the namespace selects the workers without a policy: no other policy opens them
    assert all(not selects(p["spec"]["podSelector"], pod_labels(one("StatefulSet", "voicering-worker")))
               for p in k8s("NetworkPolicy") if p is not policy)
    # Redis: reachable from every process that uses it
    (redis_policy,) = [p for p in k8s("NetworkPolicy") if selects(p["spec"]["podSelector"], pod_labels(
        one("StatefulSet", "voicering-redis")))]
    reach = {name for rule in redis_policy["spec"]["ingress"] for peer in rule["from"]
             for name, labels in same_namespace.items() if selects(peer["podSelector"], labels)}
    assert reach == set(same_namespace) - {"voicering-redis"}


def test_network_policy_opens_the_gateway_s_metrics_port_to_monitoring_only():
    gateway = one("Deployment", "voicering-gateway")
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    settings = build_settings("gateway", container_env(gateway, container))
    (policy,) = [p for p in k8s("NetworkPolicy") if selects(p["spec"]["podSelector"], pod_labels(gateway))]
    by_port = {port["port"]: rule.get("from") for rule in policy["spec"]["ingress"] for port in rule["ports"]}
    assert set(by_port) == {settings.port, settings.metrics_port}
    assert by_port[settings.port] is None  # the API: anyone the ingress lets through
    (peer,) = by_port[settings.metrics_port]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


def test_shared_volumes_are_mounted_where_each_process_looks():
    paths = {}
    for workload, container in containers():
        sub = subcommand_of(container.get("args") or [])
        if not sub:
            continue
        settings = build_settings(sub, container_env(workload, container))
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
        mounts = {m["mountPath"]: volumes.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName")
                  for m in container.get("volumeMounts", [])}
        wanted = {"worker": {"voices": settings.voices_dir if sub == "worker" else None},
                  "gateway": {"voices": getattr(settings, "voices_dir", None), "uploads": getattr(settings, "uploads_dir", None)},
                  "train-worker": {"voices": getattr(settings, "adapter_store", None)}}.get(sub, {})
        for what, path in wanted.items():
            assert mounts.get(str(path)) == f"voicering-{what}", f"{sub}: {what} at {path} is not the shared claim"
            paths.setdefault(what, set()).add(str(path))
    assert all(len(p) == 1 for p in paths.values()), paths
    for claim in k8s("PersistentVolumeClaim"):
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_prometheus_jobs_find_the_pods_and_the_token():
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    worker = one("StatefulSet", "voicering-worker")
    gateway = one("Deployment", "voicering-gateway")

    def kept(job: dict, workload: dict) -> bool:
        (container, *_) = workload["spec"]["template"]["spec"]["containers"]
        meta = {f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9]', '_', k)}": v for k, v in pod_labels(workload).items()}
        meta |= {f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-zA-Z0-9]', '_', k)}": v
                 for k, v in workload["spec"]["template"]["metadata"].get("annotations", {}).items()}
        meta["__meta_kubernetes_pod_container_port_name"] = container["ports"][0]["name"]
        return all(re.fullmatch(r["regex"], ";".join(meta.get(s, "") for s in r["source_labels"]))
                   for r in job["relabel_configs"] if r.get("action") == "keep")

    assert kept(jobs["voicering-worker"], worker) and not kept(jobs["voicering-worker"], gateway)
    assert kept(jobs["voicering-gateway"], gateway) and not kept(jobs["voicering-gateway"], worker)
    token_key = Path(jobs["voicering-worker"]["authorization"]["credentials_file"]).name
    assert token_key in env_file(SECRETS_EXAMPLE)
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    annotations = gateway["spec"]["template"]["metadata"]["annotations"]
    settings = build_settings("gateway", container_env(gateway, container))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # Prometheus scrapes the internal metrics server, which listens on the pod network; the public
    # port serves no metrics, and no Service exposes the metrics port
    assert int(annotations["prometheus.io/port"]) == ports["metrics"] == settings.metrics_port
    assert settings.metrics_host == "0.0.0.0" and annotations["prometheus.io/path"] == "/metrics"
    service = one("Service", "voicering-gateway")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


# -- compose -------------------------------------------------------------------------------------

@pytest.mark.parametrize("secret", sorted(COMPOSE_REQUIRED))
def test_compose_refuses_to_run_without_each_of_its_secrets(secret):
    done = run_compose("cpu", {k: v for k, v in COMPOSE_REQUIRED.items() if k != secret})
    assert done.returncode != 0 and f"set {secret} in deploy/.env" in done.stderr


def test_compose_interpolations_are_the_documented_ones():
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE_FILE.read_text()))
    assert used == set(env_file(COMPOSE_ENV_EXAMPLE))
    assert not {name for name in used if name.startswith("VOICERING_")}
    # no secret is committed: the examples leave every one empty
    assert all(env_file(COMPOSE_ENV_EXAMPLE)[name] == "" for name in COMPOSE_SECRETS)
    assert all(value == "" for value in env_file(SECRETS_EXAMPLE).values())


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_profile_is_the_whole_stack(profile):
    services = compose(profile)["services"]
    by_command: dict[str, list[str]] = {}
    for name, service in voicering_services(profile).items():
        by_command.setdefault(" ".join(service_command(service)[:2]), []).append(name)
    assert set(services) >= {"redis", "livekit"}
    assert len(by_command["voicering worker"]) == 2 and len(by_command["voicering train-worker"]) == 1
    assert len(by_command["voicering gateway"]) == 1 and len(by_command["voicering agent"]) == 1
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes"
    assert "/etc/livekit.yaml" in services["livekit"]["command"]
    assert any(v.endswith("livekit/livekit-compose.yaml:/etc/livekit.yaml:ro") for v in services["livekit"]["volumes"])
    gpu_users = {name for name, s in services.items() if "devices" in s.get("deploy", {}).get("resources", {}).get(
        "reservations", {})}
    if profile == "gpu":
        assert gpu_users == set(by_command["voicering worker"]) | set(by_command["voicering train-worker"])
        for name in gpu_users:
            (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
            assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
        ids = [services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"][0] for n in gpu_users]
        assert len(set(ids)) == len(ids), "two services reserve the same GPU"
    else:
        assert not gpu_users
        (init,) = [s for s in voicering_services(profile).values() if service_command(s)[:1] == ["sh"]]
        (tiny,) = voicering_commands(service_command(init), {})
        sub, params = parse_cli(tiny)
        assert sub == "tiny-model"
        models_at = str(params["directory"])
        for name in by_command["voicering worker"] + by_command["voicering train-worker"]:
            s = services[name]
            assert s["depends_on"]["models"]["condition"] == "service_completed_successfully"
            env = service_env(s)
            model = env.get("VOICERING_WORKER_MODEL") or env.get("VOICERING_TRAIN_BASE_MODEL")
            assert model.startswith(models_at + "/")


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_services_run_real_commands_with_valid_settings(profile):
    ids, urls = set(), set()
    for name, service in voicering_services(profile).items():
        argv, env = service_command(service), service_env(service)
        commands = voicering_commands(argv, env)
        assert commands, f"{name} runs no voicering command"
        for cmd in commands:
            sub, _ = parse_cli(cmd)
            if sub not in settings_classes():
                continue
            settings = build_settings(sub, env)
            healthcheck = service.get("healthcheck", {})
            if not healthcheck.get("disable"):
                test = healthcheck.get("test") or ["CMD", *healthcheck_command(dockerfile_for_image(service["image"]))]
                assert test[-1] == HEALTH_ROLE[sub], f"{name}: the health check is for {test[-1]}, it runs {sub}"
            if sub == "worker":
                ids.add(settings.worker_id)
                urls.add(settings.advertise_url)
                assert settings.advertise_url == f"ws://{name}:{settings.port}" and settings.host == "0.0.0.0"
                assert settings.cluster_token == COMPOSE_SECRETS["CLUSTER_TOKEN"]
                assert service["stop_grace_period"].endswith("s")
                assert int(service["stop_grace_period"][:-1]) >= settings.drain_grace_s + 30
            if sub == "gateway":
                assert [p for p in service["ports"] if str(settings.port) in str(p)]
    assert len(ids) == 2 and len(urls) == 2


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_shares_the_adapter_store_and_uploads(profile):
    stores = {}
    for name, service in voicering_services(profile).items():
        mounts = {}
        for volume in service.get("volumes", []):
            source, target = (volume.split(":")[:2] if isinstance(volume, str) else (volume["source"], volume["target"]))
            mounts[target] = source
        env = service_env(service)
        for sub in [parse_cli(c)[0] for c in voicering_commands(service_command(service), env)]:
            if sub not in settings_classes():
                continue
            settings = build_settings(sub, env)
            for field in ("voices_dir", "adapter_store", "uploads_dir"):
                if hasattr(settings, field):
                    path = str(getattr(settings, field))
                    assert path in mounts, f"{name}: {field} {path} is not on a volume"
                    stores.setdefault(field.replace("adapter_store", "voices_dir"), set()).add(mounts[path])
    assert stores["voices_dir"] == {"voices"} and stores["uploads_dir"] == {"uploads"}


# -- Dockerfiles and the build context -----------------------------------------------------------

@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_dockerfile_runs_non_root_with_a_health_check_for_its_role(path):
    stage = final_stage(path)
    users = [line.split()[1] for line in stage if line.split()[0].upper() == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert json_instruction(path, "ENTRYPOINT") == ["tini", "--"]
    argv = json_instruction(path, "CMD")
    sub, _ = parse_cli(argv[1:])
    health = healthcheck_command(path)
    assert health[:2] == ["python", "/opt/voicering/healthcheck.py"] and health[2] == HEALTH_ROLE[sub]
    assert any(line.startswith("COPY deploy/docker/healthcheck.py /opt/voicering/healthcheck.py") for line in stage)
    build_settings(sub, {**dockerfile_env(path), "VOICERING_WORKER_MODEL": "m", "VOICERING_AGENT_VOICE": "tara"})
    exposed = [line.split()[1] for line in stage if line.split()[0].upper() == "EXPOSE"]
    if sub in ("worker", "gateway"):
        settings = build_settings(sub, {**dockerfile_env(path), "VOICERING_WORKER_MODEL": "m"})
        assert exposed == [str(settings.port)]


def test_dockerignore_lets_in_only_what_the_images_copy():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert patterns[0] == "**", "the context is an allow-list: everything out, then what the images need"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for path in dockerfiles():
        for line in dockerfile_lines(path):
            words = line.split()
            if words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
                copied.update(words[1:-1])
    assert copied == allowed
    for heavy in (".venv", ".cache", "tests", ".git", "out", "docs"):
        assert heavy not in allowed


def test_healthcheck_reads_the_address_from_the_process_settings():
    import importlib.util

    spec = importlib.util.spec_from_file_location("voicering_deploy_healthcheck", DOCKER / "healthcheck.py")
    healthcheck = importlib.util.module_from_spec(spec)
    with mock.patch.object(sys, "dont_write_bytecode", True):  # no __pycache__ inside deploy/
        spec.loader.exec_module(healthcheck)
    with mock.patch.dict(os.environ, {"VOICERING_WORKER_MODEL": "m", "VOICERING_WORKER_HOST": "0.0.0.0",
                                      "VOICERING_WORKER_PORT": "9123"}, clear=True):
        assert healthcheck.health_url("worker") == "http://127.0.0.1:9123/health"
    with mock.patch.dict(os.environ, {"VOICERING_GATEWAY_HOST": "10.1.2.3", "VOICERING_GATEWAY_PORT": "8001"}, clear=True):
        assert healthcheck.health_url("gateway") == "http://10.1.2.3:8001/health"
    with mock.patch.dict(os.environ, {"VOICERING_AGENT_VOICE": "tara"}, clear=True):
        assert healthcheck.health_url("agent") == f"http://127.0.0.1:{healthcheck.LIVEKIT_DEFAULT_HTTP_PORT}/"
    with mock.patch.dict(os.environ, {"VOICERING_TRAIN_HEALTH_HOST": "0.0.0.0", "VOICERING_TRAIN_HEALTH_PORT": "8002"},
                         clear=True):
        assert healthcheck.health_url("trainer") == "http://127.0.0.1:8002/health"
    with mock.patch.dict(os.environ, {}, clear=True):  # no port: the Redis PING fallback, not a URL
        assert healthcheck.trainer_health_port() is None
        with pytest.raises(ValueError):
            healthcheck.health_url("trainer")
    assert healthcheck.main(["nonsense"]) == 2


# -- names and commands anywhere in deploy/ and the operations page --------------------------------

def config_texts() -> Iterator[tuple[Path, str]]:
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.suffix not in (".pyc",) and "__pycache__" not in path.parts:
            yield path, path.read_text()
    yield OPERATIONS, OPERATIONS.read_text()


def test_every_voicering_env_name_is_a_real_setting():
    real = real_env_names()
    assert "VOICERING_WORKER_DRAIN_GRACE_S" in real and "VOICERING_TRAIN_PARAMS__RANK" in real
    unknown = {f"{path.relative_to(REPO)}: {name}" for path, text in config_texts()
               for name in VOICERING_NAME.findall(text) if name not in real}
    assert not unknown, sorted(unknown)


def shell_blocks(text: str) -> Iterator[str]:
    """The shell code blocks of a markdown text (```bash, ```sh, ```console or no language), fence
    by fence: a ```text or ```json block is skipped whole, never paired with the next fence."""
    language, lines = None, []
    for line in text.splitlines():
        if not line.startswith("```"):
            lines.append(line)
        elif language is None:
            language, lines = line[3:].strip(), []
        else:
            if language in ("", "bash", "sh", "console"):
                yield "\n".join(lines) + "\n"
            language = None


def code_block_commands(text: str) -> Iterator[list[str]]:
    for block in shell_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            words = shlex.split(line) if line and not line.startswith("#") else []
            # `voicering ...` alone, after VAR=value prefixes, or run in a container
            # (`kubectl exec POD -- voicering ...`, `docker-compose ... exec SERVICE voicering ...`)
            starts = [i for i, w in enumerate(words) if w == "voicering" and (
                all("=" in p for p in words[:i]) or words[i - 1] == "--" or (i >= 2 and words[i - 2] == "exec"))]
            if starts:
                yield words[starts[0] + 1:]


def test_every_voicering_command_in_units_and_docs_parses():
    count = 0
    for unit in DEPLOY.rglob("*.service"):
        text = unit.read_text()
        # the unit's EnvironmentFile is installed from the example beside it
        (env_path,) = re.findall(r"^EnvironmentFile=.*/([\w.]+)$", text, flags=re.M)
        env = env_file(unit.parent / f"{env_path}.example")
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                argv = shlex.split(line.removeprefix("ExecStart="))
                assert Path(argv[0]).name == "voicering"
                parse_cli([re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], a).replace("%H", "host") for a in argv[1:]])
                count += 1
    for argv in code_block_commands(OPERATIONS.read_text()):
        try:
            parse_cli([re.sub(r"<[^>]+>|\$\{?\w+\}?", "x", a) for a in argv])
        except Exception as exc:
            pytest.fail(f"docs/operations.md: `voicering {' '.join(argv)}` does not parse: {exc}")
        count += 1
    assert count >= 10


# -- GPU images: the sampler, the CUDA userland, the compile caches --------------------------------

GPU_DOCKERFILES = (DOCKER / "worker-gpu.Dockerfile", DOCKER / "trainer-gpu.Dockerfile")
# where vLLM, FlashInfer (its base: caches go to $BASE/.cache/flashinfer), Inductor and Triton
# write what they compile
COMPILE_CACHE_ENV = ("VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
TORCH_CUDA_MAJOR = {"2.13": 13}  # the CUDA of torch's default wheels (cu130)


def under(path: str, folder: str) -> bool:
    return Path(path).is_relative_to(folder)


@pytest.mark.parametrize("path", GPU_DOCKERFILES, ids=lambda p: p.name)
def test_gpu_image_needs_no_nvcc_and_matches_torch_s_cuda(path):
    from gpu_worker.settings import WorkerSettings

    env = dockerfile_env(path)
    # no FlashInfer sampler, so nothing JIT-compiles with an nvcc the image lacks; free because the
    # default constraint hands vLLM greedy requests (its top-p/top-k sampler never runs)
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert WorkerSettings(model="m").constraint == "fused"
    assert not any("nvcc" in line for line in dockerfile_lines(path))
    (arg,) = [line for line in dockerfile_lines(path) if line.startswith("ARG CUDA_IMAGE=")]
    cuda = re.fullmatch(r"ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.\d+\.\d+-base-ubuntu24\.04", arg)
    torch_pin = re.search(r'"torch==(\d+\.\d+)\.\d+"', (REPO / "pyproject.toml").read_text())[1]
    assert cuda and int(cuda[1]) == TORCH_CUDA_MAJOR[torch_pin], arg
    assert "R580" in (DEPLOY / "README.md").read_text(), "deploy/README.md names the driver floor of CUDA 13"
    # every compile cache under one folder the image makes for its user
    caches = {name: env[name] for name in COMPILE_CACHE_ENV}
    root = "/home/voicering/.cache/compile"
    assert all(under(value, root) for value in caches.values()), caches
    assert any(root in line and "mkdir" in line for line in final_stage(path))


def test_k8s_gpu_pods_keep_their_compile_caches_on_a_volume():
    for workload, container in containers():
        env = container_env(workload, container)
        if "VLLM_CACHE_ROOT" not in env:
            continue
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for name in COMPILE_CACHE_ENV:
            (mount,) = [m for m in container["volumeMounts"] if under(env[name], m["mountPath"])]
            assert mount["name"] in volumes or mount["name"] in templates, f"{container['name']}: {name}"
            if workload["kind"] == "StatefulSet":  # the worker: a claim that outlives the pod
                assert mount["name"] in templates, f"{name} is not on the worker's own claim"
                assert "medium" not in volumes.get(mount["name"], {}).get("emptyDir", {})


def test_compose_gpu_services_keep_their_compile_caches_on_their_own_volumes():
    services = compose("gpu")
    owners: dict[str, str] = {}
    for name, service in voicering_services("gpu").items():
        env = service_env(service)
        if "VLLM_CACHE_ROOT" not in env:
            continue
        mounts = {}
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2] if isinstance(volume, str) else (volume["source"], volume["target"])
            mounts[target] = source
        for cache in COMPILE_CACHE_ENV:
            (target,) = [t for t in mounts if under(env[cache], t)]
            assert mounts[target] in services["volumes"], f"{name}: {cache} is not on a named volume"
            assert owners.setdefault(mounts[target], name) == name, f"{name} shares {mounts[target]}: compiles race"
    assert len(set(owners.values())) == 3  # two workers and the trainer


# -- LiveKit in compose --------------------------------------------------------------------------

LIVEKIT_COMPOSE = DEPLOY / "livekit" / "livekit-compose.yaml"
# livekit-server's defaults (pkg/config/config.go DefaultConfig) and what its RTC validation
# (mediatransportutil rtcconfig.RTCConfig.Validate) picks when no UDP port is configured
LIVEKIT_DEFAULT_PORT, LIVEKIT_DEFAULT_TCP_PORT = 7880, 7881
LIVEKIT_DEFAULT_ICE_RANGE = (50000, 60000)


def livekit_listens(config: dict, *, development: bool = False) -> set[tuple[int, str]]:
    """The (port, protocol) pairs a livekit-server with this config listens on, as it decides them:
    a port range, when both ends are set, wins over udp_port (webrtc_config.go); with neither, a
    non-development server takes 50000-60000; udp_port may itself be a range "a-b"."""
    rtc = config.get("rtc", {})
    ports = {(config.get("port", LIVEKIT_DEFAULT_PORT), "tcp")}
    if not rtc.get("force_tcp"):
        start, end = rtc.get("port_range_start", 0), rtc.get("port_range_end", 0)
        udp = str(rtc.get("udp_port", "") or "")
        if not (start and end) and not udp and not development:
            start, end = LIVEKIT_DEFAULT_ICE_RANGE
        if start and end:
            ports |= {(p, "udp") for p in range(start, end + 1)}
        elif udp:
            first, _, last = udp.partition("-")
            ports |= {(p, "udp") for p in range(int(first), int(last or first) + 1)}
    if rtc.get("tcp_port", LIVEKIT_DEFAULT_TCP_PORT):
        ports.add((rtc.get("tcp_port", LIVEKIT_DEFAULT_TCP_PORT), "tcp"))
    turn = config.get("turn", {})
    if turn.get("enabled"):
        ports |= {(turn[k], proto) for k, proto in (("udp_port", "udp"), ("tls_port", "tcp")) if turn.get(k)}
    return ports


def test_livekit_listens_mirrors_livekit_s_port_choice():
    assert livekit_listens({"rtc": {"udp_port": 7882, "port_range_start": 50000, "port_range_end": 50001}}) == {
        (7880, "tcp"), (7881, "tcp"), (50000, "udp"), (50001, "udp")}
    assert (55000, "udp") in livekit_listens({})  # nothing configured: the production range
    assert livekit_listens({}, development=True) == {(7880, "tcp"), (7881, "tcp")}
    assert livekit_listens({"rtc": {"udp_port": "7882-7883", "tcp_port": 0}}) == {(7880, "tcp"), (7882, "udp"),
                                                                                (7883, "udp")}
    # the self-hosted config (its own host, a firewall range): compose must not use it
    assert len(livekit_listens(yaml.safe_load((DEPLOY / "livekit" / "livekit.yaml").read_text()))) > 1000


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_publishes_every_port_its_livekit_listens_on(profile):
    service = compose(profile)["services"]["livekit"]
    argv = service["command"]
    assert "--udp-port" not in argv and "--dev" not in argv and "--config-body" not in argv
    mounted = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    config = yaml.safe_load(Path(mounted[argv[argv.index("--config") + 1]]).read_text())
    assert Path(mounted["/etc/livekit.yaml"]) == LIVEKIT_COMPOSE
    rtc = config["rtc"]
    assert "port_range_start" not in rtc and "port_range_end" not in rtc
    assert rtc["use_external_ip"] is False and not rtc.get("node_ip")  # STUN would replace NODE_IP
    published = {(int(p["published"]), p.get("protocol", "tcp")) for p in service["ports"]}
    assert all(int(p["published"]) == int(p["target"]) for p in service["ports"]), "ICE advertises the container port"
    assert published == livekit_listens(config)
    # the advertised address is the operator's, passed through (livekit-server reads NODE_IP as --node-ip)
    assert service["environment"]["NODE_IP"] == COMPOSE_REQUIRED["LIVEKIT_NODE_IP"]
    assert env_file(COMPOSE_ENV_EXAMPLE)["LIVEKIT_NODE_IP"] == "", "no loopback default: the agent's media would loop"
    # the agent reaches LiveKit by its service name on the signalling port
    agent = next(s for s in voicering_services(profile).values() if service_command(s)[:2] == ["voicering", "agent"])
    url = service_env(agent)["LIVEKIT_URL"]
    assert url == f"ws://livekit:{config.get('port', LIVEKIT_DEFAULT_PORT)}"


# -- fail closed on the cluster token ------------------------------------------------------------

def bound_host(sub: str, settings) -> tuple[str, str | None]:
    """The address a process listens on and its cluster token, as gpu_worker.open_cluster judges them."""
    host = settings.http_host if sub == "agent" else settings.host
    token = settings.cluster_token
    return host, token.get_secret_value() if hasattr(token, "get_secret_value") else token


def test_every_deployed_listener_starts_with_the_secret_and_refuses_without_it():
    from gpu_worker.open_cluster import OpenCluster, require_cluster_token

    def check(sub: str, env: dict[str, str]) -> None:
        settings = build_settings(sub, env)
        host, token = bound_host(sub, settings)
        assert not settings.allow_open_cluster, f"{sub}: deploy configs never open the cluster"
        require_cluster_token(host, token, allow_open=False, env_prefix="", role=sub)  # the filled secret: starts
        emptied = {k: ("" if k.endswith("_CLUSTER_TOKEN") else v) for k, v in env.items()}
        empty_host, empty_token = bound_host(sub, build_settings(sub, emptied))
        with pytest.raises(OpenCluster):  # the example left empty: refused, not silently open
            require_cluster_token(empty_host, empty_token, allow_open=False, env_prefix="", role=sub)

    seen = set()
    for workload, container in containers():
        sub = subcommand_of(container.get("args") or [])
        if sub in ("worker", "gateway", "agent"):
            check(sub, container_env(workload, container))
            seen.add(sub)
    for profile in PROFILES:
        for service in voicering_services(profile).values():
            env = service_env(service)
            for sub in [parse_cli(c)[0] for c in voicering_commands(service_command(service), env)]:
                if sub in ("worker", "gateway", "agent"):
                    check(sub, env)
                    seen.add(f"compose {sub}")
    assert seen == {"worker", "gateway", "agent", "compose worker", "compose gateway", "compose agent"}


# -- systemd units: who gets the SIGTERM -----------------------------------------------------------

def unit_settings(path: Path) -> dict[str, str]:
    """The [Service] section's Key=value lines (the last of a repeated key wins, as in systemd)."""
    found, section = {}, ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found[key] = value
    return found


@pytest.mark.parametrize("unit", sorted(DEPLOY.rglob("*.service")), ids=lambda p: p.name)
def test_units_signal_only_the_main_process_and_wait_for_its_drain(unit):
    service = unit_settings(unit)
    # mixed: SIGTERM to the main process only (it stops its own engine or job processes), SIGKILL to
    # the whole cgroup after TimeoutStopSec; the default (control-group) would SIGTERM vLLM's engine
    # core at once and abort every stream the drain means to finish
    assert service["KillMode"] == "mixed" and service["KillSignal"] == "SIGTERM"
    assert int(service["LimitNOFILE"]) >= 65536
    if "voicering worker" in service["ExecStart"].replace("/opt/voicering/.venv/bin/", ""):
        (env_path,) = re.findall(r"^EnvironmentFile=.*/([\w.]+)$", unit.read_text(), flags=re.M)
        env = env_file(unit.parent / f"{env_path}.example")
        settings = build_settings("worker", {**env, "VOICERING_WORKER_CLUSTER_TOKEN": "x" * 40})
        assert int(service["TimeoutStopSec"]) >= settings.drain_grace_s + 30


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_gives_every_long_running_process_a_high_open_file_limit(profile):
    """Each process raises its soft limit to the hard one at start (gpu_worker/open_files.py); compose
    sets that hard limit (Docker's default soft and hard limits are far lower)."""
    seen = set()
    for name, service in voicering_services(profile).items():
        subs = {parse_cli(c)[0] for c in voicering_commands(service_command(service), service_env(service))}
        if not subs & {"worker", "gateway", "agent", "train-worker"}:
            continue
        nofile = service.get("ulimits", {}).get("nofile")
        assert nofile is not None, f"{name} has no nofile ulimit"
        hard = nofile["hard"] if isinstance(nofile, dict) else nofile
        assert int(hard) >= 65536, f"{name}: nofile {nofile}"
        seen |= subs
    assert seen == {"worker", "gateway", "agent", "train-worker"}


# -- storage outlives the application ------------------------------------------------------------

def kustomize(folder: Path, tmp_path: Path) -> list[dict]:
    """What `kubectl apply -k` / `kubectl delete -k FOLDER` acts on: kubectl's own kustomize, run on
    a copy of deploy/k8s with secrets.env made from the example (it is git-ignored)."""
    tool = shutil.which("kubectl")
    if tool is None:
        pytest.fail("kubectl is not installed: `make setup` installs it")
    copy = tmp_path / folder.name / "k8s"
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("secrets.env"))
    (copy / "secrets.env").write_text("".join(f"{k}={'x' * 40}\n" for k in env_file(SECRETS_EXAMPLE)))
    done = subprocess.run([tool, "kustomize", str(copy / folder.relative_to(K8S))], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_deleting_the_application_keeps_voices_uploads_and_redis_data(tmp_path):
    app, storage = kustomize(K8S, tmp_path), kustomize(K8S_STORAGE, tmp_path)
    app_kinds = {doc["kind"] for doc in app}
    # `kubectl delete -k deploy/k8s` deletes exactly `app`: no namespace (which takes every claim in
    # it along), no claim
    assert not app_kinds & {"Namespace", "PersistentVolumeClaim", "PersistentVolume", "StorageClass"}, app_kinds
    assert {"StatefulSet", "Deployment", "Secret"} <= app_kinds
    (namespace,) = [d for d in storage if d["kind"] == "Namespace"]
    assert {d["metadata"].get("namespace") for d in app} == {namespace["metadata"]["name"]}
    claims = {d["metadata"]["name"] for d in storage if d["kind"] == "PersistentVolumeClaim"}
    used = {v["persistentVolumeClaim"]["claimName"] for d in app if d["kind"] in ("Deployment", "StatefulSet")
            for v in d["spec"]["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
    assert used == claims == {"voicering-voices", "voicering-uploads"}
    # a StatefulSet's own claims (Redis's data, the workers' caches) are kept when it is deleted
    for sts in (d for d in app if d["kind"] == "StatefulSet" and d["spec"].get("volumeClaimTemplates")):
        assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain", sts["metadata"]["name"]
    operations = OPERATIONS.read_text()
    assert "kubectl apply -k deploy/k8s/storage" in operations and "persistentVolumeReclaimPolicy" in operations


def test_gpu_pods_land_on_sm80_nodes_and_fit_a_single_gpu_node():
    for workload in workloads():
        pod = workload["spec"]["template"]["spec"]
        if not any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in pod["containers"]):
            continue
        (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = [e for e in term["matchExpressions"] if e["key"] == "nvidia.com/gpu.compute.major"]
        # Kubernetes' Gt compares integers: major > 7, i.e. sm80 and newer
        assert expr["operator"] == "Gt" and expr["values"] == ["7"], workload["metadata"]["name"]
    worker = one("StatefulSet", "voicering-worker")
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    requests = container["resources"]["requests"]
    # a 4 vCPU / 16 GiB single-GPU node has roughly 3.5 CPU and 13-14 GiB allocatable
    assert float(requests["cpu"]) <= 3 and int(requests["memory"].removesuffix("Gi")) <= 12
    assert int(container["resources"]["limits"]["memory"].removesuffix("Gi")) <= 14


# -- Redis ACL users -------------------------------------------------------------------------------

def test_k8s_processes_sign_in_as_the_users_redis_acl_defines():
    """Redis starts with the file `voicering redis-acl` writes from the Secret's REDIS_PASSWORD_*, and each
    workload's URL carries its own user with that user's password key (the default user is off)."""
    from voicering.redis_acl import USERS, password_env

    redis = one("StatefulSet", "voicering-redis")["spec"]["template"]["spec"]
    (init,) = redis["initContainers"]
    assert init["command"][:2] == ["voicering", "redis-acl"] and init["image"].startswith("voicering-gateway")
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in init["env"]}
    assert refs == {password_env(u): f"REDIS_PASSWORD_{u.upper()}" for u in USERS}
    (server,) = redis["containers"]
    assert server["args"][server["args"].index("--aclfile") + 1] == init["command"][init["command"].index("--out") + 1]
    for workload, container in containers():
        sub = subcommand_of(container.get("args") or [])
        if sub not in REDIS_USER:
            continue
        keys = {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"] if "valueFrom" in e
                and "secretKeyRef" in e["valueFrom"]}
        assert keys["REDIS_PASSWORD"] == f"REDIS_PASSWORD_{REDIS_USER[sub].upper()}", workload["metadata"]["name"]


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_processes_sign_in_as_the_users_redis_acl_defines(profile):
    from voicering.redis_acl import USERS, acl_file, password_env

    services = compose(profile)["services"]
    acl_env = {k: str(v) for k, v in services["redis-acl"]["environment"].items()}
    passwords = {u: acl_env[password_env(u)] for u in USERS}
    acl_file(passwords)  # every password is there and long enough
    assert "--aclfile" in services["redis"]["command"] and "livekit-redis:6379" in services["livekit"]["command"]
    signed_in = set()
    for service in voicering_services(profile).values():
        env = service_env(service)
        for sub in [parse_cli(c)[0] for c in voicering_commands(service_command(service), env)]:
            if sub in REDIS_USER:
                url = urlsplit(str(build_settings(sub, env).redis_url))
                assert (url.username, url.password) == (REDIS_USER[sub], passwords[REDIS_USER[sub]])
                signed_in.add(sub)
    assert signed_in == set(REDIS_USER)
