"""A worker that found it was evicted (its consumer back in generation -1) commits nothing:
Kafka would take a commit under generation -1 into a group left empty as an admin's, and a
thawed zombie's stale marks would move the group's offsets back. The broker test that thaws
such a worker is tests/integration/test_zombie_restore.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from keylane.kafka.offset_guard import OffsetGuard

TOPIC = "agent.events"


def guard_in(generation: int) -> tuple[OffsetGuard, list[Any]]:
    committed: list[Any] = []

    async def commit(offsets: Any) -> None:
        committed.append(offsets)

    coordinator = SimpleNamespace(generation=generation)
    loop = asyncio.get_running_loop()
    aiokafka = SimpleNamespace(_coordinator=coordinator, commit=commit)
    thread = SimpleNamespace(_consumer=aiokafka, _ensure_consumer=lambda: aiokafka, thread_loop=loop)
    app = SimpleNamespace(
        consumer=SimpleNamespace(_thread=thread), tables=SimpleNamespace(on_commit=lambda o: None)
    )
    guard = OffsetGuard(app)
    guard.topics.add(TOPIC)
    guard.ledger.assigned((TOPIC, 0), 0)
    guard.ledger.admit((TOPIC, 0), 0)
    guard.ledger.finished((TOPIC, 0), 0)
    return guard, committed


async def test_a_member_commits_its_revoked_partitions_and_an_evicted_worker_does_not() -> None:
    member, committed = guard_in(7)
    assert member.member()
    await member.commit_revoked(member.app.consumer, [TP(TOPIC, 0)])
    assert len(committed) == 1

    evicted, nothing = guard_in(-1)
    assert not evicted.member()
    await evicted.commit_revoked(evicted.app.consumer, [TP(TOPIC, 0)])
    assert nothing == []
