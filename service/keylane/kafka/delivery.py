"""Delivery: no input counts as finished before Kafka confirmed every record it produced.

Faust hands a record to its producer and forgets it: a send that fails after the hand-off
(the broker refuses the record, the topic is gone, not enough in-sync replicas until the
producer's request timeout) is logged as a warning, the delivery callback never fires, and
the consumer commits the input's offset anyway, since its commit only flushes the producer.
keylane closes that hole with one rule, kept simple on purpose:

* **A unit of work confirms what it produced before it ends.** A lane job (one input
  record) runs inside ``confirming(app)``; every record it hands to the producer through a
  ``ConfirmedTopic`` (outputs, intents, errors, results, re-routed and sharded copies) and
  every changelog record of a table passed to ``track_changelog`` (its state writes) is
  collected, and the block ends only when Kafka has confirmed them all. The lane acks a
  record, and the offset ledger may commit its offset, only after its job ended, so an
  offset is never committed past a record whose produce is unconfirmed. Waiting costs a
  record's lane one produce round trip; other keys and partitions keep going meanwhile,
  and nothing else changes in how offsets are committed.
* **A failure is final, and crashes the worker.** The producer already retries what can be
  retried (leader moves, NOT_ENOUGH_REPLICAS) until its request timeout (PRODUCE_TIMEOUT_S in
  service/keylane/kafka/app.py), so a failure that reaches keylane will not heal by itself. The first one
  logs one CRITICAL line naming the record and its input, and crashes the app, which exits
  non-zero; the failed job raises ``ProduceFailed``, so its record is neither acked nor
  committed, and from then on every hand-off is refused, so no dead letter can "finish" a
  record whose real output was lost. The restarted worker resumes from the last committed
  offset and produces the records again (their ids are deterministic; the key's outbox makes
  the re-run a redelivery).
* **A record too large to produce is refused before the hand-off** (``RecordTooLarge``), by
  the same size estimate the producer uses (key, value, headers and batch overhead) against
  min(the producer's max request size, the topic's max.message.bytes in the catalog). The
  Publisher turns such a record into a dead letter that fits (service/keylane/records.py).

Changelog records of Faust tables do not go through a ConfirmedTopic: ``track_changelog``
makes the table's ``send_changelog`` (a public Table method) hand its future to the running
unit of work as well, so a state write that Kafka refused stops its input from being
committed and crashes the worker. Inside a unit of work the record skips Faust's producer
buffer: it is handed to the producer by the unit itself, before the next record it hands
off and before it waits. Through the buffer it reached the producer only when the buffer's
task next ran, usually after the job's outputs had left in a produce request of their own,
and the job waited one more round trip for it (aiokafka keeps one request in flight per
broker). A unit left by an exception puts what it did not hand off into the buffer, as
Faust would have, so a state the table holds always reaches its changelog. Outside a unit
of work (a fence's heal) the buffer sends it. A changelog send that never resolves is
caught by the confirmation timeout. The agent's state table writes its records through
``changelog_writer``: the same records, queued the same way, without the FutureMessage
Faust's ``on_key_set`` makes of each (made only if the unit leaves it to the buffer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from functools import partial
from types import TracebackType
from typing import Any, cast

import faust
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from faust.types import CodecArg, HeadersArg, RecordMetadata, SchemaT
from faust.types.tuples import FutureMessage, MessageSentCallback

from keylane.errors import Fatal, KeylaneError
from keylane.records import position_of

log = logging.getLogger(__name__)

CONFIRM_MARGIN_S = 30.0
"""Waited beyond the producer's request timeout before an unconfirmed record counts as failed."""
_GUARD_ATTR = "_keylane_delivery_guard"


class ProduceFailed(Fatal):
    """Fatal: Kafka did not take a record keylane handed to the producer. The worker stops
    without committing the record's input and resumes from the last committed offset."""


class RecordTooLarge(KeylaneError):
    """Permanent: a record is over what its topic and keylane's producer take; it is refused
    before the hand-off, and becomes a dead letter (``record_too_large``) instead."""

    def __init__(self, *, topic: str, key: bytes | None, value: bytes | None, size: int, limit: int) -> None:
        super().__init__(f"a {topic} record of {size} bytes is over the {limit}-byte limit")
        self.topic = topic
        self.key = key
        self.value = value
        self.size = size
        self.limit = limit


def record_size(key: bytes | None, value: bytes | None, headers: HeadersArg = None) -> int:
    """An upper bound of the bytes one record takes in a produce request: key, value, headers
    and the record batch's overhead, as aiokafka's own max_request_size check estimates it."""
    items = list(headers.items()) if isinstance(headers, Mapping) else list(headers or [])
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, items)
    return size


class DeliveryGuard:
    """One app's delivery state: topic size limits, and the first produce failure."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.failure: ProduceFailed | None = None
        self.exit_after_s: float | None = None
        """Set by the process runner: after a produce failure the process exits (code 1)
        this long after the crash began, if Faust's own shutdown has not ended it first."""
        self.unconfirmed = 0
        """Records handed off (tracked) that Kafka has not confirmed or refused yet."""
        self._limits: dict[str, int] = {}
        self._crash: asyncio.Future[None] | None = None
        self._producer_max: int | None = None
        self._confirm_timeout_s: float | None = None

    def set_limits(self, limits: Iterable[tuple[str, int]]) -> None:
        """The max.message.bytes of topics by broker name (the catalog's, see Publisher)."""
        self._limits.update(limits)

    def limit(self, topic: str) -> int:
        """The most bytes a record for ``topic`` may take: min(producer max request size, the
        topic's max.message.bytes when known)."""
        producer_max = self._producer_max
        if producer_max is None:
            # Read once (as are the others below): the settings are fixed once the app runs,
            # and each read goes through Faust's settings registry, on every record.
            producer_max = self._producer_max = int(self.app.conf.producer_max_request_size)
        return min(producer_max, self._limits.get(topic, producer_max))

    @property
    def confirm_timeout_s(self) -> float:
        timeout_s = self._confirm_timeout_s
        if timeout_s is None:
            timeout_s = self._confirm_timeout_s = (
                float(self.app.conf.producer_request_timeout) + CONFIRM_MARGIN_S
            )
        return timeout_s

    def check(self) -> None:
        """Refuse new hand-offs once a produce failed: the worker is going down."""
        if self.failure is not None:
            raise ProduceFailed(f"not producing any more records: {self.failure}")

    def fail(self, what: object, exc: BaseException | None) -> ProduceFailed:
        """Record that ``what`` was not produced; the first failure logs the one CRITICAL line
        and crashes the app. Returns the error for the caller to raise."""
        if self.failure is not None:
            log.debug("also not produced: %s (%r)", what, exc)
            return ProduceFailed(f"{what} was not produced ({exc!r})")
        self.failure = ProduceFailed(
            f"{what} was not produced ({exc!r}); stopping the worker without committing that "
            "input: once restarted it resumes from the last committed offset. Check the broker "
            "and the topic (that it exists, its max.message.bytes, min.insync.replicas)"
        )
        log.critical("%s", self.failure)
        self._crash = asyncio.ensure_future(self.app.crash(self.failure))
        if self.exit_after_s is not None:
            # Faust's shutdown after a crash can wait on streams for good ("Wait for
            # streams..."); nothing is lost by cutting it short: the input is uncommitted.
            exit_code = 1
            watchdog = threading.Timer(self.exit_after_s, os._exit, args=(exit_code,))
            watchdog.daemon = True
            watchdog.start()
        return self.failure

    def track(
        self,
        what: object,
        delivery: asyncio.Future[Any],
        on_done: Callable[[asyncio.Future[Any], BaseException | None], None] | None = None,
    ) -> None:
        """Watch one handed-off record: ``on_done(delivery, error)`` runs once Kafka confirmed
        it (error None) or did not take it, a failure crashes the worker even if nobody waits
        for it, and the running unit of work (``confirming``) waits for it. One done callback
        does all three: each callback of a future is one more turn of the event loop, on
        every record."""
        self.unconfirmed += 1
        work = _work.get(None)
        if work is not None:
            work.pending.append((what, delivery))

        def settled(done: asyncio.Future[Any]) -> None:
            self.unconfirmed -= 1
            error = _error_of(done)
            if on_done is not None:
                try:
                    on_done(done, error)
                except Exception:  # a callback's bug must not stop the watch or the unit's wait
                    log.exception("the delivery callback of %s failed", what)
            if error is not None:
                self.fail(what, error)
            if work is not None:
                work.notify()

        delivery.add_done_callback(settled)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _error_of(delivery: asyncio.Future[Any]) -> BaseException | None:
    """Why a finished send failed, or None when Kafka took the record."""
    if delivery.cancelled():
        return asyncio.CancelledError("the send was cancelled")
    return delivery.exception()


class _Changelog:
    """A changelog record a unit of work has not handed to the producer yet: its table,
    partition, key and value, what it is (named by a failure), and the FutureMessage Faust's
    ``send_changelog`` returned for it, or None for a ``changelog_writer`` record, which
    nobody holds a future of."""

    __slots__ = ("key", "message", "partition", "table", "value", "what")

    def __init__(
        self,
        table: Any,
        partition: int | None,
        key: bytes,
        value: bytes,
        what: Sent,
        message: FutureMessage | None,
    ) -> None:
        self.table = table
        self.partition = partition
        self.key = key
        self.value = value
        self.what = what
        self.message = message

    def future_message(self) -> FutureMessage:
        """The record as Faust's producer buffer takes it (made now for a writer's record)."""
        if self.message is None:
            self.message = self.table.changelog_topic.as_future_message(
                key=self.key,
                value=self.value,
                partition=self.partition,
                callback=self.table._on_changelog_sent,  # read when made: RestoreStart wraps it
                eager_partitioning=True,
            )
        return self.message


class _Work:
    """One unit of work's records: handed off and awaiting confirmation (``pending``), and
    changelog records not yet handed to the producer (``unsent``)."""

    __slots__ = ("_waiter", "_waiting", "guard", "pending", "unsent")

    def __init__(self, guard: DeliveryGuard) -> None:
        self.guard = guard
        self.pending: list[tuple[object, asyncio.Future[Any]]] = []
        self.unsent: list[_Changelog] = []
        self._waiter: asyncio.Future[None] | None = None
        self._waiting: list[asyncio.Future[Any]] = []

    async def confirm(self, pending: list[tuple[object, asyncio.Future[Any]]]) -> None:
        """Wait until Kafka confirmed every record of ``pending`` (records this unit tracked);
        raise ProduceFailed for the first one it did not take (or did not confirm within the
        guard's ``confirm_timeout_s``)."""
        guard = self.guard
        unconfirmed = [delivery for _, delivery in pending if not delivery.done()]
        if unconfirmed:
            await self._settled(unconfirmed, guard.confirm_timeout_s)
        for what, delivery in pending:
            if not delivery.done():
                raise guard.fail(what, TimeoutError(f"not confirmed within {guard.confirm_timeout_s:.0f}s"))
            error = _error_of(delivery)
            if error is not None:
                raise guard.fail(what, error) from error

    async def _settled(self, deliveries: list[asyncio.Future[Any]], timeout_s: float) -> None:
        """Return once every one of ``deliveries`` is done, or after ``timeout_s``: their
        tracking callbacks wake it (``notify``)."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._waiting = deliveries
        timer = loop.call_later(timeout_s, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter, self._waiting = None, []

    def notify(self) -> None:
        """A record of this unit is done: wake ``_settled`` once all it waits for are. Checks
        them all rather than counting: a record already done when the wait began may run
        its callback after."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        for delivery in self._waiting:
            if not delivery.done():
                return
        waiter.set_result(None)

    async def hand_off_unsent(self) -> None:
        """Hand the unit's changelog records to the producer, in the order they were written,
        and track each (``_hand_off_changelog``)."""
        unsent = self.unsent
        while unsent:
            record = unsent.pop(0)
            try:
                delivery = await _hand_off_changelog(record)
            except Exception as exc:  # refused: as final as a failed delivery; crashes the worker
                refused = record.future_message()
                if not refused.done():
                    refused.set_exception(exc)
                self.guard.track(record.what, refused)
                raise
            if record.message is None:
                self.guard.track(record.what, delivery, partial(_changelog_sent, record.table))
            else:
                self.guard.track(record.what, delivery, partial(_changelog_done, record.message))

    def buffer_unsent(self, app: faust.App) -> None:
        """Leave the records not handed off to Faust's producer buffer (a unit left by an
        exception), tracked: the table already holds what they carry."""
        for record in self.unsent:
            message = record.future_message()
            app.producer.send_soon(message)
            self.guard.track(record.what, message)
        self.unsent.clear()


async def _hand_off_changelog(record: _Changelog) -> asyncio.Future[Any]:
    """A changelog record straight to the producer: what Faust's ``publish_message`` does
    for it, without the send sensors (no keylane sensor acts on them,
    service/keylane/kafka/sensors.py) and without a callback of its own on the delivery: the
    tracking callback resolves the FutureMessage, if any (``_changelog_done``), and runs the
    table's (``_changelog_sent``), where Faust's callback would take one more turn of the
    loop."""
    topic = record.table.changelog_topic
    producer = await topic._get_producer()
    message = record.message
    if message is None:
        name = topic.get_topic_name()
        return await _produce(producer, name, record.key, record.value, record.partition, None, None)
    pending = message.message
    return await _produce(
        producer,
        topic.get_topic_name(),
        pending.key,
        pending.value,
        pending.partition,
        pending.timestamp,
        pending.headers,
    )


async def _produce(
    producer: Any,
    topic: str,
    key: bytes | None,
    value: bytes | None,
    partition: int | None,
    timestamp: float | None,
    headers: HeadersArg,
) -> asyncio.Future[Any]:
    """What Faust's aiokafka ``Producer.send`` does with a non-transactional record, at a
    fraction of its cost: aiokafka's ``send`` of it, its headers and timestamp as Faust
    converts them. Faust's own wrapper checks the headers against ``typing.Mapping`` and casts
    its result to a subscripted generic on every call, which took a third of the time a send
    spent in Python (py-spy, ``make bench-profile``); the app's ``on_produce_message`` signal
    (used by Faust's livecheck only, never by keylane) is sent only when it has receivers."""
    signal = producer.app.on_produce_message
    if signal._receivers or signal._filter_receivers:
        signal.send(key=key, value=value, partition=partition, timestamp=timestamp, headers=headers)
    if headers is not None:
        if not producer.allow_headers:
            headers = None
        elif not isinstance(headers, list) and isinstance(headers, Mapping):  # an ABC's check is slow
            headers = list(headers.items())
    sent = await producer._ensure_producer().send(
        topic,
        value,
        key=key,
        partition=partition,
        timestamp_ms=int(timestamp * 1000.0) if timestamp else timestamp,
        headers=headers,
    )
    return cast("asyncio.Future[Any]", sent)


def _changelog_done(
    message: FutureMessage, delivery: asyncio.Future[Any], error: BaseException | None
) -> None:
    """Resolve a changelog record's FutureMessage from its delivery, then run its callback
    (the table's ``_on_changelog_sent``, which keeps the persisted offset), as Faust's
    ``Topic._on_published`` does."""
    if error is not None:
        if not message.done():
            message.set_exception(error)
        return
    message.set_result(delivery.result())
    callback = message.message.callback
    if callback is not None:
        callback(message)


def _changelog_sent(table: Any, delivery: asyncio.Future[Any], error: BaseException | None) -> None:
    """A ``changelog_writer`` record's callback: the table's ``_on_changelog_sent`` (read now:
    RestoreStart wraps it), given the delivery, whose result is what a FutureMessage's
    would be."""
    if error is None:
        table._on_changelog_sent(delivery)


_work: ContextVar[_Work | None] = ContextVar("keylane_deliveries")


def delivery_guard(app: faust.App) -> DeliveryGuard:
    """The app's DeliveryGuard, made on first use."""
    guard: DeliveryGuard | None = getattr(app, _GUARD_ATTR, None)
    if guard is None:
        guard = DeliveryGuard(app)
        setattr(app, _GUARD_ATTR, guard)
    return guard


def confirming(app: faust.App) -> _Confirming:
    """A unit of work: on a normal exit, wait until Kafka confirmed every record handed to the
    producer inside the block (raises ProduceFailed otherwise). A block left by an exception
    does not wait; what it produced is still watched, and a failure still crashes the worker."""
    return _Confirming(app)


class _Confirming:
    """``confirming``'s block. A class, not an ``asynccontextmanager``: every input record runs
    in one, and the generator's machinery cost more than what the block does around it."""

    __slots__ = ("_app", "_token", "_work")

    def __init__(self, app: faust.App) -> None:
        self._app = app

    async def __aenter__(self) -> None:
        self._work = _Work(delivery_guard(self._app))
        self._token = _work.set(self._work)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        work = self._work
        try:
            if exc_type is None:
                await work.hand_off_unsent()
                await work.confirm(work.pending)
        finally:
            work.buffer_unsent(self._app)
            _work.reset(self._token)


async def confirm_handed_off() -> None:
    """Inside ``confirming``: wait now for what the block produced so far (the effector
    makes its claim durable this way before it runs a tool)."""
    work = _work.get(None)
    if work is not None:
        await work.hand_off_unsent()
        handed_off = list(work.pending)
        work.pending.clear()
        await work.confirm(handed_off)


async def hand_off_changelog() -> None:
    """Inside ``confirming``: hand the unit's changelog records to the producer now, ahead of
    what it sends next."""
    work = _work.get(None)
    if work is not None and work.unsent:
        await work.hand_off_unsent()


class Sent:
    """What a handed-off record was, described only when a failure names it: most records
    are confirmed, and formatting each one's key and input would cost every record."""

    __slots__ = ("_args", "_describe", "_input")

    def __init__(self, describe: str, *args: Any) -> None:
        self._describe = describe
        self._args = args
        event = faust.current_event()  # the lane job's input, while its context is current
        self._input = None if event is None else event.message

    def __str__(self) -> str:
        text = self._describe.format(*self._args)
        if self._input is None:
            return text
        return "{} for input {}/{}/{}".format(text, *position_of(self._input))


class ConfirmedTopic(faust.Topic):
    """A Faust topic of raw records whose sends are size-checked, refused once the worker is
    failing, handed straight to the producer, and confirmed by the running unit of work (see
    the module docstring)."""

    async def send(
        self,
        *,
        key: Any = None,
        value: Any = None,
        partition: int | None = None,
        timestamp: float | None = None,
        headers: HeadersArg = None,
        schema: SchemaT | None = None,  # type: ignore[type-arg]
        key_serializer: CodecArg = None,
        value_serializer: CodecArg = None,
        callback: MessageSentCallback | None = None,
        force: bool = False,
    ) -> Awaitable[RecordMetadata]:
        return await self.send_sized(
            record_size(key, value, headers),
            key=key,
            value=value,
            partition=partition,
            timestamp=timestamp,
            headers=headers,
            schema=schema,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            callback=callback,
        )

    async def send_sized(self, size: int, **send: Any) -> Awaitable[RecordMetadata]:
        """``send`` for a caller that already measured the record (``record_size``): the
        Publisher does, to choose between the record and its dead letter."""
        guard = delivery_guard(self.app)  # type: ignore[arg-type]  # AppT is the App Protocol
        guard.check()
        name = self.get_topic_name()
        limit = guard.limit(name)
        key, value = send.get("key"), send.get("value")
        if size > limit:
            raise RecordTooLarge(topic=name, key=key, value=value, size=size, limit=limit)
        if any(send.get(codec) is not None for codec in ("schema", "key_serializer", "value_serializer")):
            raise TypeError(f"{name}: a ConfirmedTopic sends raw bytes; encode the record before sending it")
        what = Sent("a {} record (key {!r:.80}, {} bytes)", name, key, size)
        await hand_off_changelog()  # the state this record follows from leaves first
        try:
            delivery = await self._hand_off(name, **send)
        except Exception as exc:  # a refused hand-off is as final as a failed delivery
            raise guard.fail(what, exc) from exc
        callback = send.get("callback")
        guard.track(what, delivery, None if callback is None else partial(_confirmed, callback))
        return delivery

    async def _hand_off(
        self,
        name: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        partition: int | None = None,
        timestamp: float | None = None,
        headers: HeadersArg = None,
        **_: Any,  # the codec arguments, None: send_sized checked; the callback: track's
    ) -> asyncio.Future[Any]:
        """The record straight to Faust's producer (aiokafka's send), without the
        FutureMessage, sensors and callback chain of ``Topic.send``, which cost more than
        the send itself: the topic's codecs pass bytes through, and the delivery is tracked
        here anyway (``send``'s ``callback`` gets the delivery once Kafka confirmed it, as
        Faust's would: ``DeliveryGuard.track``). Never a Faust "attachment" either: those
        wait for the commit that waits for us."""
        producer = await self._get_producer()
        return await _produce(producer, name, key, value, partition, timestamp, headers)


def _confirmed(
    callback: MessageSentCallback, delivery: asyncio.Future[Any], error: BaseException | None
) -> None:
    if error is None:
        callback(delivery)  # type: ignore[arg-type]  # Faust passes its FutureMessage; ours ignore it


_CHANGELOG_RECORD = "a changelog record of table {} (partition {}, {} bytes)"


def track_changelog(table: Any) -> None:
    """Make ``table``'s changelog records count as produced records of the running unit of
    work, handed to the producer by the unit itself (see the module docstring). Wraps the
    instance's public ``send_changelog``."""
    guard = delivery_guard(table.app)
    send_changelog = table.send_changelog

    def send_tracked(
        partition: int | None,
        key: Any,
        value: Any,
        key_serializer: CodecArg = None,
        value_serializer: CodecArg = None,
    ) -> FutureMessage:
        size = len(value) if isinstance(value, bytes) else 0
        what = Sent(_CHANGELOG_RECORD, table.name, partition, size)
        work = _work.get(None)
        if work is None:
            future: FutureMessage = send_changelog(
                partition, key, value, key_serializer=key_serializer, value_serializer=value_serializer
            )
            guard.track(what, future)
        else:  # Faust's send_changelog without its buffer: the unit hands it off, and tracks it
            future = table.changelog_topic.as_future_message(
                key=key,
                value=value,
                partition=partition,
                key_serializer=table.key_serializer if key_serializer is None else key_serializer,
                value_serializer=table.value_serializer if value_serializer is None else value_serializer,
                callback=table._on_changelog_sent,  # read per call: RestoreStart wraps it
                eager_partitioning=True,
            )
            work.unsent.append(_Changelog(table, future.message.partition, key, value, what, future))
        return future

    table.send_changelog = send_tracked


def changelog_writer(table: Any) -> Callable[[bytes, bytes], None]:
    """What ``table.on_key_set(key, value)`` does for a table of raw bytes, at less cost
    inside a unit of work: the record, in the current event's partition, joins the unit's
    changelog records as ``track_changelog``'s do, without the FutureMessage that Faust's
    ``on_key_set`` makes of it only to read its partition (its making was most of the cost of a
    state write's send). Outside a unit of work, and for a table that expires keys (whose
    key set does more), it is ``on_key_set``."""
    on_key_set: Callable[[bytes, bytes], None] = table.on_key_set
    if table._should_expire_keys():
        return on_key_set
    partition_for_key = table.partition_for_key
    sensor_on_set = table._sensor_on_set

    def write(key: bytes, value: bytes) -> None:
        work = _work.get(None)
        if work is not None:
            partition = partition_for_key(key)
            if partition is not None:  # None: the producer partitions (not the event's partition)
                what = Sent(_CHANGELOG_RECORD, table.name, partition, len(value))
                work.unsent.append(_Changelog(table, partition, key, value, what, None))
                sensor_on_set(table, key, value)
                return
        on_key_set(key, value)

    return write
