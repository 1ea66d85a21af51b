"""Reading a benchmark's output topic as it fills: every record once, with when it arrived."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.harness import BenchFailure
from keylane.records import ID_HEADER
from keylane.testing.processes import ManagedProcess


@dataclass(frozen=True)
class OutRecord:
    key: bytes | None
    value: bytes
    timestamp: int  # the record's timestamp, ms
    record_id: str | None
    received_ms: float  # when the reader got it (wall clock, ms)


class Reader:
    """Reads one topic from the beginning, all partitions, without a consumer group, and
    keeps reading: unlike keylane.kafka.topic_reader.read_to_end it does not stop at the
    end offsets of the moment, so it can wait for records still to come."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self.seen_ids: set[str] = set()
        self.duplicates = 0

    async def start(self) -> Reader:
        await self.consumer.start()
        self.consumer.assign(self.partitions)
        await self.consumer.seek_to_beginning(*self.partitions)
        return self

    async def stop(self) -> None:
        await self.consumer.stop()

    async def take(
        self,
        count: int,
        *,
        timeout_s: float,
        watch: Sequence[ManagedProcess] = (),
        match: Callable[[OutRecord], bool] = lambda record: True,
    ) -> list[OutRecord]:
        """The next ``count`` matching records (at least), or BenchFailure on timeout
        (ProcessFailed when a watched process dies or logs that it stopped making progress).
        Records with a ``keylane.id`` seen before are skipped."""
        got: list[OutRecord] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < count:
            for process in watch:
                process.check()
            if time.monotonic() > deadline:
                raise BenchFailure(
                    f"only {len(got)} of {count} records arrived on {self.topic} in {timeout_s:.0f}s"
                )
            batch = await self.consumer.getmany(timeout_ms=200)
            received_ms = time.time() * 1000
            for messages in batch.values():
                for message in messages:
                    headers = dict(message.headers or ())
                    raw_id = headers.get(ID_HEADER)
                    record_id = raw_id.decode() if raw_id is not None else None
                    if record_id is not None:
                        if record_id in self.seen_ids:
                            self.duplicates += 1
                            continue
                        self.seen_ids.add(record_id)
                    record = OutRecord(
                        message.key, message.value or b"", message.timestamp, record_id, received_ms
                    )
                    if match(record):
                        got.append(record)
        return got


def rate_of(records: Sequence[OutRecord]) -> float:
    """(count - 1) / (last - first output timestamp), per second."""
    stamps = sorted(r.timestamp for r in records)
    span_s = (stamps[-1] - stamps[0]) / 1000 if stamps else 0.0
    if len(stamps) < 2 or span_s <= 0:
        raise BenchFailure(
            f"{len(stamps)} outputs within {span_s * 1000:.0f} ms: too few to time; raise the size"
        )
    return (len(stamps) - 1) / span_s
