"""The metrics port of a real worker and a real effector: /readyz answers 503 with a reason
while the process starts and 200 once it is ready (the test runner waits on it), /healthz is
200, `promtool check metrics` finds every /metrics body clean, the fixed label vocabularies
are there before the first event, keylane_info names the role, and the lag gauges of every
assigned input partition exist and reach 0 once the events are processed."""

from __future__ import annotations

import asyncio
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from keylane.catalog import APPROVALS, CONTROL, EVENTS, INTENTS, OUTPUT, RESULTS, TIMERS, Catalog
from keylane.config import Settings
from keylane.stages.worker import keylane_version
from keylane.testing.processes import KeylaneReady, ReadyzProbe, free_port
from keylane.wire import AgentEnvelope, encode
from tests.kafka_io import produce, wait_for_records
from tests.processes import KeylaneProcess, process_env

pytestmark = pytest.mark.kafka

PROMTOOL = "/usr/bin/promtool"
KEYS = [b"acct-1", b"acct-2", b"acct-3", b"acct-4"]
NOT_READY = {
    "starting",
    "waiting for the first partition assignment",
    "rebalancing",
    "recovering tables from their changelogs",
}


def get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:port/path; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def samples(body: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a /metrics body by (name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def by_partition(body: str, name: str) -> dict[tuple[str, str], float]:
    """A gauge with (topic, partition) labels: its value by (topic, partition)."""
    return {
        (labels["topic"], labels["partition"]): value
        for (sample, label_set), value in samples(body).items()
        if sample == name and (labels := dict(label_set))
    }


def promtool_check(body: str) -> tuple[int, str]:
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode, result.stdout + result.stderr


def watch_readyz(process: KeylaneProcess, port: int, timeout_s: float = 90) -> list[tuple[int, str]]:
    """Launch ``process`` and poll its /readyz until it answers 200; every distinct answer seen."""
    process.launch()
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process.check()
        answer = get(port, "/readyz")
        if answer[0] and answer not in seen:
            seen.append(answer)
        if answer[0] == 200:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"/readyz never answered 200: {seen}\n{process.tail()}")


async def lags_settle(
    port: int, partitions: set[tuple[str, str]], topic: str, records: int, timeout_s: float = 60
) -> str:
    """Poll /metrics until keylane_consumer_lag exists for exactly ``partitions``, all 0, and the
    committed offsets of ``topic`` add up to its ``records`` (the gauges follow the log end
    every 2 s: a lag of 0 before that is the one of the assignment); the body."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        _, body = await asyncio.to_thread(get, port, "/metrics")
        lag = by_partition(body, "keylane_consumer_lag")
        committed = by_partition(body, "keylane_consumer_committed_offset")
        on_topic = sum(value for (name, _), value in committed.items() if name == topic)
        if set(lag) == partitions and not any(lag.values()) and on_topic == records:
            return body
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"lag by partition {lag}, committed {committed}: expected 0 on each of "
                f"{sorted(partitions)} and {records} records committed on {topic}"
            )
        await asyncio.sleep(0.5)


async def test_worker_and_effector_serve_clean_metrics_health_readiness_and_lag(
    settings: Settings, catalog: Catalog, tmp_path: Path
) -> None:
    worker_port, effector_port = free_port(), free_port()
    env = process_env(
        settings, LLM_LEDGER=str(tmp_path / "llm.jsonl"), TOOL_LEDGER=str(tmp_path / "tools.jsonl")
    )
    worker = KeylaneProcess(
        ["worker", "--agent", "tests.agents.flow:act_then_complete"],
        {**env, "KEYLANE_METRICS_PORT": str(worker_port)},
        tmp_path / "worker.log",
    )
    effector = KeylaneProcess(
        ["effector", "--tools", "tests.agents.flow", "--metrics-port", str(effector_port)],
        env,  # KEYLANE_METRICS_PORT=0 there: the flag wins, for the process and for its probe
        tmp_path / "effector.log",
    )
    # Topic labels are the catalog's names, without the test's topic prefix.
    worker_inputs = {
        (topic, str(p))
        for topic in (EVENTS, RESULTS, APPROVALS, TIMERS, CONTROL)
        for p in range(catalog[topic].partitions)
    }
    effector_inputs = {(INTENTS, str(p)) for p in range(catalog[INTENTS].partitions)}

    try:
        seen = {
            "effector": await asyncio.to_thread(watch_readyz, effector, effector_port),
            "worker": await asyncio.to_thread(watch_readyz, worker, worker_port),
        }
        for role, answers in seen.items():
            *before, last = answers
            assert last == (200, "ready\n"), role
            assert before, f"{role}: /readyz said ready at its first answer"
            assert {status for status, _ in before} == {503}, (role, before)
            assert {body.strip() for _, body in before} <= NOT_READY, (role, before)
        for process in (worker, effector):  # the runner's probe polls /readyz for both
            assert isinstance(process.probe, KeylaneReady), process.name
            assert isinstance(process.probe._probe, ReadyzProbe), process.name
            process.wait_ready(timeout_s=5)

        ports = {"worker": worker_port, "effector": effector_port}
        fresh = {role: (await asyncio.to_thread(get, port, "/metrics"))[1] for role, port in ports.items()}
        for role, port in ports.items():
            assert await asyncio.to_thread(get, port, "/healthz") == (200, "ok\n"), role
            assert (await asyncio.to_thread(get, port, "/nowhere"))[0] == 404, role
        # A fresh worker exports its dead letters by reason, at 0, before anything happened.
        worker_fresh = samples(fresh["worker"])
        assert worker_fresh[("keylane_agent_errors_total", frozenset({("reason", "malformed_record")}))] == 0
        assert worker_fresh[("keylane_waiting_keys", frozenset({("kind", "tool")}))] == 0

        events = [
            (key, encode(AgentEnvelope(payload=f"{key.decode()}-e{i}"))) for i in range(2) for key in KEYS
        ]
        await produce(settings, catalog.name(EVENTS), events)
        await wait_for_records(
            settings, catalog.name(OUTPUT), lambda rs: len(rs) == len(events), timeout_s=90
        )

        bodies = {
            "worker": await lags_settle(worker_port, worker_inputs, EVENTS, len(events)),
            "effector": await lags_settle(effector_port, effector_inputs, INTENTS, len(events)),
        }
        now = time.time()
        for role, body in bodies.items():
            assert promtool_check(body) == (0, ""), role
            assert promtool_check(fresh[role]) == (0, ""), f"{role} before any event"
            info = [dict(labels) for (name, labels), _ in samples(body).items() if name == "keylane_info"]
            assert info == [
                {
                    "role": role,
                    "app_id": settings.app_id,
                    "topic_prefix": settings.topic_prefix,
                    "version": keylane_version(),
                }
            ]
            topics = {dict(labels).get("topic") for (_, labels) in samples(body)} - {None}
            assert not [t for t in topics if str(t).startswith(settings.topic_prefix)], (role, topics)
            inputs = worker_inputs if role == "worker" else effector_inputs
            assert set(by_partition(body, "keylane_consumer_committed_offset")) == inputs, role
            commits = by_partition(body, "keylane_consumer_last_commit_timestamp_seconds")
            assert set(commits) == inputs, role
            assert all(now - 300 < t <= now + 1 for t in commits.values()), (role, commits)

        worker_samples = samples(bodies["worker"])
        assert worker_samples[("keylane_activations_total", frozenset({("kind", "start")}))] == len(events)
        assert worker_samples[("keylane_waiting_keys", frozenset({("kind", "tool")}))] == 0, "all resumed"
        calls = worker_samples[("keylane_llm_calls_total", frozenset())]
        durations = sum(
            value
            for (name, _), value in worker_samples.items()
            if name == "gen_ai_client_operation_duration_seconds_count"
        )
        assert calls == durations >= len(events), "one GenAI duration per provider call"
        effector_ok = samples(bodies["effector"])[
            ("keylane_effector_intents_total", frozenset({("status", "OK")}))
        ]
        assert effector_ok == len(events)
    finally:
        codes = {process.name: process.stop() for process in (worker, effector)}
    assert codes == {"worker": 0, "effector": 0}, worker.tail() + effector.tail()
