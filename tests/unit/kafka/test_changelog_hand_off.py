"""Changelog records of a unit of work (service/keylane/kafka/delivery.py): handed to the
producer by the unit itself, before the next record it sends and before it waits; put into
Faust's producer buffer when the unit fails, and sent by the buffer outside any unit. A
changelog record Kafka refused fails its unit of work and crashes the app. All of it holds
for both ways a table's record is written: Faust's ``send_changelog`` (as ``table[key] =
value`` calls it) and keylane's ``changelog_writer`` (the agent's state writes).

Runs on a real Faust app and table, with the hand-offs to the producer (the changelog
topic's and the output topic's) and the producer buffer recorded instead of reaching a
broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.structs import RecordMetadata
from faust.types import TP

from keylane.catalog import OUTPUT, load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.delivery import (
    ProduceFailed,
    changelog_writer,
    confirm_handed_off,
    confirming,
    track_changelog,
)
from keylane.kafka.lane_feed import event_context
from keylane.kafka.publish import raw_topic

SOURCE = "p.agent.events"


class FaustProducer:
    """Faust's producer as keylane hands records to it: its app, ``allow_headers``, and the
    aiokafka producer ``_ensure_producer`` gives (here itself: a subclass defines ``send``)."""

    allow_headers = True

    def __init__(self, app: faust.App) -> None:
        self.app = app

    def _ensure_producer(self) -> Any:
        return self


class Handoffs:
    """What reached the producer (``published``, in order) and its buffer (``buffered``)."""

    def __init__(self, app: faust.App) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.messages: list[asyncio.Future[Any]] = []
        self.partitions: list[int | None] = []
        self.buffered: list[Any] = []
        app.producer.send_soon = self.buffered.append  # type: ignore[method-assign,assignment]

    def watch(self, topic: Any) -> None:
        """Records handed to ``topic``'s producer (a ConfirmedTopic's, or a changelog's)."""
        handoffs = self

        class Producer(FaustProducer):
            async def send(self, name: str, value: Any, *, partition: int | None, **rest: Any) -> Any:
                handoffs.published.append((name, value))
                handoffs.partitions.append(partition)
                delivery = asyncio.get_running_loop().create_future()
                handoffs.messages.append(delivery)
                return delivery

        producer = Producer(topic.app)

        async def get_producer() -> Any:
            return producer

        topic._get_producer = get_producer

    async def confirmed(self, running: asyncio.Future[None]) -> None:
        """Kafka confirms every record handed off, at offsets 100, 101, ...; ``running`` ends."""
        for offset, (fut, (name, _), partition) in enumerate(
            zip(self.messages, self.published, self.partitions, strict=True), start=100
        ):
            if not fut.done():
                tp = TP(name, partition if partition is not None else 0)
                fut.set_result(RecordMetadata(name, tp.partition, tp, offset, -1, 0, 0))
        await asyncio.wait_for(running, 5)


async def started(job: Callable[[], Awaitable[None]]) -> asyncio.Future[None]:
    """``job`` running, a few turns of the loop in: as far as its wait for Kafka."""
    running = asyncio.ensure_future(job())
    for _ in range(5):
        await asyncio.sleep(0)
    return running


@pytest.fixture
def app(tmp_path: Any) -> faust.App:
    return build_app(Settings.from_env({}, data_dir=tmp_path, app_id="hand-off"), load_catalog(prefix="p."))


@pytest.fixture
def table(app: faust.App) -> Any:
    table = app.Table("keylane-state", default=None, partitions=4, key_type=bytes, value_type=bytes)
    track_changelog(table)
    return table


@pytest.fixture
def handoffs(app: faust.App, table: Any) -> Handoffs:
    """The hand-offs of ``app``, with the table's changelog watched."""
    handoffs = Handoffs(app)
    handoffs.watch(table.changelog_topic)
    return handoffs


Write = Callable[[Any, bytes], None]


class EventOn3:
    """What the table reads of Faust's current event: its message's partition and topic."""

    message = SimpleNamespace(partition=3, topic=SOURCE, offset=7, headers=None)


def by_send_changelog(table: Any, value: bytes) -> None:
    """What Faust's ``table[key] = value`` calls, for partition 3."""
    table.send_changelog(3, b"key", value, key_serializer="raw", value_serializer="raw")


def by_changelog_writer(table: Any, value: bytes) -> None:
    """keylane's writer of the table's changelog, in a job of an event on partition 3."""
    # Faust checks the source's partition count against the changelog's on the broker once
    # per topic: there is none here.
    table._verified_source_topics_for_partitions.add(SOURCE)
    with event_context(EventOn3()):
        changelog_writer(table)(b"key", value)


@pytest.fixture(params=[by_send_changelog, by_changelog_writer], ids=lambda writer: writer.__name__)
def write(request: pytest.FixtureRequest) -> Write:
    writer: Write = request.param
    return writer


async def test_the_state_leaves_before_the_records_that_follow_from_it(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:
    output = raw_topic(app, load_catalog(prefix="p.").name(OUTPUT))
    handoffs.watch(output)

    async def job() -> None:
        async with confirming(app):
            write(table, b"state")
            assert handoffs.published == [], "a write alone does not publish: the job may write again"
            await output.send(key=b"key", value=b"output")

    running = await started(job)
    changelog = table.changelog_topic.get_topic_name()
    assert handoffs.published == [(changelog, b"state"), ("p.agent.output", b"output")]
    assert handoffs.buffered == [], "not through Faust's producer buffer"
    assert not running.done(), "the job waits for both confirmations"
    await handoffs.confirmed(running)


async def test_a_job_that_only_writes_state_hands_it_off_before_it_waits(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:

    async def job() -> None:
        async with confirming(app):
            write(table, b"one")
            write(table, b"two")

    running = await started(job)
    assert [value for _, value in handoffs.published] == [b"one", b"two"], "in the order written"
    await handoffs.confirmed(running)
    changelog = TP(table.changelog_topic.get_topic_name(), 3)
    assert table.data.persisted_offset(changelog) == 101, "the table's callback keeps the offset"


async def test_the_effectors_flush_hands_off_the_state_first(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:

    async def job() -> None:
        async with confirming(app):
            write(table, b"claim")
            await confirm_handed_off()

    running = await started(job)
    assert handoffs.published == [(table.changelog_topic.get_topic_name(), b"claim")]
    assert not running.done()
    await handoffs.confirmed(running)


async def test_a_failed_job_leaves_its_state_to_the_producer_buffer(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:
    """The table holds the write already: its changelog record must still go out."""

    async def job() -> None:
        async with confirming(app):
            write(table, b"state")
            raise RuntimeError("the agent's bug")

    with pytest.raises(RuntimeError):
        await job()
    assert handoffs.published == []
    assert [fut.message.value for fut in handoffs.buffered] == [b"state"]


async def test_a_cancelled_job_leaves_its_state_to_the_producer_buffer(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:
    blocked = asyncio.Event()

    async def job() -> None:
        async with confirming(app):
            write(table, b"state")
            await blocked.wait()

    running = asyncio.ensure_future(job())
    await asyncio.sleep(0)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert [fut.message.value for fut in handoffs.buffered] == [b"state"]


async def test_outside_a_unit_of_work_the_producer_buffer_sends_it(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:
    write(table, b"healed")
    assert [fut.message.value for fut in handoffs.buffered] == [b"healed"]


async def test_a_refused_changelog_record_fails_its_unit_of_work(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    app.crash = crash  # type: ignore[method-assign]

    async def job() -> None:
        async with confirming(app):
            write(table, b"state")

    running = await started(job)
    handoffs.messages[0].set_exception(RuntimeError("NOT_ENOUGH_REPLICAS"))
    with pytest.raises(ProduceFailed, match="changelog record of table keylane-state"):
        await asyncio.wait_for(running, 5)
    assert len(crashed) == 1


async def test_a_changelog_record_the_producer_refuses_to_take_fails_its_unit_of_work(
    app: faust.App, table: Any, handoffs: Handoffs, write: Write
) -> None:
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    app.crash = crash  # type: ignore[method-assign]

    class ClosedProducer(FaustProducer):
        async def send(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the producer is closed")

    async def get_producer() -> Any:
        return ClosedProducer(app)

    table.changelog_topic._get_producer = get_producer

    async def job() -> None:
        async with confirming(app):
            write(table, b"state")

    with pytest.raises(RuntimeError, match="the producer is closed"):
        await asyncio.wait_for(job(), 5)
    await asyncio.sleep(0)
    assert len(crashed) == 1 and isinstance(crashed[0], ProduceFailed)
