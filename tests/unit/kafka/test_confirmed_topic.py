"""A ConfirmedTopic hands a raw record straight to Faust's producer (service/keylane/kafka/
delivery.py): key, value, partition and headers as given, the callback only once Kafka
confirmed it, and the unit of work waits for it. Runs on a real Faust app, with the
producer recorded instead of reaching a broker."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import pytest

from keylane.catalog import OUTPUT, Catalog, load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.delivery import ProduceFailed, confirming, delivery_guard
from keylane.kafka.publish import raw_topic


class RecordingProducer:
    """Faust's producer as keylane uses it (its app, ``allow_headers`` and the aiokafka
    producer ``_ensure_producer`` gives), recording each aiokafka ``send`` as (topic, key,
    value, partition, timestamp_ms, headers)."""

    allow_headers = True

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.sent: list[tuple[Any, ...]] = []
        self.deliveries: list[asyncio.Future[Any]] = []

    def _ensure_producer(self) -> RecordingProducer:
        return self

    async def send(
        self,
        topic: str,
        value: Any,
        *,
        key: Any = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[Any]:
        self.sent.append((topic, key, value, partition, timestamp_ms, headers))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery


@pytest.fixture
def catalog() -> Catalog:
    return load_catalog(prefix="p.")


@pytest.fixture
def app(catalog: Catalog, tmp_path: Any) -> faust.App:
    return build_app(Settings.from_env({}, data_dir=tmp_path, app_id="confirmed"), catalog)


def recorded(topic: Any) -> RecordingProducer:
    producer = RecordingProducer(topic.app)

    async def get_producer() -> RecordingProducer:
        return producer

    topic._get_producer = get_producer
    return producer


async def test_the_record_reaches_the_producer_as_given(app: faust.App, catalog: Catalog) -> None:
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)
    headers = [("keylane.id", b"id-1")]
    await topic.send(key=b"k", value=b"v", partition=2, headers=headers)
    await topic.send(key=None, value=b"no key")
    assert producer.sent == [
        (catalog.name(OUTPUT), b"k", b"v", 2, None, headers),
        (catalog.name(OUTPUT), None, b"no key", None, None, None),
    ]


async def test_headers_and_timestamp_reach_aiokafka_as_faust_would_pass_them(
    app: faust.App, catalog: Catalog
) -> None:
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)
    produced: list[dict[str, Any]] = []
    app.on_produce_message.connect(lambda sender, **message: produced.append(message), weak=False)
    await topic.send(key=b"k", value=b"v", timestamp=1.5, headers={"keylane.id": b"id-1"})
    producer.allow_headers = False  # a broker older than 0.11 (Faust's api_version)
    await topic.send(key=b"k", value=b"w", headers=[("keylane.id", b"id-2")])
    name = catalog.name(OUTPUT)
    assert producer.sent == [
        (name, b"k", b"v", None, 1500, [("keylane.id", b"id-1")]),
        (name, b"k", b"w", None, None, None),
    ]
    # Faust's on_produce_message, with what Faust's own send passes it
    assert [(m["key"], m["value"], m["timestamp"], m["headers"]) for m in produced] == [
        (b"k", b"v", 1.5, {"keylane.id": b"id-1"}),
        (b"k", b"w", None, [("keylane.id", b"id-2")]),
    ]


async def test_the_callback_runs_once_kafka_confirmed_and_never_on_a_failure(
    app: faust.App, catalog: Catalog
) -> None:
    app.crash = lambda reason: asyncio.sleep(0)  # type: ignore[method-assign]
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)
    called: list[str] = []
    await topic.send(key=b"a", value=b"1", callback=lambda _: called.append("a"))
    await topic.send(key=b"b", value=b"2", callback=lambda _: called.append("b"))
    assert called == []
    producer.deliveries[0].set_result(None)
    producer.deliveries[1].set_exception(RuntimeError("NOT_ENOUGH_REPLICAS"))
    await asyncio.sleep(0)
    assert called == ["a"]


async def test_the_unit_of_work_waits_for_the_delivery(app: faust.App, catalog: Catalog) -> None:
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    app.crash = crash  # type: ignore[method-assign]
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)

    async def job() -> None:
        async with confirming(app):
            await topic.send(key=b"k", value=b"v")

    running = asyncio.ensure_future(job())
    await asyncio.sleep(0.05)
    assert not running.done()
    producer.deliveries[0].set_exception(RuntimeError("MESSAGE_TOO_LARGE"))
    with pytest.raises(ProduceFailed, match="MESSAGE_TOO_LARGE"):
        await asyncio.wait_for(running, 5)
    assert len(crashed) == 1


async def test_the_unit_of_work_waits_for_every_delivery_in_any_order(
    app: faust.App, catalog: Catalog
) -> None:
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)

    async def job() -> None:
        async with confirming(app):
            for key in (b"a", b"b", b"c"):
                await topic.send(key=key, value=b"v")

    running = asyncio.ensure_future(job())
    await asyncio.sleep(0.01)
    for index in (2, 0):
        producer.deliveries[index].set_result(None)
        await asyncio.sleep(0.01)
        assert not running.done()  # one record still unconfirmed
    producer.deliveries[1].set_result(None)
    await asyncio.wait_for(running, 5)


async def test_a_delivery_done_as_the_wait_begins_does_not_end_it_early(
    app: faust.App, catalog: Catalog
) -> None:
    """The unit's wait is woken by its records' own callbacks: one whose record was done
    before the wait began, its callback not run yet, must not end a wait for another."""
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)
    waiting = asyncio.Event()

    async def job() -> None:
        async with confirming(app):
            await topic.send(key=b"a", value=b"v")
            await topic.send(key=b"b", value=b"v")
            producer.deliveries[0].set_result(None)  # done now; its callback runs next turn
            waiting.set()

    running = asyncio.ensure_future(job())
    await waiting.wait()
    for _ in range(5):
        await asyncio.sleep(0)
    assert not running.done(), "the second record is not confirmed yet"
    producer.deliveries[1].set_result(None)
    await asyncio.wait_for(running, 5)


async def test_a_delivery_never_confirmed_fails_the_unit_after_the_confirm_timeout(
    app: faust.App, catalog: Catalog
) -> None:
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    app.crash = crash  # type: ignore[method-assign]
    delivery_guard(app)._confirm_timeout_s = 0.2
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)

    async def job() -> None:
        async with confirming(app):
            await topic.send(key=b"confirmed", value=b"v")
            await topic.send(key=b"lost", value=b"v")

    running = asyncio.ensure_future(job())
    await asyncio.sleep(0.01)
    producer.deliveries[0].set_result(None)
    with pytest.raises(ProduceFailed, match=r"key b'lost'.*not confirmed within"):
        await asyncio.wait_for(running, 5)
    assert len(crashed) == 1


async def test_a_codec_is_refused_not_ignored(app: faust.App, catalog: Catalog) -> None:
    topic = raw_topic(app, catalog.name(OUTPUT))
    producer = recorded(topic)
    with pytest.raises(TypeError, match="sends raw bytes"):
        await topic.send(key=b"k", value=b"v", value_serializer="json")
    assert producer.sent == []
