"""deploy/k8s/: every overlay renders with `kubectl kustomize`, passes kubernetes-validate's
strict schemas offline, and keeps the promises docs/deploy.md makes: state on a volume at
KEYLANE_DATA_DIR, probes on the health endpoints of the metrics port, a termination grace
longer than what a stop has to finish, one pod at a time through a disruption, secrets only
by reference, keylane commands that parse, static group membership by pod name with a session
timeout that outlasts a restart, and the replica counts of each overlay."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keylane.authoring.tools import default_registry
from keylane.catalog import INTENTS, load_catalog
from keylane.cli import build_parser
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.offset_guard import REBALANCE_GRACE_S
from keylane.loader import import_module, load_agent
from keylane.stages.effector.handler import revocation_grace_s
from keylane.stages.effector.service import REBALANCE_MARGIN_S
from tests.deploy.metric_contract import JOBS
from tests.deploy.tools import REPO, explain, run

K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
SCRAPE_CONFIG = K8S / "prometheus-scrape.yml"

# The newest Kubernetes whose schemas the pinned kubernetes-validate bundles (1.25 to 1.37);
# bump both together (pyproject.toml's test extra).
K8S_VERSION = "1.37.0"
KUBERNETES_VALIDATE_PIN = "kubernetes-validate==1.37.0"

SECRET_NAME = re.compile(r"(_KEY|_KEYS|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
SETTING_NAME = re.compile(r"KEYLANE_[A-Z0-9_]+")
MEMBERSHIP = {"KEYLANE_GROUP_INSTANCE_ID", "KEYLANE_SESSION_TIMEOUT_S"}
"""The settings of a pod's own consumer group member, set in its StatefulSet, not the ConfigMap."""
POD_RESTART_S = 30.0
"""Less than a pod's restart (stop, reschedule, attach the volume, start, check the topics) takes
at times: a static member's session timeout must outlast it (docs/deploy.md#group-membership)."""
WORKLOADS = {"StatefulSet", "Deployment", "DaemonSet", "Job", "CronJob"}


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH: tests/deploy/test_k8s.py renders deploy/k8s/overlays/* with "
            "`kubectl kustomize` (kubectl 1.27 or newer, kustomize v5); install it and retry",
            pytrace=False,
        )
    return path


def _validator() -> Any:
    try:
        import kubernetes_validate  # here: a missing test dependency fails with its fix
    except ImportError:
        pytest.fail(
            f"kubernetes-validate is not installed: .venv/bin/pip install '{KUBERNETES_VALIDATE_PIN}' "
            "(or the test extra: .venv/bin/pip install -e '.[test]') and retry",
            pytrace=False,
        )
    return kubernetes_validate


def _render(overlay: str) -> list[dict[str, Any]]:
    result = run([_kubectl(), "kustomize", str(K8S / "overlays" / overlay)])
    assert result.returncode == 0, explain(result)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, _render(request.param)


@pytest.fixture(scope="module")
def prod() -> list[dict[str, Any]]:
    return _render("prod")


@pytest.fixture(scope="module")
def dev() -> list[dict[str, Any]]:
    return _render("dev")


# --- reading the rendered objects -------------------------------------------------------


def _of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


def _is_keylane(container: dict[str, Any]) -> bool:
    """A container of the keylane image, whatever registry and tag an overlay gives it."""
    image = container["image"].rsplit("/", 1)[-1]
    return image.split("@")[0].split(":")[0] == "keylane"


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def _keylane_statefulsets(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = [s for s in _of_kind(docs, "StatefulSet") if any(map(_is_keylane, _pod_spec(s)["containers"]))]
    assert {s["metadata"]["name"] for s in found} == {"keylane-worker", "keylane-effector"}
    return found


def _main(statefulset: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in _pod_spec(statefulset)["containers"] if _is_keylane(c)]
    return container


def _argv(container: dict[str, Any]) -> list[str]:
    """The keylane arguments of a container: its args after the image's ENTRYPOINT, keylane."""
    command = container.get("command")
    assert command in (None, ["keylane"]), f"{container['name']}: command {command} is not keylane's"
    args: list[str] = container.get("args", [])
    return args


def _environment(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """The literal environment of a container: its ConfigMaps (envFrom), then its own values."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "secretRef" not in source, f"{container['name']}: settings come from a ConfigMap"
        env.update(_named(docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
    return env


def _settings(docs: list[dict[str, Any]], container: dict[str, Any]) -> Settings:
    return Settings.from_env(_environment(docs, container))


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return int(number)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "matchExpressions are not used here"
    return bool(selector["matchLabels"]) and selector["matchLabels"].items() <= labels.items()


def _prestop_s(container: dict[str, Any]) -> float:
    pre_stop = container.get("lifecycle", {}).get("preStop")
    if pre_stop is None:
        return 0.0
    if "sleep" in pre_stop:
        return float(pre_stop["sleep"]["seconds"])
    command = pre_stop["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, f"{container['name']}: preStop {command}"
    return float(command[1])


# --- the tests ---------------------------------------------------------------------------


def test_kubernetes_version_is_the_newest_the_pinned_validator_knows() -> None:
    validator = _validator()
    pyproject = (REPO / "pyproject.toml").read_text()

    assert f'"{KUBERNETES_VALIDATE_PIN}"' in pyproject, f"pin {KUBERNETES_VALIDATE_PIN} in the test extra"
    assert K8S_VERSION in validator.utils.all_versions()
    assert validator.utils.latest_version() == K8S_VERSION, (
        f"kubernetes-validate knows Kubernetes {validator.utils.latest_version()}: "
        "move K8S_VERSION and the pin together"
    )


def test_overlay_renders_and_passes_strict_schemas(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    validator = _validator()
    name, docs = overlay

    errors = []
    for doc in docs:
        try:
            validator.validate(doc, K8S_VERSION, strict=True)
        except validator.ValidationError as exc:
            errors.append(f"{doc['kind']} {doc['metadata']['name']}: {exc.message}")
        except validator.SchemaNotFoundError:
            errors.append(f"{doc['kind']} {doc['metadata']['name']}: no schema (a custom resource?)")
    assert not errors, f"overlays/{name} against Kubernetes {K8S_VERSION} (strict):\n" + "\n".join(errors)
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    assert len(namespaces) == 1 and None not in namespaces, f"one namespace for everything: {namespaces}"
    assert {d["metadata"]["name"] for d in _of_kind(docs, "Namespace")} == namespaces


def test_state_lives_on_a_volume_mounted_at_the_data_dir(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay

    for statefulset in _keylane_statefulsets(docs):
        name = statefulset["metadata"]["name"]
        container = _main(statefulset)
        data_dir = str(_settings(docs, container).data_dir)
        templates = statefulset["spec"].get("volumeClaimTemplates", [])
        claims = {t["metadata"]["name"]: t["spec"] for t in templates}
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}

        assert data_dir in mounts, f"{name}: nothing is mounted at KEYLANE_DATA_DIR={data_dir}"
        assert mounts[data_dir] in claims, f"{name}: {data_dir} is not a volumeClaimTemplate"
        assert claims[mounts[data_dir]]["accessModes"] == ["ReadWriteOnce"]
        assert not data_dir.startswith("/tmp"), f"{name}: the data dir must not be the emptyDir"
        policy = statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]
        assert policy == {"whenDeleted": "Retain", "whenScaled": "Retain"}, "docs/deploy.md#scale-down"


def test_probes_use_the_health_endpoints_on_the_metrics_port(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = overlay

    for statefulset in _keylane_statefulsets(docs):
        name = statefulset["metadata"]["name"]
        container = _main(statefulset)
        metrics_port = _settings(docs, container).metrics_port
        assert metrics_port, f"{name}: KEYLANE_METRICS_PORT=0 disables the health endpoints"
        expected = {"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"}
        for probe, path in expected.items():
            http = container[probe]["httpGet"]
            assert http["path"] == path, f"{name}: {probe} on {http['path']}"
            assert _port(container, http["port"]) == metrics_port, f"{name}: {probe} not on the metrics port"

        annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(metrics_port)
        assert annotations["prometheus.io/path"] == "/metrics"

        service = _named(docs, "Service", statefulset["spec"]["serviceName"])
        assert service["spec"]["clusterIP"] == "None", f"{name}: its serviceName must be a headless Service"
        pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert _selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
        (port,) = service["spec"]["ports"]
        assert _port(container, port["targetPort"]) == metrics_port


def test_termination_grace_outlasts_what_a_stop_finishes(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay

    worker = _named(docs, "StatefulSet", "keylane-worker")
    container = _main(worker)
    args = build_parser().parse_args(_argv(container))
    _, config = load_agent(args.agent, args.config)
    # SIGTERM: the activations in flight finish (each within activation_timeout_s) and the
    # group rebalances; preStop runs before it, all within the grace.
    worker_needs = (
        _prestop_s(container) + config.activation_timeout_s + max(REBALANCE_GRACE_S, config.rebalance_grace_s)
    )
    assert _pod_spec(worker)["terminationGracePeriodSeconds"] > worker_needs

    effector = _named(docs, "StatefulSet", "keylane-effector")
    container = _main(effector)
    args = build_parser().parse_args(_argv(container))
    for module in args.tools:
        import_module(module, "--tools")
    specs = [s for s in default_registry.specs() if s.fn.__module__ in args.tools]
    assert specs, f"no tools registered by {args.tools}"
    # A running tool is never cut short: its longest attempt plus the margins of the group.
    effector_needs = _prestop_s(container) + revocation_grace_s(specs, args.tool_timeout) + REBALANCE_MARGIN_S
    assert _pod_spec(effector)["terminationGracePeriodSeconds"] > effector_needs


def test_a_disruption_takes_one_pod_at_a_time(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay
    budgets = _of_kind(docs, "PodDisruptionBudget")

    for statefulset in _keylane_statefulsets(docs):
        labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert _selects(statefulset["spec"]["selector"], labels)
        mine = [b for b in budgets if _selects(b["spec"]["selector"], labels)]
        assert len(mine) == 1, f"{statefulset['metadata']['name']}: {len(mine)} PodDisruptionBudgets"
        assert mine[0]["spec"] == {"maxUnavailable": 1, "selector": mine[0]["spec"]["selector"]}


def test_secrets_are_references_never_values(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    name, docs = overlay

    assert not _of_kind(docs, "Secret"), "no Secret is committed: docs/deploy.md#the-secrets creates them"
    for config_map in _of_kind(docs, "ConfigMap"):
        for key in config_map.get("data", {}):
            assert not SECRET_NAME.search(key), f"ConfigMap {config_map['metadata']['name']} holds {key}"
    referenced = set()
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        for container in _containers(_pod_spec(workload)):
            for variable in container.get("env", []):
                if SECRET_NAME.search(variable["name"]):
                    assert "value" not in variable, f"{container['name']}: {variable['name']} is inline"
                    assert "secretKeyRef" in variable.get("valueFrom", {}), variable
                    referenced.add(variable["name"])
    worker = _main(_named(docs, "StatefulSet", "keylane-worker"))
    provider_key = next(v for v in worker["env"] if v["name"] == "PROVIDER_API_KEY")
    assert {"PROVIDER_API_KEY", "KEYLANE_SIGNING_KEYS"} <= referenced
    # prod refuses to start without the key; dev runs the FakeLLM example without one.
    assert provider_key["valueFrom"]["secretKeyRef"]["optional"] is (name != "prod")


def test_every_keylane_container_runs_a_command_that_parses(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = overlay
    parser = build_parser()

    seen = []
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        for container in filter(_is_keylane, _containers(_pod_spec(workload))):
            args = parser.parse_args(_argv(container))  # exits 2 (fails the test) on a wrong line
            _settings(docs, container)  # and its settings are valid
            seen.append((workload["metadata"]["name"], container["name"], args.command))
    commands = {(w, c): command for w, c, command in seen}
    assert commands[("keylane-topics", "topics")] == "topics"
    assert commands[("keylane-worker", "worker")] == "worker"
    assert commands[("keylane-effector", "effector")] == "effector"


def test_topics_exist_before_a_worker_starts(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay
    parser = build_parser()

    job = _named(docs, "Job", "keylane-topics")
    (applier,) = _pod_spec(job)["containers"]
    assert _argv(applier) == ["topics", "apply"]
    for statefulset in _keylane_statefulsets(docs):
        (check,) = _pod_spec(statefulset)["initContainers"]
        args = parser.parse_args(_argv(check))
        assert (args.command, args.topics_command) == ("topics", "check"), "check, never create"
        # The same settings as the Job and the container: the same prefix, brokers, replication.
        # Only the container joins a consumer group, with its membership settings on top.
        main = _environment(docs, _main(statefulset))
        assert (
            _environment(docs, check)
            == {k: v for k, v in main.items() if k.startswith("KEYLANE_") and k not in MEMBERSHIP}
            == _environment(docs, applier)
        )


def test_configmap_holds_only_settings_keylane_reads(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay
    # Settings, and the catalog (KEYLANE_TOPIC_CATALOG).
    readers = [REPO / "service" / "keylane" / f for f in ("config.py", "catalog.py")]
    known = {name for path in readers for name in SETTING_NAME.findall(path.read_text())}

    config_maps = [
        c for c in _of_kind(docs, "ConfigMap") if c["metadata"]["name"].startswith("keylane-config")
    ]
    assert len(config_maps) == 1
    data = config_maps[0]["data"]
    # Faust reads variables of its own (CONSUMER_GROUP_INSTANCE_ID, TABLE_STANDBY_REPLICAS, ...):
    # none is set behind keylane's back.
    assert set(data) <= known, f"keylane reads no {set(data) - known}"
    # Nor the membership: one group instance id shared by every pod would fence them out of
    # the group; it is each pod's name (test_each_pod_is_a_static_member_named_after_itself).
    assert not MEMBERSHIP & set(data), f"{MEMBERSHIP & set(data)} belong in the StatefulSets"
    Settings.from_env(data)


def test_each_pod_is_a_static_member_named_after_itself(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay

    for statefulset in _keylane_statefulsets(docs):
        name = statefulset["metadata"]["name"]
        container = _main(statefulset)
        env = {v["name"]: v for v in container.get("env", [])}
        for pod_container in _containers(_pod_spec(statefulset)):
            assert not any(v["name"] == "CONSUMER_GROUP_INSTANCE_ID" for v in pod_container.get("env", []))
        # KEYLANE_GROUP_INSTANCE_ID from the pod name: stable across restarts, unique in the group.
        assert env["KEYLANE_GROUP_INSTANCE_ID"] == {
            "name": "KEYLANE_GROUP_INSTANCE_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        }, f"{name}: the group instance id is the pod's name"
        pod_env = {**_environment(docs, container), "KEYLANE_GROUP_INSTANCE_ID": f"{name}-0"}
        settings = Settings.from_env(pod_env)
        assert settings.group_instance_id == f"{name}-0"
        # A session timeout that outlasts a restart, or the restart costs the rebalances anyway;
        # Faust refuses one above its request timeout.
        assert "value" in env["KEYLANE_SESSION_TIMEOUT_S"], f"{name}: set the session timeout beside the id"
        assert settings.session_timeout_s > POD_RESTART_S, f"{name}: {settings.session_timeout_s} s"
        app = build_app(settings, load_catalog(prefix=settings.topic_prefix))
        assert app.conf.consumer_group_instance_id == f"{name}-0"
        assert settings.session_timeout_s < app.conf.broker_request_timeout


def test_pods_run_as_the_image_user_not_root(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay

    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        pod = _pod_spec(workload)
        if not any(map(_is_keylane, _containers(pod))):
            continue
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        for container in _containers(pod):
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert "cpu" not in container["resources"].get("limits", {}), "throttling delays heartbeats"
            assert container["resources"]["requests"]
    assert "USER keylane" in (REPO / "deploy" / "Dockerfile").read_text()


def test_dashboards_configmap_carries_every_dashboard(overlay: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = overlay

    labelled = [
        c for c in _of_kind(docs, "ConfigMap") if "grafana_dashboard" in c["metadata"].get("labels", {})
    ]
    (config_map,) = labelled
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    expected = {path.name: path.read_text() for path in sorted(DASHBOARDS.glob("*.json"))}
    assert config_map["data"] == expected, "list every dashboard in deploy/grafana/kustomization.yaml"
    assert config_map["metadata"]["name"] == "keylane-dashboards", "a fixed name: no stale copies"


def test_prod_replicates_and_scales_out(prod: list[dict[str, Any]]) -> None:
    worker = _named(prod, "StatefulSet", "keylane-worker")
    effector = _named(prod, "StatefulSet", "keylane-effector")
    settings = _settings(prod, _main(worker))
    catalog = load_catalog(prefix=settings.topic_prefix, replication_factor=settings.replication_factor)
    co_partitions = {spec.partitions for spec in catalog if spec.co_partitioned}

    assert settings.replication_factor == 3
    assert all(spec.replication_factor == 3 and spec.min_insync_replicas == 2 for spec in catalog)
    # Parallelism is the partition count: replicas beyond it sit idle.
    assert 3 <= worker["spec"]["replicas"] <= min(co_partitions)
    assert 2 <= effector["spec"]["replicas"] <= catalog[INTENTS].partitions


def test_dev_is_one_of_each_on_its_own_broker(dev: list[dict[str, Any]]) -> None:
    worker = _named(dev, "StatefulSet", "keylane-worker")
    settings = _settings(dev, _main(worker))
    kafka = _named(dev, "StatefulSet", "kafka")
    (broker,) = _pod_spec(kafka)["containers"]

    assert settings.replication_factor == 1
    effector = _named(dev, "StatefulSet", "keylane-effector")
    assert worker["spec"]["replicas"] == effector["spec"]["replicas"] == 1
    assert broker["image"].startswith("apache/kafka:3.9.")
    host, port = settings.bootstrap_servers.split(":")
    service = _named(dev, "Service", host)
    assert service["spec"]["selector"].items() <= kafka["spec"]["template"]["metadata"]["labels"].items()
    assert _port(broker, service["spec"]["ports"][0]["targetPort"]) == int(port)


# --- the scrape config: Prometheus' relabelling, enough of it to run these rules ---------


def _relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    labels = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(labels.get(s, "") for s in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                labels[rule["target_label"]] = match.expand(
                    re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
                )
        else:
            raise AssertionError(f"relabel action {action} is not modelled here")
    return labels


def _sanitized(prefix: str, mapping: dict[str, str]) -> dict[str, str]:
    return {prefix + re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in mapping.items()}


def test_scrape_config_gives_the_pods_the_jobs_alerts_expect(
    overlay: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = overlay
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    namespaces = job["kubernetes_sd_configs"][0]["namespaces"]["names"]

    jobs = set()
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        template = workload["spec"]["template"]
        for container in template["spec"]["containers"]:
            for port in container.get("ports", []) or [{}]:
                annotations = template["metadata"].get("annotations", {})
                meta = {
                    **_sanitized("__meta_kubernetes_pod_annotation_", annotations),
                    **_sanitized("__meta_kubernetes_pod_label_", template["metadata"]["labels"]),
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_ip": "10.0.0.7",
                    "__meta_kubernetes_pod_name": f"{workload['metadata']['name']}-0",
                    "__meta_kubernetes_namespace": workload["metadata"]["namespace"],
                    "__metrics_path__": "/metrics",
                    "__address__": f"10.0.0.7:{port.get('containerPort', 80)}",
                    "job": job["job_name"],
                }
                target = _relabel(job["relabel_configs"], meta)
                if target is None:
                    continue
                assert workload["metadata"]["namespace"] in namespaces
                assert target["__address__"] == f"10.0.0.7:{_settings(docs, container).metrics_port}"
                assert target["__metrics_path__"] == "/metrics"
                assert target["instance"] == meta["__meta_kubernetes_pod_name"]
                jobs.add(target["job"])
    assert jobs == set(JOBS), "the scrape jobs' names are what keylane's alerts and dashboards select"


def test_docs_describe_the_overlays() -> None:
    text = (REPO / "docs" / "deploy.md").read_text()

    for overlay in OVERLAYS:
        assert f"deploy/k8s/overlays/{overlay}" in text
    assert Path(SCRAPE_CONFIG.relative_to(REPO)).as_posix() in text
