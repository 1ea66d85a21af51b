"""What `make run` runs (deploy/run_local.py): broker, topics, worker, effector and a
Prometheus scraping both up; the commands and addresses it prints work as printed; Ctrl-C,
or `kill -INT` of the pid it prints when a script started it in the background, leaves
nothing behind (not even the broker's address in keylane.env)."""

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
        content = path.read_text(errors="replace") if path.exists() else ""  # a shell's redirect makes it
        if text in content:
            return content
        assert proc.poll() is None, f"make run exited with {proc.returncode}:\n{content[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear within {timeout_s}s:\n{path.read_text()[-3000:]}")


def printed_command(shown: str, label: str) -> str:
    match = re.search(rf"^  {label}\s+(.+)$", shown, re.MULTILINE)
    assert match, f"make run printed no {label} line:\n{shown[-2000:]}"
    return match.group(1)


MAKE_CONTEXT = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")
"""What a `make` running these tests (`make test`) passes down: a `make run` started with it is
a sub-make and prints "make[1]: Entering directory" lines a newcomer's shell does not show."""


def run_env(tmp_path: Path, name: str) -> dict[str, str]:
    """The environment of a `make run` whose Kafka state is in tmp_path/kafka, its topics and
    group named after ``name``, nothing exported about the broker, free ports for the metrics
    and Prometheus."""
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
    for variable in (
        "KEYLANE_BOOTSTRAP_SERVERS",
        "KAFKA_BOOTSTRAP_SERVERS",
        "KEYLANE_REPLICATION_FACTOR",
        *MAKE_CONTEXT,
    ):
        env.pop(variable, None)
    return env


def start_run_local(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """`make run` (deploy/run_local.py) as a user starts it, in :func:`run_env`'s environment.
    The log goes to tmp_path/run.log; a new session stands in for the terminal (Ctrl-C signals
    the group)."""
    with open(tmp_path / "run.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, str(REPO / "deploy" / "run_local.py")],
            env=run_env(tmp_path, name),
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
        assert "10 created" in shown

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

        # The cli line points the keylane command at this run's broker and topics, from a shell
        # that has nothing exported; keylane.env holds the same address while the broker runs.
        exported = cli_exports(printed_command(shown, "cli"))
        assert exported == {
            "KEYLANE_BOOTSTRAP_SERVERS": printed_command(shown, "kafka"),
            "KEYLANE_TOPIC_PREFIX": "makerun.",
        }
        address = exported["KEYLANE_BOOTSTRAP_SERVERS"]
        assert f"KEYLANE_BOOTSTRAP_SERVERS={address}\n" in (state / "keylane.env").read_text()
        checked = subprocess.run(
            [sys.executable, "-m", "keylane.cli", "topics", "check"],
            env={**newcomer_env(), **exported},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        said = checked.stdout + checked.stderr
        assert (checked.returncode, said.splitlines()[-1:]) == (0, ["all 10 topics match the catalog"]), said

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
    assert sorted(p.name for p in state.iterdir()) == ["cluster-id", "node-1"], "no stopped broker's address"


def cli_exports(line: str) -> dict[str, str]:
    """The variables of the block's `export A=x B=y (why)` line."""
    words = line.split(" (", 1)[0].split()
    assert words[0] == "export", line
    return dict(word.split("=", 1) for word in words[1:])


def newcomer_env() -> dict[str, str]:
    """This environment without any Kafka address, keylane setting or enclosing make: a fresh
    shell's."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("KEYLANE_") and name != "KAFKA_BOOTSTRAP_SERVERS" and name not in MAKE_CONTEXT
    }


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, theirs, ...), with its command line."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            found[child] = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        todo.extend(children.get(child, []))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def sigint_ignored(pid: int) -> bool:
    """Whether ``pid`` ignores SIGINT (its SigIgn mask in /proc)."""
    status = (Path("/proc") / str(pid) / "status").read_text()
    (mask,) = re.findall(r"^SigIgn:\s+([0-9a-f]+)$", status, re.MULTILINE)
    return bool(int(mask, 16) & (1 << (signal.SIGINT - 1)))


@pytest.mark.timeout(240)
def test_make_run_in_a_scripts_background_stops_on_kill_int_of_the_printed_pid(tmp_path: Path) -> None:
    """`make run > log 2>&1 &` in a non-interactive script: bash starts the job with SIGINT
    ignored and make keeps ignoring it (so `kill -INT` of make's pid reaches nobody); the
    "keylane is running" block names the pid to signal, and `kill -INT` of it stops every
    process the run started (broker, worker, effector, Prometheus) within 30 s. `-o install`:
    the install step is what `make test` already did, and must not rebuild the virtualenv
    this test runs in."""
    log_path = tmp_path / "run.log"
    make_pid_file = tmp_path / "make.pid"
    script = f"make -o install run > {log_path} 2>&1 &\necho $! > {make_pid_file}\nwait $!\n"
    script_proc = subprocess.Popen(
        ["bash", "-c", script], env=run_env(tmp_path, "makerunbg"), cwd=REPO, start_new_session=True
    )
    try:
        shown = wait_for_text(log_path, "keylane is running", 100, script_proc)
        make_pid = int(make_pid_file.read_text())
        assert sigint_ignored(make_pid), "a script's background job starts with SIGINT ignored"
        started = descendants(make_pid)
        cluster = json.loads((tmp_path / "kafka" / "cluster.json").read_text())
        broker_pids = [node["pid"] for node in cluster["nodes"]]
        assert set(broker_pids) <= set(started), started
        for what in ("kafka.Kafka", "keylane.cli worker", "keylane.cli effector", "prometheus --config.file"):
            assert any(what in command for command in started.values()), f"no {what!r} in {started}"
        stop_line = printed_command(shown, "stop")
        match = re.match(r"Ctrl-C, or kill -INT (\d+) ", stop_line)
        assert match, stop_line
        assert int(match.group(1)) in started, "the pid it names is run_local's, below make"

        subprocess.run(["kill", "-INT", match.group(1)], check=True, timeout=10)

        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: command for pid, command in started.items() if alive(pid)}
        assert not left, f"still running 30 s after kill -INT: {left}\n{log_path.read_text()[-3000:]}"
        assert script_proc.wait(timeout=10) == 0, "make exited 0"
    finally:
        if script_proc.poll() is None:
            os.killpg(script_proc.pid, signal.SIGKILL)
            script_proc.wait()
        local_kafka().stop(tmp_path / "kafka", quiet=True)
    assert log_path.read_text().rstrip().endswith("stopped"), log_path.read_text()[-2000:]
    assert not (tmp_path / "kafka" / "keylane.env").exists(), "no address of a stopped broker"


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
