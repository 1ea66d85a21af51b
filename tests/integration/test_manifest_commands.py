"""The prod overlay's container command lines, run the way Kubernetes runs them, against a
3-node local Kafka cluster of the test's own (deploy/kafka/local_kafka.py): the topics Job,
every pod's init container, 3 workers and 2 effectors; each starts, is ready on /readyz,
serves the example agent, and stops cleanly on SIGTERM within its pod's grace period.

From the rendered manifests (`kubectl kustomize deploy/k8s/overlays/prod`) come each keylane
container's argv and environment, the replica counts, each pod's name, its
terminationGracePeriodSeconds and its preStop. The argv is the image's ENTRYPOINT
(deploy/Dockerfile: `keylane`) then the container's args, run as the venv's `keylane` console
script (the one `pip install` makes, as in the image) with the repository as the working
directory, as the image's /app is, so examples.support_agent imports. The environment is what
a container gets: the image's ENV lines, then its envFrom ConfigMaps, then its env entries
(a value; fieldRef metadata.name, the pod's name; a Secret's key: unset when optional, since
the test creates no Secret, and a dummy value of the test's own when required). Nothing of
this machine's environment leaks in but PATH.

Only what must differ on this machine is overridden:

* KEYLANE_BOOTSTRAP_SERVERS: the local cluster;
* KEYLANE_METRICS_PORT: a free port per process (every pod has its own IP in a cluster);
* the volumes: every env value at or under one of a container's volumeMounts (KEYLANE_DATA_DIR
  and the effector's SUPPORT_LEDGER) moves to that pod's own directory. A container with no
  volume at KEYLANE_DATA_DIR (the Job, the init containers: a read-only root filesystem) gets
  a directory that must stay absent;
* KEYLANE_TOPIC_PREFIX and KEYLANE_APP_ID, which the prod ConfigMap sets (`prod.`,
  `keylane-prod`): the overlay's values with a unique suffix, so no run meets another's topics
  or groups.

Everything else stays as the manifests say: replication factor 3 (on 3 brokers, so `topics
apply` warns of nothing), session timeout 45 s, static membership by pod name.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keylane.catalog import EVENTS, OUTPUT, load_catalog
from keylane.config import Settings
from keylane.kafka.topic_reader import read_to_end
from keylane.testing.processes import ManagedProcess, free_port, keylane_ready, readyz_status
from keylane.wire import AgentEnvelope, encode
from tests.broker import REPO, local_kafka
from tests.deploy.test_k8s import _argv, _named, _pod_spec, _render
from tests.kafka_io import one_key_per_partition, produce

pytestmark = pytest.mark.kafka

OVERLAY = "prod"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
NODES = 3
STATEFULSETS = ("keylane-worker", "keylane-effector")
JOB = "keylane-topics"
READY_WITHIN_S = 150.0
"""From the pods' start until all of them answer 200 on /readyz together. The startupProbe
would allow 5 minutes (/healthz); this machine needs far less."""
ONE_SHOT_TIMEOUT_S = 60.0  # a `topics apply` or `topics check` run
OUTPUTS_WITHIN_S = 60.0
SECRET_PLACEHOLDER = "dummy-{name}-{key}"
"""The value the test gives a required Secret key (it never reads one from anywhere)."""
OVERRIDDEN = ("KEYLANE_BOOTSTRAP_SERVERS", "KEYLANE_METRICS_PORT", "KEYLANE_TOPIC_PREFIX", "KEYLANE_APP_ID")


@dataclass(frozen=True)
class Container:
    """One keylane container of one pod, as this machine runs it."""

    pod: str
    name: str
    argv: list[str]
    env: dict[str, str]
    data_dir_mounted: bool

    @property
    def label(self) -> str:
        return f"{self.pod}/{self.name}"


@dataclass(frozen=True)
class Pod:
    name: str
    init: list[Container]
    main: Container
    grace_s: float
    pre_stop_s: float


@dataclass(frozen=True)
class Machine:
    """What differs on this machine: the brokers, a directory for the pods, a unique suffix."""

    bootstrap: str
    root: Path
    unique: str


# --- the image and the manifests --------------------------------------------------------


def _image() -> tuple[list[str], dict[str, str]]:
    """deploy/Dockerfile's ENTRYPOINT and ENV."""
    entrypoint: list[str] | None = None
    env: dict[str, str] = {}
    for line in DOCKERFILE.read_text().splitlines():
        instruction, _, rest = line.partition(" ")
        if instruction == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif instruction == "ENV":
            for pair in shlex.split(rest):
                name, sep, value = pair.partition("=")
                assert sep, f"deploy/Dockerfile: ENV {pair!r} is not NAME=value"
                env[name] = value
    assert entrypoint == ["keylane"], f"deploy/Dockerfile: ENTRYPOINT {entrypoint}, the test runs keylane"
    return entrypoint, env


def _keylane_script() -> str:
    """The venv's `keylane` console script: what the image's ENTRYPOINT runs."""
    script = Path(sys.executable).with_name("keylane")
    if not script.exists():
        pytest.fail(
            f"no keylane console script beside {sys.executable}: .venv/bin/pip install -e '.[test]'",
            pytrace=False,
        )
    return str(script)


def _container(
    docs: list[dict[str, Any]], workload: dict[str, Any], spec: dict[str, Any], pod: str, machine: Machine
) -> Container:
    """The argv and environment of container ``spec`` in pod ``pod`` of ``workload``."""
    _, image_env = _image()
    label = f"{pod}/{spec['name']}"
    env = {"PATH": os.environ["PATH"], **image_env}
    for source in spec.get("envFrom", []):
        assert set(source) == {"configMapRef"}, f"{label}: envFrom {source}: the test reads ConfigMaps only"
        env.update(_named(docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {}))
    for variable in spec.get("env", []):
        name = variable["name"]
        if "value" in variable:
            env[name] = variable["value"]
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            fields = {"metadata.name": pod, "metadata.namespace": workload["metadata"]["namespace"]}
            assert path in fields, f"{label}: {name} from fieldRef {path}, which the test does not know"
            env[name] = fields[path]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            if ref.get("optional", False):
                env.pop(name, None)  # no such Secret here: an optional key leaves the variable unset
            else:
                env[name] = SECRET_PLACEHOLDER.format(name=ref["name"], key=ref["key"])
        else:
            raise AssertionError(f"{label}: {name} from {source}, which the test does not know")
    for value in [*spec.get("args", []), *env.values()]:
        assert "$(" not in value, f"{label}: {value!r}: Kubernetes would expand $(VAR), the test does not"

    # What differs on this machine (the module docstring).
    assert set(OVERRIDDEN) <= env.keys(), (
        f"{label}: the manifests no longer set {set(OVERRIDDEN) - env.keys()}"
    )
    env["KEYLANE_BOOTSTRAP_SERVERS"] = machine.bootstrap
    env["KEYLANE_METRICS_PORT"] = str(free_port())
    # The prod ConfigMap sets both: prod. -> prod.<unique>., keylane-prod -> keylane-prod-<unique>.
    env["KEYLANE_TOPIC_PREFIX"] = f"{env['KEYLANE_TOPIC_PREFIX']}{machine.unique}."
    env["KEYLANE_APP_ID"] = f"{env['KEYLANE_APP_ID']}-{machine.unique}"
    volumes = {m["mountPath"]: machine.root / pod / m["name"] for m in spec.get("volumeMounts", [])}
    mounted = False  # whether a volume backs KEYLANE_DATA_DIR
    for name, value in env.items():
        for mount, local in volumes.items():
            if name != "PATH" and (value == mount or value.startswith(mount.rstrip("/") + "/")):
                env[name] = str(local / value[len(mount) :].lstrip("/"))
                mounted |= name == "KEYLANE_DATA_DIR"
    if not mounted:
        env["KEYLANE_DATA_DIR"] = str(machine.root / pod / f"{spec['name']}-unmounted-data-dir")
    return Container(pod, spec["name"], [_keylane_script(), *_argv(spec)], env, mounted)


def _job(docs: list[dict[str, Any]], machine: Machine) -> Container:
    job = _named(docs, "Job", JOB)
    (spec,) = _pod_spec(job)["containers"]
    return _container(docs, job, spec, JOB, machine)


def _pods(docs: list[dict[str, Any]], machine: Machine) -> list[Pod]:
    pods = []
    for name in STATEFULSETS:
        statefulset = _named(docs, "StatefulSet", name)
        pod_spec = _pod_spec(statefulset)
        (main,) = pod_spec["containers"]
        (pre_stop,) = main["lifecycle"]["preStop"]["exec"]["command"][1:]  # ["sleep", "5"]
        for ordinal in range(statefulset["spec"]["replicas"]):
            pod = f"{name}-{ordinal}"  # a StatefulSet's pod names
            pods.append(
                Pod(
                    name=pod,
                    init=[_container(docs, statefulset, c, pod, machine) for c in pod_spec["initContainers"]],
                    main=_container(docs, statefulset, main, pod, machine),
                    grace_s=float(pod_spec["terminationGracePeriodSeconds"]),
                    pre_stop_s=float(pre_stop),
                )
            )
    return pods


# --- running them -----------------------------------------------------------------------


def _run_once(container: Container) -> subprocess.CompletedProcess[str]:
    """A container that runs to completion (the Job's, an init container)."""
    result = subprocess.run(
        container.argv,
        env=container.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=ONE_SHOT_TIMEOUT_S,
        check=False,
    )
    if not container.data_dir_mounted:
        written = Path(container.env["KEYLANE_DATA_DIR"])
        assert not written.exists(), (
            f"{container.label} wrote to KEYLANE_DATA_DIR, which no volume backs in this container "
            "(readOnlyRootFilesystem)"
        )
    return result


def _explain(container: Container, result: subprocess.CompletedProcess[str]) -> str:
    command = shlex.join(result.args)
    return f"{container.label}: {command} exited {result.returncode}\n{result.stdout}\n{result.stderr}"


async def _outputs(settings: Settings, topic: str, customers: set[str]) -> dict[str, dict[str, Any]]:
    """The example agent's output per customer, once every customer has one."""
    deadline = asyncio.get_running_loop().time() + OUTPUTS_WITHIN_S
    while True:
        records = await read_to_end(settings, topic)
        outputs = {o["customer"]: o for o in (json.loads(r.value or b"{}") for r in records)}
        if customers <= outputs.keys():
            return outputs
        assert asyncio.get_running_loop().time() < deadline, (
            f"outputs for {sorted(outputs)} of {sorted(customers)} within {OUTPUTS_WITHIN_S:.0f}s"
        )
        await asyncio.sleep(0.5)


@pytest.fixture
def prod() -> list[dict[str, Any]]:
    """The rendered overlay; fails (never skips) without kubectl, as tests/deploy/test_k8s.py does."""
    return _render(OVERLAY)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    """A 3-node KRaft cluster from Maven Central jars (about 15 s to start on 2 cores)."""
    launcher = local_kafka()
    state = tmp_path / "kafka"
    cluster = launcher.start(state, nodes=NODES, quiet=True)
    try:
        yield cluster
    finally:
        launcher.stop(state, quiet=True)


@pytest.mark.timeout(420)
def test_the_prod_containers_start_get_ready_serve_and_stop_within_their_grace(
    prod: list[dict[str, Any]],  # before the cluster: without kubectl, fail before starting one
    cluster: Any,
    tmp_path: Path,
) -> None:
    docs = prod
    machine = Machine(cluster.bootstrap, tmp_path / "pods", uuid.uuid4().hex[:8])
    job = _job(docs, machine)
    pods = _pods(docs, machine)
    workers = [p for p in pods if p.name.startswith("keylane-worker-")]
    effectors = [p for p in pods if p.name.startswith("keylane-effector-")]

    # The prod overlay's pods, and what the test keeps as the manifests say.
    assert [p.name for p in pods] == [
        *(f"keylane-worker-{i}" for i in range(3)),
        *(f"keylane-effector-{i}" for i in range(2)),
    ]
    for pod in pods:
        env = pod.main.env
        assert env["KEYLANE_GROUP_INSTANCE_ID"] == pod.name, "static membership by pod name"
        assert env["KEYLANE_SESSION_TIMEOUT_S"] == "45"
        assert env["KEYLANE_REPLICATION_FACTOR"] == str(NODES)
        assert "KEYLANE_SIGNING_KEYS" not in env, "optional, and no Secret here"
    for pod in workers:
        assert pod.main.env["PROVIDER_API_KEY"] == "dummy-keylane-provider-api-key", "required in prod"
    settings = Settings.from_env(workers[0].main.env)

    started: list[ManagedProcess] = []
    try:
        # Before the Job has run, an init container fails (the kubelet retries it with back-off).
        early = _run_once(workers[0].init[0])
        assert early.returncode == 1 and "missing" in early.stdout, _explain(workers[0].init[0], early)

        # The Job creates the topics; a second run (the next deploy) changes nothing.
        first = _run_once(job)
        assert first.returncode == 0 and first.stdout.rstrip().endswith(": changed"), _explain(job, first)
        again = _run_once(job)
        assert again.returncode == 0, _explain(job, again)
        assert again.stdout.rstrip().endswith(": nothing to change"), _explain(job, again)
        assert "warning" not in first.stdout + again.stdout, _explain(job, first)

        # Every pod's init containers, all pods at once (podManagementPolicy: Parallel).
        inits = [c for pod in pods for c in pod.init]
        with ThreadPoolExecutor(len(inits)) as pool:
            for container, result in zip(inits, pool.map(_run_once, inits), strict=True):
                assert result.returncode == 0, _explain(container, result)
                assert "all " in result.stdout and " topics match the catalog" in result.stdout

        # The pods' main containers, all at once; ready when all of them answer 200 together.
        launched = time.monotonic()
        for pod in pods:
            process = ManagedProcess(
                pod.main.argv,
                pod.main.env,
                tmp_path / "logs" / f"{pod.name}.log",
                name=pod.main.label,
                cwd=REPO,
                ready=keylane_ready(),  # /readyz, since KEYLANE_METRICS_PORT is set
            )
            started.append(process.launch())
        for process in started:  # each on its own: keylane.testing's probe, /readyz on its port
            process.wait_ready(max(0.0, launched + READY_WITHIN_S - time.monotonic()))
        urls = [f"http://127.0.0.1:{p.main.env['KEYLANE_METRICS_PORT']}/readyz" for p in pods]
        while True:  # then all together (a late joiner's rebalance makes the others 503 a moment)
            statuses = {p.name: readyz_status(url) for p, url in zip(pods, urls, strict=True)}
            if all(status == 200 for status in statuses.values()):
                break
            for process in started:
                process.check()  # one that exited fails here, with its log
            waited = time.monotonic() - launched
            assert waited < READY_WITHIN_S, f"not all ready on /readyz after {waited:.0f}s: {statuses}"
            time.sleep(0.5)
        ready_after_s = time.monotonic() - launched

        # The example agent answers every customer, each reply sent once by an effector.
        catalog = load_catalog(prefix=settings.topic_prefix)
        keys = one_key_per_partition(catalog[EVENTS].partitions, "customer-{}")
        customers = {k.decode() for k in keys}
        events = [(k, encode(AgentEnvelope(payload=f"where is my refund, {k.decode()}?"))) for k in keys]
        asyncio.run(produce(settings, catalog.name(EVENTS), events))
        outputs = asyncio.run(_outputs(settings, catalog.name(OUTPUT), customers))
        for customer in customers:
            assert outputs[customer]["reply"] == "We have started your refund.", outputs[customer]
            assert outputs[customer]["delivery"] == "OK", outputs[customer]
        sent = [
            json.loads(line)["customer"]
            for pod in effectors
            if Path(pod.main.env["SUPPORT_LEDGER"]).exists()
            for line in Path(pod.main.env["SUPPORT_LEDGER"]).read_text().splitlines()
        ]
        assert sorted(sent) == sorted(customers), "each reply sent once"
        for pod in effectors:  # 3 of the 6 intents partitions each
            assert Path(pod.main.env["SUPPORT_LEDGER"]).exists(), f"{pod.name} sent no reply"

        # Deleting the pods: the kubelet runs preStop (sleep 5), then SIGTERMs the process and
        # kills it at terminationGracePeriodSeconds, counted from the preStop's start. The test
        # skips the sleep and gives each process what is left of the grace after it.
        stopping = {}
        stopped_within_s = 0.0
        for process in started:
            assert process.proc is not None
            process.proc.send_signal(signal.SIGTERM)
            stopping[process.name] = time.monotonic()
        for pod, process in zip(pods, started, strict=True):
            assert process.proc is not None
            budget = pod.grace_s - pod.pre_stop_s
            try:
                code = process.proc.wait(timeout=max(0.0, stopping[process.name] + budget - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{process.name} still running {budget:.0f}s after SIGTERM "
                    f"(terminationGracePeriodSeconds {pod.grace_s:.0f} - preStop {pod.pre_stop_s:.0f}):\n"
                    f"{process.tail()}"
                ) from None
            took = time.monotonic() - stopping[process.name]
            assert code == 0, f"{process.name} exited {code} {took:.1f}s after SIGTERM:\n{process.tail()}"
            stopped_within_s = max(stopped_within_s, took)
            # A static member, by pod name: it joined as one and left no LeaveGroup behind.
            assert f"with member_id {pod.name}-" in process.log(), process.tail()
            assert "LeaveGroup" not in process.log(), process.tail()
    finally:
        for process in started:
            if process.running:
                process.kill9()
    print(
        f"all {len(pods)} pods ready on /readyz {ready_after_s:.1f}s after their start; "
        f"each exited 0 at most {stopped_within_s:.1f}s after SIGTERM"
    )
