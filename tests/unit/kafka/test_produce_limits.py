"""Size limits and produce failures without a broker: the producer takes what the catalog
allows, a record too large for its topic becomes a dead letter that fits, and a record Kafka
refused stops its unit of work and the worker (service/keylane/kafka/delivery.py)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import faust
import pytest

from keylane.catalog import ERRORS, EVENTS, INTENTS, OUTPUT, Catalog, load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.delivery import (
    ProduceFailed,
    RecordTooLarge,
    confirming,
    delivery_guard,
    record_size,
)
from keylane.kafka.lane_feed import event_context
from keylane.kafka.publish import Publisher, raw_topic
from keylane.records import (
    RAW_PREFIX_BYTES,
    RECORD_TOO_LARGE,
    Emit,
    InputRecord,
    error_emit,
    position_of,
    too_large_emit,
)
from keylane.wire import ErrorRecord, decode

OLD_FAUST_DEFAULT = 1_000_000


@dataclass
class FakeMessage:
    topic: str
    partition: int
    offset: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)


class FakeEvent:
    def __init__(self, message: FakeMessage) -> None:
        self.message = message


@pytest.fixture
def catalog() -> Catalog:
    return load_catalog(prefix="p.")


@pytest.fixture
def app(catalog: Catalog, tmp_path: Any) -> faust.App:
    return build_app(Settings.from_env({}, data_dir=tmp_path, app_id="produce-limits"), catalog)


@pytest.fixture
def in_input() -> Iterator[FakeEvent]:
    """Run the test as a lane job of the record p.agent.events/2/41."""
    event = FakeEvent(FakeMessage("p.agent.events", 2, 41))
    with event_context(event):
        yield event


def test_the_producer_takes_every_record_the_catalog_allows(app: faust.App, catalog: Catalog) -> None:
    largest = max(spec.max_message_bytes for spec in catalog)
    assert largest > OLD_FAUST_DEFAULT, "the catalog allows records Faust's default would refuse"
    assert app.conf.producer_max_request_size == largest
    # A failure surfaces (and crashes the worker) within minutes, not Faust's 20.
    assert app.conf.producer_request_timeout <= 300


def test_each_topic_is_limited_by_its_own_max_message_bytes(app: faust.App, catalog: Catalog) -> None:
    Publisher(app, catalog)
    guard = delivery_guard(app)
    for spec in catalog:
        assert guard.limit(spec.name) == min(spec.max_message_bytes, app.conf.producer_max_request_size)
    assert guard.limit("not.in.the.catalog") == app.conf.producer_max_request_size


def test_record_size_is_an_upper_bound_of_key_value_and_headers() -> None:
    headers = [("keylane.id", b"x" * 36)]
    size = record_size(b"key", b"v" * 1000, headers)
    assert size >= 3 + 1000 + len("keylane.id") + 36 + 61  # the batch header alone is 61 bytes
    assert size < 3 + 1000 + 46 + 61 + 64


def test_an_output_too_large_for_its_topic_becomes_a_record_too_large_dead_letter(
    app: faust.App, catalog: Catalog, in_input: FakeEvent
) -> None:
    publisher = Publisher(app, catalog)
    value = bytes(range(256)) * (3 * 1024 * 1024 // 256)
    output = Emit(record_id="out-1", topic=OUTPUT, key=b"k#0", value=value)

    letter = publisher.producible(output)

    limit = catalog[OUTPUT].max_message_bytes
    assert letter.topic == ERRORS and letter.error_reason == RECORD_TOO_LARGE
    assert record_size(letter.key, letter.value) < 64 * 1024, "the dead letter is small"
    error = decode(letter.value, ErrorRecord)
    assert error.reason == RECORD_TOO_LARGE and error.entity_key == "k#0"
    assert error.origin is not None
    assert (error.origin.topic, error.origin.partition, error.origin.offset) == ("p.agent.events", 2, 41)
    assert error.record_bytes is not None and error.record_bytes > len(value)
    assert error.limit_bytes == limit
    assert error.raw_value_b64 is None and error.raw_value_digest is not None
    assert error.raw_value_digest.size == len(value)
    assert error.raw_value_digest.sha256 == hashlib.sha256(value).hexdigest()
    assert base64.b64decode(error.raw_value_digest.prefix_b64) == value[:RAW_PREFIX_BYTES]
    assert publisher.producible(output).record_id == letter.record_id, "a redelivery: the same id"


def test_an_intent_too_large_names_its_intent_id(
    app: faust.App, catalog: Catalog, in_input: FakeEvent
) -> None:
    intent = Emit(record_id="intent-7", topic=INTENTS, key=b"k", value=b"i" * (3 * 1024 * 1024))
    error = decode(Publisher(app, catalog).producible(intent).value, ErrorRecord)
    assert error.reason == RECORD_TOO_LARGE and error.intent_id == "intent-7"


def _malformed(size: int) -> Emit:
    record = InputRecord(
        topic=EVENTS, broker_topic="p.agent.events", partition=1, offset=9, key=b"bad", value=b"\xff" * size
    )
    return error_emit(record, "malformed_record", "not a valid AgentEnvelope", now_ms=5)


def test_an_error_record_of_a_760kb_input_is_produced_whole(app: faust.App, catalog: Catalog) -> None:
    emit = _malformed(760_000)
    assert record_size(emit.key, emit.value) > OLD_FAUST_DEFAULT, "Faust's default producer refused it"
    assert Publisher(app, catalog).producible(emit) is emit


def test_an_error_record_too_large_keeps_its_id_and_reason_and_digests_its_raw_bytes(
    app: faust.App, catalog: Catalog
) -> None:
    emit = _malformed(1_700_000)
    shrunk = Publisher(app, catalog).producible(emit)

    assert (shrunk.record_id, shrunk.topic) == (emit.record_id, ERRORS)
    assert shrunk.error_reason == "malformed_record"
    assert record_size(shrunk.key, shrunk.value) < 64 * 1024
    error = decode(shrunk.value, ErrorRecord)
    assert error.reason == "malformed_record" and error.detail == "not a valid AgentEnvelope"
    assert error.origin is not None and (error.origin.partition, error.origin.offset) == (1, 9)
    assert error.raw_key_b64 == base64.b64encode(b"bad").decode(), "a small key is kept whole"
    assert error.raw_value_b64 is None and error.raw_value_digest is not None
    assert error.raw_value_digest.sha256 == hashlib.sha256(b"\xff" * 1_700_000).hexdigest()
    assert error.raw_value_digest.size == 1_700_000
    assert error.record_bytes == record_size(emit.key, emit.value, [("keylane.id", emit.record_id.encode())])


def test_a_copy_too_large_becomes_a_dead_letter_of_the_copy() -> None:
    letter = too_large_emit(
        topic=EVENTS,
        record_id=None,
        key=b"k" * 10_000,
        value=b"v" * 10,
        size=3_000_000,
        limit=2_097_152,
        origin=("agent.events", 0, 3),
        now_ms=1,
    )
    error = decode(letter.value, ErrorRecord)
    assert error.reason == RECORD_TOO_LARGE and error.intent_id is None
    assert error.raw_key_b64 is None and error.raw_key_digest is not None, "a huge key is digested"
    assert len(letter.key) == 64, "and the dead letter is keyed by its sha256"


async def test_a_topic_refuses_a_record_over_its_limit_before_the_hand_off(
    app: faust.App, catalog: Catalog
) -> None:
    Publisher(app, catalog)
    topic = raw_topic(app, catalog.name(EVENTS))
    with pytest.raises(RecordTooLarge) as refused:
        await topic.send(key=b"k", value=b"x" * catalog[EVENTS].max_message_bytes)
    assert refused.value.limit == catalog[EVENTS].max_message_bytes
    assert refused.value.size > refused.value.limit


def test_position_of_a_copy_is_its_origin() -> None:
    copy = FakeMessage("agent.events.sharded", 0, 5, [("keylane.origin", b"agent.events/3/17")])
    assert position_of(copy) == ("agent.events", 3, 17)


async def test_a_unit_of_work_ends_only_once_kafka_confirmed_what_it_produced(app: faust.App) -> None:
    guard = delivery_guard(app)
    delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def work() -> None:
        async with confirming(app):
            guard.track("a record", delivery)

    job = asyncio.ensure_future(work())
    await asyncio.sleep(0.05)
    assert not job.done(), "the job waits for the confirmation"
    delivery.set_result(None)
    await asyncio.wait_for(job, 5)
    assert guard.failure is None


async def test_a_refused_record_fails_its_unit_of_work_and_crashes_the_app_once(
    app: faust.App, catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    Publisher(app, catalog)
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    app.crash = crash  # type: ignore[method-assign]
    guard = delivery_guard(app)
    first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    second: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def work() -> None:
        async with confirming(app):
            guard.track("an agent.output record", first)
            guard.track("another record", second)

    job = asyncio.ensure_future(work())
    await asyncio.sleep(0)
    with caplog.at_level(logging.DEBUG, logger="keylane.kafka.delivery"):
        first.set_exception(RuntimeError("MESSAGE_TOO_LARGE"))
        second.set_exception(RuntimeError("MESSAGE_TOO_LARGE"))
        with pytest.raises(ProduceFailed, match=r"an agent\.output record was not produced"):
            await asyncio.wait_for(job, 5)
        await asyncio.sleep(0)

    assert len(crashed) == 1 and isinstance(crashed[0], ProduceFailed)
    critical = [r for r in caplog.records if r.levelno >= logging.CRITICAL]
    assert len(critical) == 1, "one clear line, however many records failed"
    assert "MESSAGE_TOO_LARGE" in critical[0].getMessage()
    with pytest.raises(ProduceFailed):  # no record is handed over any more, not even a dead letter
        await raw_topic(app, catalog.name(ERRORS)).send(key=b"k", value=b"dead letter")
