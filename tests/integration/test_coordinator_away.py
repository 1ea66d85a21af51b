"""A worker that cannot reach its group's coordinator says so in one line once its retries
run out, instead of the Kafka client's traceback.

The broker is a real one-node Kafka whose ``offsets.topic.replication.factor`` is 3: it can
never create __consumer_offsets, so every FindCoordinator is answered with the retriable
GroupCoordinatorNotAvailable, as when the coordinator's brokers stay down. The catalog's
topics are there, so the worker's topic check passes and its agent check (which asks the
group's coordinator who runs in the group) is the step that waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.topic_admin import admin_client, apply_catalog
from tests.broker import local_kafka
from tests.processes import python_run

pytestmark = pytest.mark.kafka

RETRY_S = 3  # the worker's retry budget in this test (RETRY_S, 30 s in production)


@pytest.fixture
def coordinator_less_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    launcher = local_kafka()
    plain = launcher.server_properties

    def offsets_topic_unplaceable(node: object, nodes: list[object]) -> str:
        return plain(node, nodes).replace(
            "offsets.topic.replication.factor=1", "offsets.topic.replication.factor=3"
        )

    monkeypatch.setattr(launcher, "server_properties", offsets_topic_unplaceable)
    state_dir = tmp_path / "kafka"
    cluster = launcher.start(state_dir, nodes=1, quiet=True)
    try:
        yield cluster.bootstrap
    finally:
        launcher.stop(state_dir, quiet=True)


def test_a_coordinator_that_stays_away_is_one_line_not_a_traceback(
    coordinator_less_broker: str, tmp_path: Path
) -> None:
    settings = Settings.from_env(
        {}, bootstrap_servers=coordinator_less_broker, topic_prefix="away.", app_id="away", data_dir=tmp_path
    )

    async def create_topics() -> None:
        async with admin_client(settings) as client:
            await apply_catalog(client, load_catalog(prefix=settings.topic_prefix))

    asyncio.run(create_topics())
    # The real CLI entry point, with the retry budget cut so the test does not wait 30 s.
    script = (
        "import sys; import keylane.kafka.topic_admin as admin; "
        f"admin.RETRY_S = {RETRY_S}; from keylane.cli import main; "
        "sys.exit(main(['worker', '--agent', 'tests.agents.flow:remember']))"
    )
    refused = python_run(settings, "-c", script, KEYLANE_DATA_DIR=str(tmp_path / "worker"))

    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    (line,) = refused.stderr.strip().splitlines()
    assert line == (
        "keylane: Kafka kept answering [Error 15] GroupCoordinatorNotAvailableError: Unable to get "
        f"coordinator id for away for {RETRY_S} s: a broker or the group coordinator stays unavailable; "
        "check that every broker is up and that __consumer_offsets and the catalog's topics have "
        "leaders, then start again"
    )
