"""What `make run` runs (deploy/run_local.py): broker, topics, worker, effector and a
Prometheus scraping both up; the commands and addresses it prints work as printed; Ctrl-C
leaves nothing behind."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from keylane.testing.processes import free_port
from tests.broker import REPO, local_kafka
from tests.prometheus import Prometheus, local_prometheus

pytestmark = pytest.mark.kafka


def wait_for_text(path: Path, text: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        assert proc.poll() is None, f"make run exited with {proc.returncode}:\n{content[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear within {timeout_s}s:\n{path.read_text()[-3000:]}")


def printed_command(shown: str, label: str) -> str:
    match = re.search(rf"^  {label}\s+(.+)$", shown, re.MULTILINE)
    assert match, f"make run printed no {label} line:\n{shown[-2000:]}"
    return match.group(1)


def start_run_local(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """`make run` (deploy/run_local.py) as a user starts it: its Kafka state in tmp_path/kafka,
    its topics and group named after ``name``, nothing exported about the broker, free ports for
    the metrics and Prometheus. The log goes to tmp_path/run.log; a new session stands in for
    the terminal (Ctrl-C signals the group)."""
    env = {
        **os.environ,
        "KEYLANE_KAFKA_STATE": str(tmp_path / "kafka"),
        "KEYLANE_DATA_DIR": str(tmp_path / "data"),
        "KEYLANE_TOPIC_PREFIX": f"{name}.",
        "KEYLANE_APP_ID": f"keylane-{name}",
        "KEYLANE_METRICS_PORT": str(free_port()),
        "KEYLANE_EFFECTOR_METRICS_PORT": str(free_port()),
        "KEYLANE_PROMETHEUS_PORT": str(free_port()),
        "SUPPORT_LEDGER": str(tmp_path / "ledger.jsonl"),
    }
    for variable in ("KEYLANE_BOOTSTRAP_SERVERS", "KEYLANE_REPLICATION_FACTOR"):
        env.pop(variable, None)
    with open(tmp_path / "run.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, str(REPO / "deploy" / "run_local.py")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )


def test_run_local_serves_the_example_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    state = tmp_path / "kafka"
    log_path = tmp_path / "run.log"
    ledger = tmp_path / "ledger.jsonl"
    proc = start_run_local(tmp_path, "makerun")
    try:
        shown = wait_for_text(log_path, "keylane is running", 100, proc)
        broker_pids = [n["pid"] for n in json.loads((state / "cluster.json").read_text())["nodes"]]
        assert "9 created" in shown

        subprocess.run(printed_command(shown, "produce"), shell=True, check=True, timeout=30)  # noqa: S602
        consume = printed_command(shown, "consume") + " -c 1 -e"
        deadline = time.monotonic() + 60
        output = ""
        while not output and time.monotonic() < deadline:
            output = subprocess.run(consume, shell=True, capture_output=True, text=True, timeout=30).stdout  # noqa: S602
        assert json.loads(output.strip().split("|", 1)[1]) == {
            "customer": "customer-1",
            "reply": "We have started your refund.",
            "delivery": "OK",
            "remembered": 1,
        }
        assert json.loads(ledger.read_text()) == {
            "customer": "customer-1",
            "text": "We have started your refund.",
        }

        prometheus_url = printed_command(shown, "prometheus").split()[0]
        assert local_prometheus().answers_ready(prometheus_url), f"{prometheus_url}/-/ready"
        targets = Prometheus(prometheus_url).wait_targets_up({"keylane-worker", "keylane-effector"})
        assert len(targets) == 2, targets
        assert (tmp_path / "data" / "prometheus" / "data").is_dir(), "its TSDB is under the run's data dir"

        os.killpg(proc.pid, signal.SIGINT)

        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "kafka at 127.0.0.1:" in log_path.read_text()
    assert not local_prometheus().answers_ready(prometheus_url), "Ctrl-C stopped Prometheus"
    for pid in broker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.timeout(300)
def test_run_local_on_a_running_three_node_cluster_replicates_its_topics(tmp_path: Path) -> None:
    """`make broker NODES=3` then `make run`: the reused cluster's topics get replication
    factor 3 and min.insync.replicas 2 without the user exporting anything."""
    launcher = local_kafka()
    state = tmp_path / "kafka"
    cluster = launcher.start(state, nodes=3, quiet=True)
    log_path = tmp_path / "run.log"
    try:
        proc = start_run_local(tmp_path, "makerun3")
        try:
            wait_for_text(log_path, "keylane is running", 150, proc)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=60)

        async def replicas() -> dict[str, set[int]]:
            client = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
            await client.start()
            try:
                topics = await client.describe_topics(["makerun3.agent.events", "makerun3.agent.intents"])
            finally:
                await client.close()
            return {t["topic"]: {len(p["replicas"]) for p in t["partitions"]} for t in topics}

        assert asyncio.run(replicas()) == {"makerun3.agent.events": {3}, "makerun3.agent.intents": {3}}
    finally:
        launcher.stop(state, quiet=True)
