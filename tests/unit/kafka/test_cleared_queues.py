"""Faust empties its stream queues when it resumes flow, and a recovery resumes flow after its
seek to committed: records fetched from the guard's new position in between were thrown away
and their partition waited 15 s for the stall check (make test's recovery bench smoke caught
it on a busy machine). The guard reads such partitions again from the ledger's expected
offset. Real mode flow control and Faust queues; the consumer records the seeks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
from faust.types import TP

from keylane.kafka.offset_guard import OffsetGuard
from keylane.kafka.patches import watch_cleared_queues

TOPIC = "agent.events"


class SeekingConsumer:
    def __init__(self, assignment: set[TP]) -> None:
        self.assigned = assignment
        self.seeks: list[dict[TP, int]] = []

    def assignment(self) -> set[TP]:
        return self.assigned

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))


def event_of(topic: str, partition: int, offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition, offset=offset))


def guarded_app() -> tuple[Any, OffsetGuard, SeekingConsumer]:
    app = faust.App("cleared-queues-test")
    consumer = SeekingConsumer({TP(TOPIC, 0), TP(TOPIC, 1), TP("other", 0)})
    guard = OffsetGuard(SimpleNamespace(flow_control=app.flow_control, consumer=consumer))
    guard.topics.add(TOPIC)
    guard.ledger.assigned((TOPIC, 0), 5)
    guard.ledger.assigned((TOPIC, 1), 9)
    watch_cleared_queues(app, guard.queues_cleared)
    return app, guard, consumer


async def settled(guard: OffsetGuard) -> None:
    while guard._seeks:
        await asyncio.gather(*guard._seeks)


async def test_a_partition_whose_records_were_cleared_is_read_again_from_the_expected_offset() -> None:
    app, guard, consumer = guarded_app()
    queue = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    app.flow_control.resume()
    await queue.put(event_of(TOPIC, 0, 5))
    await queue.put(event_of("other", 0, 3))  # not governed: Faust's own business

    app.flow_control.resume()  # what a recovery does after its seek to committed
    await settled(guard)

    assert queue.empty()
    assert consumer.seeks == [{TP(TOPIC, 0): 5}]


async def test_a_cancelled_put_reads_every_assigned_partition_again() -> None:
    app, guard, consumer = guarded_app()
    queue = app.FlowControlQueue(maxsize=1, clear_on_resume=True)
    app.flow_control.resume()
    await queue.put(event_of("other", 0, 1))
    blocked = asyncio.ensure_future(queue.put(event_of(TOPIC, 1, 9)))  # the queue is full
    await asyncio.sleep(0)

    app.flow_control.resume()
    await settled(guard)
    await asyncio.gather(blocked, return_exceptions=True)

    assert blocked.cancelled()
    assert sorted(consumer.seeks, key=str) == sorted([{TP(TOPIC, 0): 5}, {TP(TOPIC, 1): 9}], key=str)


async def test_a_clear_while_flow_is_suspended_is_left_to_the_next_assignment() -> None:
    app, guard, consumer = guarded_app()
    queue = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    app.flow_control.resume()
    await queue.put(event_of(TOPIC, 0, 5))

    app.flow_control.suspend()  # a rebalance: Faust suspends, then clears
    app.flow_control.clear()
    await settled(guard)

    assert queue.empty() and consumer.seeks == []


async def test_the_wrap_is_installed_once() -> None:
    app, guard, consumer = guarded_app()
    watch_cleared_queues(app, guard.queues_cleared)
    queue = app.FlowControlQueue(maxsize=10, clear_on_resume=True)
    app.flow_control.resume()
    await queue.put(event_of(TOPIC, 0, 6))

    app.flow_control.resume()
    await settled(guard)

    assert consumer.seeks == [{TP(TOPIC, 0): 5}]


CHANGELOG = "app-keylane-state-changelog"


def changelog_event(partition: int, offset: int) -> Any:
    message = SimpleNamespace(
        topic=CHANGELOG, partition=partition, offset=offset, tp=TP(CHANGELOG, partition)
    )
    return SimpleNamespace(message=message)


async def test_a_resume_keeps_the_queued_records_of_standby_partitions_in_order() -> None:
    """Faust resumes the flow as a recovery ends, after its standby partitions started fetching:
    their queued records are unread, and nothing reads them again if the clear drops them."""
    app, guard, consumer = guarded_app()
    queue = app.tables.changelog_queue  # the table manager's own queue, as Faust makes it
    app.tables.recovery.standby_tps.add(TP(CHANGELOG, 1))
    app.flow_control.resume()
    for offset in range(3):
        await queue.put(changelog_event(1, offset))  # standby
        await queue.put(changelog_event(0, offset))  # active: recovered already, Faust's to drop

    app.flow_control.resume()  # on_recovery_completed, after its seek of the stream partitions
    await settled(guard)

    kept = [queue.get_nowait().message for _ in range(queue.qsize())]
    assert [(m.partition, m.offset) for m in kept] == [(1, 0), (1, 1), (1, 2)]
    assert consumer.seeks == []


async def test_a_reader_woken_by_a_put_gets_the_kept_record() -> None:
    app, _, _ = guarded_app()
    queue = app.tables.changelog_queue
    app.tables.recovery.standby_tps.add(TP(CHANGELOG, 0))
    app.flow_control.resume()
    reader = asyncio.ensure_future(queue.get())  # Faust's recovery waits on the empty queue
    await asyncio.sleep(0)
    await queue.put(changelog_event(0, 8))  # wakes the reader, which has not run yet

    app.flow_control.resume()

    assert (await asyncio.wait_for(reader, 1)).message.offset == 8


async def test_a_revocation_drops_the_standby_records_too() -> None:
    """The partitions' next assignment reads again from what their stores applied."""
    app, _, _ = guarded_app()
    queue = app.tables.changelog_queue
    app.tables.recovery.standby_tps.add(TP(CHANGELOG, 1))
    app.flow_control.resume()
    await queue.put(changelog_event(1, 0))

    app.flow_control.suspend()
    app.flow_control.clear()

    assert queue.empty()
