"""Every place keylane patches or wraps Faust and aiokafka internals, each with its reason.

Patched here, on the class, once per process (``wrap_faust_consumer``, installed by the first
``guard_offsets`` call; apps that never call it keep Faust's behaviour), all for the offset
guard (service/keylane/kafka/offset_guard.py), which puts keylane's OffsetLedger in charge of
an app's input topics:

* ``ThreadDelegateConsumer.seek_to_committed``: keep what the group coordinator answered for
  the assignment, for the guard to position the partitions from. The aiokafka driver's
  consumer takes this method from ThreadDelegateConsumer, which overrides the base class's:
  wrapping the base one never ran.
* ``Consumer.perform_seek``: after Faust's seek to committed, the guard seeks every governed
  partition to its committed offset (or the log start) and tells the ledger, and each
  changelog partition a table restore still reads is sought back to the offset the restore
  applied (service/keylane/kafka/restore_watch.py): Faust seeks back after a dropped batch,
  but only the partitions with a committed offset.
* ``Consumer.on_partitions_revoked``: Faust drops the revoked partitions' acks before it
  waits for their records and never commits them; the lanes settle their records while
  Faust waits, and the guard commits the ledger's marks before the partitions go.
* ``Consumer._new_offset``: the consumer commits the ledger's marks instead of Faust's acks
  for governed topics.
* ``Consumer._drain_messages``: Faust's fetch loop drops every record below its
  ``_read_offset``, which it advances for each record it fetches, ahead of processing: after
  the ledger seeks a partition back (a gap, a resumed pause), a record of an earlier fetch
  batch moved it past the re-read and the re-read was dropped, stalling the partition for
  good. For governed topics the loop sees no read offset (``_UnfilteredReadOffsets``); the
  ledger drops duplicates itself. The same holds for the app's table changelogs: a worker
  that stood still past its session timeout fetches its standby partitions' new records as
  it resumes, the rebalance throws them away queued, and the restore that seeks back
  (service/keylane/kafka/restore_start.py) had its re-read dropped, so the standby store
  missed those records while its offset said it had them, and the worker that took the
  partition over ran its keys on state that went back (found by the pause chaos with paged
  memory). Faust's recovery drops what it has applied already by its own offsets.

Patched on the class (or the module), once per process, by ``publish_without_stampede``,
``deliver_without_tasks``, ``start_tables_at_once`` and ``feed_in_runs`` (installed by
``build_app``, for every keylane app):

* ``Topic._get_producer``: Faust asks for its producer on every publish through mode's
  ``stampede`` wrapper, which awaits ``asyncio.sleep(0)`` three times per call even when the
  producer runs already. Each send thus waited for three turns of a busy event loop, and
  Faust's producer buffer, which sends the table changelog records one at a time, fell
  behind: a paged state write (a page and a record) waited 8 ms in it on the 512 KiB state
  benchmark, where one record waited 0.6 ms. Once the producer has started, the patch
  returns it directly; before that, and inside a Faust transaction (keylane runs none), the
  stampede-protected start is Faust's own.

* ``Consumer.wait_first``: Faust's fetch loop hands each record to the conductor through
  ``wait_first(deliver(record), suspend_flow.wait())``, which makes four tasks per record (the
  delivery, and waits on the suspend, stopped and crashed events), races them with
  asyncio.wait, then cancels three. That came to a third of the event loop's callbacks per
  record on the e2e benchmark's worker. The conductor's delivery puts the record in its
  stream's queue and almost always ends at its first step. So the patch runs that first step
  at once when none of the three events is set: a delivery that ends there needs no task
  and no race. A delivery that waits (a full queue) goes on as a task, raced against the
  same events by Faust's own wait_first, as before. Any other wait_first call is Faust's.

* ``TableManager.on_start``: Faust's table manager sleeps a second before it closes the list
  of tables and starts their recovery, leaving time for tables defined as the app starts.
  keylane defines every table before its app starts (a table added later fails loudly:
  Faust refuses it once the list is closed), so the patch starts at once. The second was
  part of every worker's and effector's start, and of the time a restarted worker took to
  be ready again.

* ``sleep`` of Faust's compiled stream iterator (``faust._cython.streams``, the one Faust
  iterates streams with when it is built, as the wheels are): the iterator awaits
  ``asyncio.sleep(0)`` before every record, so a stream hands over one record per turn of the
  event loop. keylane's streams feed lanes (service/keylane/kafka/lane_feed.py), where a
  record only joins its key's queue; at one record per turn, the feed moved at the pace of
  the lanes' work, and the records in Faust's queue waited behind each other: a key whose
  next records sat behind a few hundred of other keys' ran dry meanwhile (on the state
  growth benchmark, two partitions' keys stood still 0.3 s of each 1 s repetition, with all
  their records fetched). ``feed_in_runs`` makes that ``sleep(0)`` a turn of the loop every
  STREAM_RUN records, and no wait in between; any other ``sleep`` call is asyncio's.

Wrapped per app instance (``watch_cleared_queues``, installed by ``guard_offsets``):

* ``app.flow_control.clear`` (mode's FlowControlEvent, which ``resume`` calls too): it empties
  every stream and channel queue and cancels the puts waiting on a full one. Faust resumes
  flow after its seek to committed when a recovery ends, so records fetched from the
  guard's new position in between were thrown away, the consumer's position having passed
  them, and their partition waited for the stall check (seen on a busy machine as a 15 s
  stall of the first record after a restart). The wrap reads the queued events'
  topic-partitions (``asyncio.Queue._queue`` and ``_putters``) before the clear, and tells
  the guard which governed partitions lost records. A clear that resumes the flow puts the
  table changelog queue's records of the recovery's standby partitions back
  (``reading_standbys``): Faust resumes the flow as a recovery ends, after its standby
  partitions started fetching, and their records dropped there were never read again, so a
  standby store lacked them while its offset passed them; the worker that took such a
  partition over ran its keys on state that went back, and on records naming memory pages
  its store did not hold (found by the pause chaos with paged memory).

Each patched attribute is checked to exist on its class when this module is imported
(``check_patchable``: a faust-streaming outside ``FAUST_PIN`` fails with its version named),
and each wrap is checked, when installed, to be what the aiokafka driver's consumer class
really runs (a method a subclass overrides is never reached).

Faust and aiokafka internals keylane reaches without patching them:

* Faust's private ``faust.streams._current_event`` context variable, set per lane job
  (``event_context`` in service/keylane/kafka/lane_feed.py): Faust tables choose the RocksDB
  and changelog partition of a read or write from the current event, which Faust sets only
  inside its own stream iteration, and lane tasks run outside it.
* The wraps above read and reset the Consumer's ``_read_offset``, ``_acked``,
  ``_acked_index`` and ``_committed_offset`` (which the consumer lag gauges read after each
  commit too, ``OffsetGuard.on_commit``); ``OffsetGuard.commit_revoked`` commits through
  the consumer thread's aiokafka consumer (``_thread._ensure_consumer()``, ``thread_loop``),
  because the consumer's method queue may be held by a fetch waiting for the rebalance.
* The Consumer's ``flow_active`` (``OffsetGuard.reread_stalled``): whether Faust delivers
  fetched records now; while it does not, a partition with records waiting is not stalled.
* The consumer thread's aiokafka consumer's group coordinator (service/keylane/kafka/epochs.py):
  its ``generation`` is the owner epoch lane jobs start under, and ``request_rejoin`` (run on
  the consumer thread's loop) makes a worker that stood still past its session timeout rejoin
  at once. Faust's store's ``_db_for_partition`` lets a changelog restore compare a record's
  epoch with the stored one.
* The RocksDB store's ``_db_for_partition`` (and its own ``_get`` and ``_set``, for a read
  without an event and for tables that are global or use the producer's partitioner), and
  the table's ``on_key_set`` (``stored_bytes`` and ``stored_bytes_writer`` in
  service/keylane/kafka/app.py): the state table's reads and writes without the raw codec's
  pass-through calls or the store's key index. Inside a unit of work the changelog record
  ``on_key_set`` would send is queued by ``changelog_writer`` (service/keylane/kafka/delivery.py)
  from the table's ``partition_for_key``, ``_sensor_on_set``, ``_should_expire_keys``,
  ``changelog_topic`` and ``_on_changelog_sent``.
  ``RocksDBStore`` (service/keylane/kafka/rocksdb_store.py) subclasses Faust's RocksDB store,
  overriding its persisted-offset methods, ``revoke_partitions`` and ``stop``; the app's
  Table class picks it in ``_new_store_by_url``.
* ``app.tables.recovery.completed`` (``recovery_completed`` in service/keylane/kafka/app.py):
  the TableManager's recovery, which its Protocol does not declare; its ``standby_tps``, the
  TableManager's ``_changelog_queue`` and the queue's ``asyncio.Queue`` internals
  (``_queue``) for the wrap that keeps the records of ``reading_standbys``.
* ``AIOKafkaAdminClient._client`` (service/keylane/kafka/topic_admin.py): the public admin
  API asks one broker for metadata; keylane asks each.

Public API keylane overrides, listed for completeness (not patches): ``Table.send_changelog``
is wrapped per table instance by ``track_changelog`` (service/keylane/kafka/delivery.py);
``Table.apply_changelog_batch`` is wrapped per table instance by ``EpochFence``
(service/keylane/kafka/epochs.py); ``ConfirmedTopic`` overrides ``Topic.send`` (delivery.py);
the app's Table class overrides
``__init__`` and ``on_start`` (service/keylane/kafka/app.py).
"""

from __future__ import annotations

import asyncio
import importlib
from collections import defaultdict
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import faust
import faust.streams as faust_streams
from faust.tables.manager import TableManager
from faust.topics import Topic as FaustTopic
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.consumer import ThreadDelegateConsumer, ensure_TP
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaDriverConsumer
from mode.services import WaitResults

from keylane.errors import ConfigError
from keylane.kafka.restore_watch import restore_positions_after_seek

if TYPE_CHECKING:
    from keylane.kafka.offset_guard import OffsetGuard

FAUST_PIN = ">=0.15.2,<0.16"
"""The faust-streaming range these patches are written for (pyproject.toml pins the same)."""

PATCHED: tuple[tuple[type, str], ...] = (
    (ThreadDelegateConsumer, "seek_to_committed"),
    (FaustConsumer, "perform_seek"),
    (FaustConsumer, "on_partitions_revoked"),
    (FaustConsumer, "_new_offset"),
    (FaustConsumer, "_drain_messages"),
    (FaustTopic, "_get_producer"),
    (FaustConsumer, "wait_first"),
    (TableManager, "on_start"),
)
"""(class, attribute) of every patch ``wrap_faust_consumer``, ``publish_without_stampede``,
``deliver_without_tasks`` and ``start_tables_at_once`` install."""


def check_patchable(targets: Iterable[tuple[type, str]]) -> None:
    """Raise ConfigError, naming the installed faust-streaming and the pinned range, when an
    attribute keylane patches is missing from its class (a Faust release renamed it)."""
    missing = [
        f"{cls.__module__}.{cls.__qualname__}.{name}" for cls, name in targets if not hasattr(cls, name)
    ]
    if missing:
        raise ConfigError(
            f"keylane patches {', '.join(missing)}, which faust-streaming {faust.__version__} does "
            f"not have; install faust-streaming{FAUST_PIN} (the range pyproject.toml pins)"
        )


check_patchable(PATCHED)


class _UnfilteredReadOffsets(defaultdict[Any, int | None]):
    """Faust's read offsets, reading as None for governed topics and table changelogs so its
    fetch loop drops nothing there (see the module docstring); writes and other topics are
    Faust's as before."""

    def __init__(self, guard: OffsetGuard | None, tables: Any, offsets: Mapping[Any, int | None]) -> None:
        super().__init__(lambda: None, offsets)
        self._guard = guard
        self._tables = tables

    def __getitem__(self, tp: Any) -> int | None:
        governed = self._guard is not None and self._guard.governs(tp.topic)
        if governed or tp.topic in self._tables.changelog_topics:
            return None
        return super().__getitem__(tp)


_wrapped = False
_publishing_patched = False
_delivery_patched = False
_tables_patched = False
_streams_patched = False


def publish_without_stampede() -> None:
    """Install the ``Topic._get_producer`` patch of the module docstring, once per process."""
    global _publishing_patched
    if _publishing_patched:
        return
    _publishing_patched = True
    get_producer = FaustTopic._get_producer

    async def running_producer(self: Any) -> Any:
        app = self.app
        producer = app.producer
        if producer.started and not app.in_transaction:
            return producer
        return await get_producer(self)

    FaustTopic._get_producer = running_producer  # type: ignore[method-assign]


def start_tables_at_once() -> None:
    """Install the ``TableManager.on_start`` patch of the module docstring, once per process."""
    global _tables_patched
    if _tables_patched:
        return
    _tables_patched = True

    async def start_at_once(self: Any) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    TableManager.on_start = start_at_once  # type: ignore[method-assign]


def deliver_without_tasks() -> None:
    """Install the ``Consumer.wait_first`` patch of the module docstring, once per process."""
    global _delivery_patched
    if _delivery_patched:
        return
    _delivery_patched = True
    wait_first = FaustConsumer.wait_first

    async def deliver_first(self: Any, *coros: Any, timeout: Any = None) -> WaitResults:  # noqa: ASYNC109 - Faust's signature
        if timeout is not None or len(coros) != 2 or not _is_wait_on(coros[1], self.suspend_flow):
            return await wait_first(self, *coros, timeout=timeout)
        delivery, flow_wait = coros
        events_set = self.suspend_flow.is_set() or self._stopped.is_set() or self._crashed.is_set()
        if events_set or not asyncio.iscoroutine(delivery):
            return await wait_first(self, *coros)
        try:
            waiting_on = delivery.send(None)
        except StopIteration as done:
            flow_wait.close()
            return WaitResults([delivery], [done.value], False)
        except BaseException:
            flow_wait.close()
            raise
        return await wait_first(self, _continued(delivery, waiting_on), flow_wait)

    FaustConsumer.wait_first = deliver_first  # type: ignore[method-assign]
    if AIOKafkaDriverConsumer.wait_first is not deliver_first:
        raise ConfigError(
            f"keylane cannot patch Faust's Consumer.wait_first on faust-streaming {faust.__version__}; "
            f"install faust-streaming{FAUST_PIN} (the range pyproject.toml pins)"
        )


STREAM_RUN = 32
"""Records a Faust stream hands over between two turns of the event loop (``feed_in_runs``):
enough that a lane feed keeps ahead of the lanes, few enough that the lanes' work waits well
under a millisecond behind a run."""


class _NoWait:
    """An awaitable that is done at once: ``await`` goes on without a turn of the loop."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_NO_WAIT = _NoWait()


class _TurnEveryRun:
    """``asyncio.sleep`` for Faust's stream iterator: ``sleep(0)`` is a turn of the loop once
    every ``run`` calls, and no wait otherwise; any other delay is asyncio's own."""

    def __init__(self, run: int) -> None:
        self._run = run
        self._left = run

    def __call__(self, delay: float, result: Any = None) -> Awaitable[Any]:
        if delay or self._left <= 1:
            self._left = self._run
            return asyncio.sleep(delay, result)
        self._left -= 1
        return _NO_WAIT


def feed_in_runs() -> None:
    """Install the stream iterator's ``sleep`` patch of the module docstring, once per
    process. Without Faust's compiled iterator (a faust-streaming built without it), streams
    keep Faust's per-record turn."""
    global _streams_patched
    if _streams_patched:
        return
    _streams_patched = True
    iterator = getattr(faust_streams, "_CStreamIterator", None)
    if iterator is None:
        return
    compiled = importlib.import_module(iterator.__module__)
    if getattr(compiled, "sleep", None) is not asyncio.sleep:
        raise ConfigError(
            f"keylane cannot patch the sleep of Faust's stream iterator on faust-streaming "
            f"{faust.__version__}; install faust-streaming{FAUST_PIN} (the range pyproject.toml pins)"
        )
    setattr(compiled, "sleep", _TurnEveryRun(STREAM_RUN))  # noqa: B010 - a compiled module's global


def _is_wait_on(coro: Any, event: asyncio.Event) -> bool:
    """Whether ``coro`` is ``event.wait()``, not started."""
    frame = getattr(coro, "cr_frame", None)
    return coro.__qualname__ == "Event.wait" and frame is not None and frame.f_locals.get("self") is event


async def _continued(coro: Any, waiting_on: Any) -> Any:
    """Run ``coro`` on from where its first step left it, waiting on ``waiting_on`` (a future,
    or None for a bare yield), as an asyncio Task would have: it resumes once that is done,
    and a cancellation of this coroutine's task reaches it at the same point."""
    while True:
        error: BaseException | None = None
        try:
            if waiting_on is None:  # asyncio.sleep(0): one turn of the loop
                await asyncio.sleep(0)
            elif getattr(waiting_on, "_asyncio_future_blocking", None) is None:
                error = RuntimeError(f"a delivery yielded {waiting_on!r}, not a future")
            else:
                await asyncio.wait((waiting_on,))  # done, whatever its outcome: coro reads that
        except asyncio.CancelledError as cancelled:
            # A Task cancels the future its coroutine waits on; once that is done already,
            # the coroutine gets the CancelledError itself.
            if waiting_on is None or not waiting_on.cancel():
                error = cancelled
        try:
            waiting_on = coro.send(None) if error is None else coro.throw(error)
        except StopIteration as done:
            return done.value


def wrap_faust_consumer(guard_of: Callable[[Any], OffsetGuard | None]) -> None:
    """Install the Consumer wraps of the module docstring, once per process; ``guard_of(app)``
    is the app's OffsetGuard, or None for an app whose offsets Faust keeps."""
    global _wrapped
    if _wrapped:
        return
    _wrapped = True
    perform_seek = FaustConsumer.perform_seek
    seek_to_committed = ThreadDelegateConsumer.seek_to_committed  # see the module docstring
    on_partitions_revoked = FaustConsumer.on_partitions_revoked
    new_offset = FaustConsumer._new_offset
    drain_messages = FaustConsumer._drain_messages

    async def drain_unfiltered(self: Any, fetcher: Any) -> None:
        if not isinstance(self._read_offset, _UnfilteredReadOffsets):
            self._read_offset = _UnfilteredReadOffsets(guard_of(self.app), self.app.tables, self._read_offset)
        await drain_messages(self, fetcher)

    async def seek_to_committed_and_keep(self: Any) -> Any:
        committed = await seek_to_committed(self)
        self._keylane_committed = dict(committed)  # what the coordinator said, for position()
        return committed

    async def perform_seek_then_position(self: Any) -> None:
        self._keylane_committed = {}
        await perform_seek(self)
        guard = guard_of(self.app)
        if guard is not None:
            await guard.position(self, {ensure_TP(tp): o for tp, o in self._keylane_committed.items()})
        await restore_positions_after_seek(self)

    async def revoke_from_ledger(self: Any, revoked: Any) -> None:
        guard = guard_of(self.app)
        if guard is None or not any(guard.governs(tp.topic) for tp in revoked):
            await on_partitions_revoked(self, revoked)
            return
        # Faust waits for every record it handed out to be acked; the lanes settle them all
        # (finished, or released after the grace period) while it waits.
        revoking = asyncio.ensure_future(guard.revoke_lanes())
        try:
            await on_partitions_revoked(self, revoked)
            await revoking
            await guard.commit_revoked(self, revoked)
        finally:
            for tp in revoked:
                guard.revoked((tp.topic, tp.partition))
            guard.resume_lanes()

    def ledger_offset(self: Any, tp: Any) -> int | None:
        guard = guard_of(self.app)
        if guard is None or not guard.governs(tp.topic):
            return new_offset(self, tp)
        # Faust's ack list for this partition is not the truth here; drop it so it cannot grow.
        self._acked[tp].clear()
        self._acked_index[tp].clear()
        if not guard.member():
            return None  # evicted: nothing to commit (OffsetGuard.member)
        return guard.ledger.committable((tp.topic, tp.partition), self._committed_offset.get(tp))

    ThreadDelegateConsumer.seek_to_committed = seek_to_committed_and_keep  # type: ignore[method-assign]
    FaustConsumer.perform_seek = perform_seek_then_position  # type: ignore[method-assign]
    FaustConsumer.on_partitions_revoked = revoke_from_ledger  # type: ignore[method-assign]
    FaustConsumer._new_offset = ledger_offset  # type: ignore[method-assign]
    FaustConsumer._drain_messages = drain_unfiltered  # type: ignore[method-assign]
    _check_wrapped(
        {
            "seek_to_committed": seek_to_committed_and_keep,
            "perform_seek": perform_seek_then_position,
            "on_partitions_revoked": revoke_from_ledger,
            "_new_offset": ledger_offset,
            "_drain_messages": drain_unfiltered,
        }
    )


def watch_cleared_queues(app: Any, cleared: Callable[[set[tuple[str, int]], bool], None]) -> None:
    """Wrap ``app.flow_control.clear`` (see the module docstring): the topic-partitions of the
    events in the queues are read before each clear and passed to ``cleared(partitions,
    unknown)`` after it, ``unknown`` telling whether waiting puts, whose events nobody can
    see, were cancelled. A clear that resumes the flow keeps the queued records of the
    standby changelog partitions the app's recovery reads (``reading_standbys``)."""
    flow_control = app.flow_control
    clear = flow_control.clear
    if getattr(clear, "_keylane_watched", False):
        return

    def clear_watched() -> None:
        partitions: set[tuple[str, int]] = set()
        unknown = False
        # Faust's resume() clears with the flow active again; a revocation suspends it first.
        standbys = reading_standbys(app) if flow_control.is_active() else frozenset()
        kept: dict[Any, list[Any]] = {}
        for queue in list(flow_control._queues):
            for item in list(getattr(queue, "_queue", ())):
                message = getattr(item, "message", None)
                if message is None:
                    continue
                if standbys and message.tp in standbys:
                    kept.setdefault(queue, []).append(item)
                else:
                    partitions.add((message.topic, message.partition))
            unknown = unknown or any(not putter.done() for putter in getattr(queue, "_putters", ()))
        clear()
        for queue, items in kept.items():
            # Counted in the queue's unfinished tasks when first put; and a reader woken by a
            # put finds them, the clear and this being one step of the event loop.
            queue._queue.extend(items)
        if partitions or unknown:
            cleared(partitions, unknown)

    clear_watched._keylane_watched = True  # type: ignore[attr-defined]
    flow_control.clear = clear_watched


def reading_standbys(app: Any) -> frozenset[Any]:
    """The standby changelog partitions the app's table recovery reads now (none without a
    table), whose queued records a clear that resumes the flow puts back.

    Faust resumes the flow once more as a recovery ends (``on_recovery_completed``), after its
    standby partitions were resumed and while it awaits the seek of the stream partitions: a
    standby's records fetched meanwhile wait in the changelog queue, and the resume's clear
    dropped them. The recovery never read them again, having no record of them (it counts the
    records it took from the queue), and the standby's next records moved its store's offset
    past them: a worker that then took the partition over as its active owner trusted a store
    that lacked those records. Records of a standby partition in the queue are unread records
    that follow what the recovery read, in the order it must read them."""
    tables = app.tables
    if getattr(tables, "_changelog_queue", None) is None:
        return frozenset()
    return frozenset(tables.recovery.standby_tps)


def _check_wrapped(wrappers: Mapping[str, Callable[..., Any]]) -> None:
    """Fail loudly when the consumer class Faust actually runs does not reach a wrapper (a
    Faust release that overrides the method in a subclass)."""
    for name, wrapper in wrappers.items():
        if getattr(AIOKafkaDriverConsumer, name, None) is not wrapper:
            raise ConfigError(
                f"keylane's offset guard cannot wrap Faust's Consumer.{name} on faust-streaming "
                f"{faust.__version__}; install faust-streaming{FAUST_PIN} (the range pyproject.toml pins)"
            )
