"""One agent per consumer group: a worker whose group's live workers run another agent
refuses to start with one line; its own topic prefix or app id lets it run beside them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.group_identity import group_members, worker_client_id
from keylane.kafka.topic_admin import admin_client, apply_catalog
from tests.broker import REPO
from tests.processes import KeylaneProcess, process_env

pytestmark = pytest.mark.kafka

FIRST_AGENT = "tests.agents.flow:remember"
OTHER_AGENT = "tests.agents.counter:agent"


def worker_env(settings: Settings, data_dir: Path, **extra: str) -> dict[str, str]:
    """The test's broker and topic prefix, the app id left to its default (the prefix's)."""
    env = process_env(settings, KEYLANE_DATA_DIR=str(data_dir))
    del env["KEYLANE_APP_ID"]
    env.update(extra)
    return env


def test_a_second_agent_refuses_a_group_that_runs_another_and_runs_with_its_own(
    settings: Settings, catalog: object, tmp_path: Path
) -> None:
    first = KeylaneProcess(
        ["worker", "--agent", FIRST_AGENT], worker_env(settings, tmp_path / "a"), tmp_path / "first.log"
    ).start()
    group = f"{settings.topic_prefix}keylane"
    members = asyncio.run(group_members(settings, group))
    assert [m.client_id for m in members] == [worker_client_id(FIRST_AGENT)]

    refused = subprocess.run(
        [sys.executable, "-m", "keylane.cli", "worker", "--agent", OTHER_AGENT],
        env=worker_env(settings, tmp_path / "b"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr + refused.stdout
    (line,) = refused.stderr.strip().splitlines()
    assert line == (
        f"keylane: consumer group {group!r} already runs agent {FIRST_AGENT} (1 worker(s) on 127.0.0.1), "
        f"not {OTHER_AGENT}: give this deployment its own KEYLANE_APP_ID (group and state) and "
        "KEYLANE_TOPIC_PREFIX (topics), or stop those workers first to replace the agent"
    )
    assert first.running

    own_group = KeylaneProcess(
        ["worker", "--agent", OTHER_AGENT],
        worker_env(settings, tmp_path / "c", KEYLANE_APP_ID=f"{group}-other"),
        tmp_path / "own-group.log",
    ).start()
    other_prefix = Settings.from_env(
        {}, bootstrap_servers=settings.bootstrap_servers, topic_prefix=f"{settings.topic_prefix}other."
    )

    async def create_topics() -> None:
        async with admin_client(other_prefix) as client:
            await apply_catalog(client, load_catalog(prefix=other_prefix.topic_prefix))

    asyncio.run(create_topics())
    own_prefix = KeylaneProcess(
        ["worker", "--agent", OTHER_AGENT],
        worker_env(settings, tmp_path / "d", KEYLANE_TOPIC_PREFIX=other_prefix.topic_prefix),
        tmp_path / "own-prefix.log",
    ).start()

    assert first.running and own_group.running and own_prefix.running
    assert [
        m.client_id for m in asyncio.run(group_members(settings, f"{other_prefix.topic_prefix}keylane"))
    ] == [worker_client_id(OTHER_AGENT)]
