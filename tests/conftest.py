"""Session fixtures shared by every test: the broker, and per-test topics."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest

import keylane.core.state
from keylane.catalog import Catalog, load_catalog
from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client, apply_catalog
from tests.broker import Broker, NoBroker, acquire, in_ci
from tests.processes import stop_leftovers

# Every state an activation commits without decoding its blob is decoded anyway, and compared,
# in every test and in every worker a test starts (keylane.core.state.CHECK_ROUND_TRIPS).
os.environ["KEYLANE_CHECK_ROUND_TRIPS"] = "1"
keylane.core.state.CHECK_ROUND_TRIPS = True

_broker_outcomes: dict[str, int] = {"passed": 0, "failed": 0, "skipped": 0}
_broker_source: list[str] = []


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """The run's Kafka broker (see tests/broker.py for where it comes from)."""
    try:
        broker = acquire(tmp_path_factory.mktemp("kafka"))
    except NoBroker as exc:
        message = f"no Kafka broker for the broker-backed tests: {exc}"
        if in_ci():
            pytest.fail(message + " (CI=true: broker tests must run, not skip)", pytrace=False)
        pytest.skip(message)
    _broker_source.append(broker.source)
    try:
        yield broker
    finally:
        broker.release()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    """A bootstrap address of a real Kafka broker."""
    return kafka_broker.bootstrap


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: object) -> Iterator[Settings]:
    """Settings for one test: its own topic prefix, consumer group and data dir. Processes the
    test left running are stopped after it."""
    unique = uuid.uuid4().hex[:10]
    yield Settings.from_env(
        {},
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"t{unique}.",
        app_id=f"keylane-test-{unique}",
        data_dir=tmp_path,
    )
    stop_leftovers()


@pytest.fixture
def catalog(settings: Settings) -> Catalog:
    """The catalog with this test's prefix applied, created on the broker."""
    catalog = load_catalog(prefix=settings.topic_prefix)

    async def create() -> None:
        async with admin_client(settings) as client:
            await apply_catalog(client, catalog)

    asyncio.run(create())
    return catalog


_broker_tests: set[str] = set()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # By marker, not keyword: every test under tests/unit/kafka/ has the keyword "kafka" too.
    _broker_tests.update(item.nodeid for item in items if item.get_closest_marker("kafka"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _broker_tests:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _broker_outcomes[report.outcome] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran = _broker_outcomes
    where = _broker_source[0] if _broker_source else "no broker was started"
    terminalreporter.write_sep("-", "kafka broker")
    terminalreporter.write_line(f"broker: {where}")
    terminalreporter.write_line(
        f"broker-backed tests: {ran['passed']} passed, {ran['failed']} failed, {ran['skipped']} skipped"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if in_ci() and _broker_outcomes["skipped"] and exitstatus == 0:
        # A skipped broker test in CI means the run proved less than it claims.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
