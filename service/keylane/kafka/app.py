"""The Faust app of a worker: built from Settings and the topic catalog, and the app's hooks the stages use.

Stages reach the app's signals, table recovery, consumer positions, readiness and worker
runner through the functions here (``on_shutdown``, ``on_rebalance_complete``,
``recovery_completed``, ``log_end``, ``readiness``, ``run``), so nothing outside
service/keylane/kafka/ imports Faust.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer
from faust import stores
from faust.stores.rocksdb import Store as FaustRocksDBStore
from faust.types import TP
from mode import Signal
from mode.utils.times import want_seconds

from keylane import metrics
from keylane.catalog import EVENTS, Catalog
from keylane.config import Settings
from keylane.kafka.delivery import changelog_writer, delivery_guard
from keylane.kafka.partitioner import KeptHashPartitioner
from keylane.kafka.patches import (
    deliver_without_tasks,
    feed_in_runs,
    publish_without_stampede,
    start_tables_at_once,
)
from keylane.kafka.restore_watch import watch_restores
from keylane.kafka.rocksdb_store import RocksDBStore
from keylane.kafka.sensors import CommitMonitor, hook_sensors
from keylane.kafka.topic_admin import admin_client, ensure_topic

log = logging.getLogger(__name__)

App = faust.App
"""The Faust app type, for annotations outside service/keylane/kafka/."""

ACKS_ALL = -1  # Faust's spelling of acks=all: every in-sync replica has the record
PRODUCE_TIMEOUT_S = 120.0
"""How long the producer keeps retrying a record (a leader moving, NOT_ENOUGH_REPLICAS) before
it gives up: the Java client's delivery.timeout.ms default. A record that fails after that
crashes the worker with its input uncommitted (service/keylane/kafka/delivery.py); Faust's own
default, 20 minutes, would keep a partition silently stuck behind it that long."""


def max_request_bytes(catalog: Catalog) -> int:
    """The producer's max request size: the largest ``max_message_bytes`` in the catalog, so
    the producer sends any record a topic takes (Faust's default, 1,000,000 bytes, is below
    the catalog's 2 MiB). Each record is still checked against its own topic's limit before
    it is handed over (service/keylane/kafka/delivery.py)."""
    return max(spec.max_message_bytes for spec in catalog)


def faust_broker_url(settings: Settings) -> str:
    """Faust's broker URL list for the settings' bootstrap servers."""
    return ";".join(f"kafka://{server}" for server in settings.bootstrap_list)


def build_app(
    settings: Settings,
    catalog: Catalog,
    *,
    partitions: int | None = None,
    client_id: str = "keylane",
    offset_write_interval_s: float = 0.0,
    write_ahead_log: bool = True,
) -> faust.App:
    """A Faust app whose internal topics match the catalog's co-partitioning.

    Faust creates changelog topics with ``topic_partitions`` partitions and writes a table
    entry into the partition of the current event, so that count must equal the source
    topics' count; it is taken from the catalog, never from Faust's default of 8.

    Replication: the app's producer (outputs, intents, results, changelog records) uses
    acks=all. Faust does not create topics: its own creation path asks the first broker in
    its metadata for the controller and crashes the worker at start-up when that broker was
    just killed, and a topic it has just created may be missing from the consumer's
    metadata for 5 minutes (every table write then fails with PartitionsMismatch). Each
    table creates its changelog through keylane's admin client instead (retrying past a
    dead broker, waiting until every broker knows the topic), with agent.events'
    replication factor and ``min.insync.replicas``; the leader topic, which keylane does not
    use, is not created at all.

    ``client_id`` is the Kafka client id of the app's consumer and producer: a worker's names
    its agent (service/keylane/kafka/group_identity.py).

    ``offset_write_interval_s``: how long the table stores keep a persisted changelog offset
    in memory before writing it (service/keylane/kafka/rocksdb_store.py); 0 writes it in the
    loop's next turn. Only an app whose stores do not outlive a crash may wait longer, and
    only such an app may turn off ``write_ahead_log``, RocksDB's log of the stores' writes.
    """
    metrics.use_topic_prefix(settings.topic_prefix)
    publish_without_stampede()  # see service/keylane/kafka/patches.py
    deliver_without_tasks()  # likewise
    feed_in_runs()  # likewise
    start_tables_at_once()  # likewise
    co_partitions = partitions or catalog[EVENTS].partitions
    replication = catalog[EVENTS]  # changelogs replicate like the topics they mirror
    app = faust.App(
        settings.app_id,
        broker=faust_broker_url(settings),
        broker_client_id=client_id,
        store="rocksdb://",  # runs on rocksdict when it is installed; "rocksdict://" is broken
        datadir=str(settings.data_dir),
        topic_partitions=co_partitions,
        topic_replication_factor=replication.replication_factor,
        producer_acks=ACKS_ALL,
        producer_max_request_size=max_request_bytes(catalog),
        producer_request_timeout=PRODUCE_TIMEOUT_S,
        producer_partitioner=KeptHashPartitioner(),  # murmur2, as Faust's default
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        consumer_group_instance_id=settings.group_instance_id,  # static membership when set
        web_enabled=False,
        autodiscover=False,
        Table=_replicated_table(
            settings,
            replication.min_insync_replicas,
            max_request_bytes(catalog),
            offset_write_interval_s,
            write_ahead_log,
        ),
        topic_allow_declare=False,  # tables create their changelogs themselves, see above
        topic_disable_leader=True,  # no app.is_leader() or on_leader timers in keylane
        Monitor=CommitMonitor,  # no per-record statistics: see service/keylane/kafka/sensors.py
    )
    hook_sensors(app)  # before any stream or table binds the delegate's hooks
    watch_restores(app)  # a table restore that stops receiving records is read again
    # Faust lets PRODUCER_ACKS / TOPIC_REPLICATION_FACTOR in the environment win over the
    # arguments above; keylane's no-loss guarantee rests on these two, so they are pinned.
    app.conf.producer_acks = ACKS_ALL
    app.conf.topic_replication_factor = replication.replication_factor
    app.conf.topic_allow_declare = False
    app.conf.topic_disable_leader = True
    app.conf.Monitor = CommitMonitor  # type: ignore[assignment]  # Faust types it as a symbol or a type
    app.conf.broker_client_id = client_id  # BROKER_CLIENT_ID would hide the agent from the group check
    # Likewise PRODUCER_MAX_REQUEST_SIZE / PRODUCER_REQUEST_TIMEOUT: the size checks and the
    # delivery confirmation (service/keylane/kafka/delivery.py) are computed from these two.
    app.conf.producer_max_request_size = max_request_bytes(catalog)
    app.conf.producer_request_timeout = PRODUCE_TIMEOUT_S
    # And CONSUMER_GROUP_INSTANCE_ID: one value shared by every pod (an envFrom) would make them
    # fence each other out of the group; the membership is KEYLANE_GROUP_INSTANCE_ID's alone.
    app.conf.consumer_group_instance_id = settings.group_instance_id  # type: ignore[assignment]  # None (dynamic) is Faust's default; its property is typed str
    return app


def changelog_record_limit(app: faust.App, catalog: Catalog) -> int:
    """The most bytes one changelog record may take: what the producer sends and what the
    changelog topic (created with ``max.message.bytes`` = the producer's limit) accepts. The
    runtime keeps every key's whole state blob under it (KeyRuntime.changelog_max_bytes)."""
    return min(int(app.conf.producer_max_request_size), max_request_bytes(catalog))


def _replicated_table(
    settings: Settings,
    min_insync_replicas: int,
    max_message_bytes: int,
    offset_write_interval_s: float,
    write_ahead_log: bool,
) -> type[faust.Table[Any, Any]]:
    """Faust's Table whose changelog topic carries ``min.insync.replicas`` (a changelog write
    counts once that many replicas have it) and ``max.message.bytes`` (the producer's limit:
    the broker's default, about 1 MiB, is below a state blob the 1 MiB memory cap allows), and
    is created by keylane's admin client when the table starts, before Faust reads its
    metadata (see build_app)."""

    class ReplicatedTable(faust.Table[Any, Any]):
        def __init__(
            self, app: faust.App, *, extra_topic_configs: dict[str, Any] | None = None, **kwargs: Any
        ) -> None:
            configs = {
                "min.insync.replicas": str(min_insync_replicas),
                "max.message.bytes": str(max_message_bytes),
                **(extra_topic_configs or {}),
            }
            super().__init__(app, extra_topic_configs=configs, **kwargs)

        async def on_start(self) -> None:
            topic = self.changelog_topic
            policies = [p for p, on in (("compact", topic.compacting), ("delete", topic.deleting)) if on]
            configs = {str(k): str(v) for k, v in (topic.config or {}).items()}
            if policies:
                configs["cleanup.policy"] = ",".join(policies)
            if topic.retention:
                configs["retention.ms"] = str(int(want_seconds(topic.retention) * 1000))
            async with admin_client(settings) as client:
                await ensure_topic(
                    client,
                    name=topic.get_topic_name(),
                    partitions=self.partitions or self.app.conf.topic_partitions,
                    replication_factor=self.app.conf.topic_replication_factor,
                    configs=configs,
                )
            await super().on_start()

        def _new_store_by_url(self, url: Any) -> Any:
            # Faust's RocksDB store, writing its persisted offsets in batches and, for a
            # worker, without the write-ahead log (service/keylane/kafka/rocksdb_store.py);
            # any other store is Faust's.
            if stores.by_url(url) is not FaustRocksDBStore:
                return super()._new_store_by_url(url)
            return RocksDBStore(
                offset_write_interval_s,
                url,
                self.app,
                self,
                table_name=self.name,
                key_type=self.key_type,
                key_serializer=self.key_serializer,
                value_serializer=self.value_serializer,
                value_type=self.value_type,
                loop=self.loop,
                options=self.options,
                write_ahead_log=write_ahead_log,
            )

    return ReplicatedTable


def stored_bytes(table: Any) -> Callable[[bytes], bytes | None]:
    """A reader of a bytes-to-bytes table's store: a key's stored value, or None.

    It is the read of the current event's partition's database, as the store's own ``_get``
    does it, without noting the key's partition in the store's key index. That index is a
    hint for reads without an event, which search every partition's database when a key is
    not in it; its LRU bookkeeping took about a third of a state read's time and an eighth
    of a write's, and a paged key's pages only churn through it. The store's public ``get`` gives the
    same result with several calls more on every record. It goes through Mapping.get and
    __getitem__, encodes the key and decodes the value with the raw codec (a pass-through
    for bytes), and raises KeyError for an absent key, which get then turns into None."""
    _check_bytes_table(table, "reader")
    store = table.data
    read_store: Callable[[bytes], bytes | None] = store._get
    if not _partition_per_event(table):
        return read_store
    db_for_partition = store._db_for_partition

    def read(key: bytes) -> bytes | None:
        event = faust.current_event()
        if event is None:
            return read_store(key)
        value: bytes | None = db_for_partition(event.message.partition).get(key)
        return value

    return read


def stored_bytes_writer(table: Any) -> Callable[[bytes, bytes], None]:
    """A writer of a bytes-to-bytes table: what ``table[key] = value`` does, in its order,
    without the codec calls. First the changelog record (the table's ``on_key_set``, or inside
    a unit of work the same record queued without Faust's FutureMessage: ``changelog_writer``
    in service/keylane/kafka/delivery.py), then the store's own write (``_set``) in the
    current event's partition (without the key index: see ``stored_bytes``). The store's
    ``__setitem__`` would run the raw codec over the key and the value first, a pass-through
    for bytes that costs about as much as the write; a paged key's write is two of them."""
    _check_bytes_table(table, "writer")
    send_changelog = changelog_writer(table)
    store = table.data
    write: Callable[[bytes, bytes], None] = (
        _event_partition_writer(store) if _partition_per_event(table) else store._set
    )

    def put(key: bytes, value: bytes) -> None:
        send_changelog(key, value)
        write(key, value)

    return put


def _event_partition_writer(store: Any) -> Callable[[bytes, bytes], None]:
    """The write of the RocksDB ``store``'s database of the current event's partition, as the
    store's ``_set`` does it, without the key index (``stored_bytes``)."""
    db_for_partition = store._db_for_partition

    def write(key: bytes, value: bytes) -> None:
        event = faust.current_event()
        assert event is not None, "a state write outside an event's job"
        db_for_partition(event.message.partition).put(key, value)

    return write


def _partition_per_event(table: Any) -> bool:
    """Whether ``table``'s store keeps a database per partition and reads and writes the
    current event's (as the RocksDB store does for a table neither global nor using the
    producer's partitioner)."""
    return isinstance(table.data, FaustRocksDBStore) and not (table.is_global or table.use_partitioner)


def _check_bytes_table(table: Any, what: str) -> None:
    if table.key_type is not bytes or table.value_type is not bytes:
        raise TypeError(f"table {table.name}: a stored-bytes {what} needs key_type and value_type bytes")


def on_shutdown(app: faust.App, stop: Callable[[], Awaitable[None]]) -> None:
    """Run ``stop()`` when the app shuts down, after Faust waited for every unacked record
    (the lanes' queued jobs): where a stage stops its lanes."""
    _connect(app.on_before_shutdown, stop)


def on_rebalance_complete(app: faust.App, done: Callable[[], Awaitable[None]]) -> None:
    """Run ``done()`` after each rebalance of the app's consumer group completed."""
    _connect(app.on_rebalance_complete, done)


def _connect(app_signal: Signal[Any], receiver: Callable[[], Awaitable[None]]) -> None:
    async def receive(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        await receiver()

    app_signal.connect(receive)  # type: ignore[arg-type]  # mode types receivers as positional-only


async def started_side_consumer(app: faust.App, *, auto_offset_reset: str) -> AIOKafkaConsumer:
    """A started consumer outside the app's group, on the app's brokers and with the isolation
    level its own consumer reads with, for checks that read a log at a position of their
    choosing. A consumer whose start failed is stopped (it may hold connections) before the
    error is raised, so callers keep only started ones."""
    conf = app.conf
    consumer = AIOKafkaConsumer(
        bootstrap_servers=[f"{url.host}:{url.port or 9092}" for url in conf.broker],
        enable_auto_commit=False,
        auto_offset_reset=auto_offset_reset,
        isolation_level="read_committed"
        if str(conf.processing_guarantee) == "exactly_once"
        else "read_uncommitted",
    )
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    return consumer


def recovery_completed(app: faust.App) -> bool:
    """Whether the app's tables finished restoring from their changelogs since the last
    rebalance (Faust's TableManager recovery; its Protocol does not declare it)."""
    completed: bool = app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]  # TableManager, not its Protocol
    return completed


def log_end(app: faust.App, topic: str, partition: int) -> int | None:
    """The consumer's high watermark of an assigned topic-partition, None when unknown."""
    try:
        end = app.consumer.highwater(TP(topic, partition))
    except Exception:  # noqa: BLE001 - unknown (not assigned, no fetch yet): the callers' hint goes missing
        return None
    return end if isinstance(end, int) and end >= 0 else None


class Readiness:
    """Whether an app is ready to process its input (a process's /readyz), and why not.

    Ready: the app is running, its first partition assignment happened, no rebalance is in
    progress (Faust's ``rebalancing`` lasts until the tables are recovered and the streams
    resumed), its tables' recovery is complete, no input partition is stalled, and it is
    neither crashed nor stopping (a produce failure, a signal). Read from the metrics
    server's thread: it only reads flags.
    """

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self.assigned = False
        self.worker: Any = None
        """The Faust worker running the app (``run`` sets it): its stop begins before the app's."""
        self.checks: list[Callable[[], str | None]] = []
        """More reasons not to be ready, each None when fine (the offset guard adds a stalled
        partition, service/keylane/kafka/consumer_lag.py)."""
        _connect(app.on_partitions_assigned, self._on_assigned)

    async def _on_assigned(self) -> None:
        self.assigned = True

    def not_ready(self) -> str | None:
        """None when ready, else why not, in a few words."""
        app = self.app
        if delivery_guard(app).failure is not None:
            return "a record could not be produced; the process is stopping"
        if app.crashed:
            return f"crashed ({type(app.crash_reason).__name__})"
        if app.should_stop or (self.worker is not None and self.worker.should_stop):
            return "stopping"
        if not app.started:
            return "starting"
        if not self.assigned:
            return "waiting for the first partition assignment"
        if app.rebalancing:
            return "rebalancing"
        if not recovery_completed(app):
            return "recovering tables from their changelogs"
        for check in self.checks:
            reason = check()
            if reason is not None:
                return reason
        return None


_READINESS_ATTR = "_keylane_readiness"


def readiness(app: faust.App) -> Readiness:
    """The app's Readiness, made on first use (before the app starts: it listens for the
    first assignment)."""
    ready: Readiness | None = getattr(app, _READINESS_ATTR, None)
    if ready is None:
        ready = Readiness(app)
        setattr(app, _READINESS_ATTR, ready)
    return ready


def run(
    app: faust.App,
    *,
    loglevel: str,
    on_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None,
) -> None:
    """Run ``app`` in a Faust worker until a signal stops it (raises SystemExit with its code).
    ``on_loop(loop)`` is called with the event loop the worker runs, before it starts (to
    schedule a heartbeat on it)."""
    worker = Worker(app, loglevel=loglevel, redirect_stdouts=False)
    readiness(app).worker = worker
    if on_loop is not None:
        on_loop(worker.loop)
    worker.execute_from_commandline()


class Worker(faust.Worker):
    """Faust's worker, its log lines one line each: Faust renders topic-partition sets and
    recovery offsets as boxed tables, about 150 lines at a start-up, which scroll away what an
    operator looks for (`make run`'s "keylane is running" block, the first error)."""

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        for handler in logger.handlers:
            handler.setFormatter(_TablesOnOneLine(handler.formatter or logging.Formatter()))


class _TablesOnOneLine(logging.Formatter):
    """Formats as ``inner`` does, then puts each boxed table of the result on the line: Faust
    renders its tables while the record is formatted (its formatter's argument hooks), so
    they can only be rewritten after that."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        return tables_on_one_line(self._inner.format(record))


def tables_on_one_line(text: str) -> str:
    """``text`` with each boxed table as its title and rows (cells joined by a space, rows by a
    comma, the header row dropped), all on one line; text without a table is returned as it is."""
    if "\n+" not in text:
        return text
    parts: list[str] = []
    rows: list[str] = []
    borders = 0  # of the table being read: its title bar, the line under its header, its bottom
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("+"):
            borders += 1
            title = stripped.strip("+").split("+")[0].strip("-").strip()
            if borders == 1 and title:  # the title bar: "+Highwater - Active-----+"
                parts.append(f"{title}:")
            if borders == 3:
                parts.append(", ".join(rows))
                rows, borders = [], 0
                tail = stripped.rsplit("+", 1)[1].strip()  # text after the bottom border
                if tail:
                    parts.append(tail)
        elif stripped.startswith("|") and borders == 2:
            rows.append(" ".join(c.strip() for c in stripped.strip("|").split("|")))
        elif stripped and borders == 0:
            parts.append(line.rstrip())
    return " ".join(parts)
