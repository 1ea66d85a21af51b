"""Lane schedulers: per-key order, one record at a time per key, acks only over a finished
prefix, bounded concurrency, fetch paused when a window fills. Hypothesis drives random
interleavings of many keys in one partition."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keylane.core import lanes as lanes_module
from keylane.core.lanes import KeyLanes, LaneRecord, PartitionLanes, Superseded, WindowHooks

TOPIC = "agent.events"


class Trace:
    """What the jobs did, in the order they did it."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.finished: list[int] = []
        self.acked: list[int] = []
        self.running_keys: set[bytes] = set()
        self.running = 0
        self.max_running = 0
        self.overlaps: list[bytes] = []

    def job(self, key: bytes, offset: int, ticks: int) -> tuple[object, object]:
        async def work() -> None:
            if key in self.running_keys:
                self.overlaps.append(key)
            self.running_keys.add(key)
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.started.append(offset)
            for _ in range(ticks):
                await asyncio.sleep(0)
            self.running -= 1
            self.running_keys.discard(key)
            self.finished.append(offset)

        async def ack() -> None:
            self.acked.append(offset)

        return work, ack


records_strategy = st.lists(
    st.tuples(st.integers(min_value=0, max_value=7), st.integers(min_value=0, max_value=6)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(records=records_strategy, max_in_flight=st.integers(min_value=1, max_value=8))
def test_key_lanes_keep_each_keys_order_and_ack_only_a_finished_prefix(
    records: list[tuple[int, int]], max_in_flight: int
) -> None:
    async def scenario() -> Trace:
        trace = Trace()
        lanes = KeyLanes(max_in_flight=max_in_flight, worker_max_in_flight=64)
        for offset, (key_index, ticks) in enumerate(records):
            key = f"k{key_index}".encode()
            work, ack = trace.job(key, offset, ticks)
            await lanes.submit(LaneRecord(TOPIC, 0, offset, key), work, ack)  # type: ignore[arg-type]
        await lanes.stop()
        return trace

    trace = asyncio.run(scenario())

    keys = {offset: f"k{key_index}".encode() for offset, (key_index, _) in enumerate(records)}
    per_key_started: dict[bytes, list[int]] = defaultdict(list)
    for offset in trace.started:
        per_key_started[keys[offset]].append(offset)
    assert all(offsets == sorted(offsets) for offsets in per_key_started.values()), "each key in offset order"
    assert trace.overlaps == [], "one activation at a time per key"
    assert trace.acked == list(range(len(records))), "every record acked, in offset order"
    assert trace.max_running <= max_in_flight


async def test_an_ack_never_passes_an_unfinished_record() -> None:
    trace = Trace()
    release = asyncio.Event()
    lanes = KeyLanes(max_in_flight=4, worker_max_in_flight=4)

    async def slow() -> None:
        await release.wait()

    async def ack_slow() -> None:
        trace.acked.append(0)

    await lanes.submit(LaneRecord(TOPIC, 0, 0, b"slow"), slow, ack_slow)
    for offset in (1, 2):
        work, ack = trace.job(f"fast{offset}".encode(), offset, 0)
        await lanes.submit(LaneRecord(TOPIC, 0, offset, f"fast{offset}".encode()), work, ack)  # type: ignore[arg-type]
    for _ in range(10):
        await asyncio.sleep(0)

    assert trace.finished == [1, 2], "other keys ran while the slow key was busy"
    assert trace.acked == [], "nothing acked past the unfinished offset 0"
    release.set()
    await lanes.stop()
    assert trace.acked == [0, 1, 2]


async def test_a_full_window_holds_submit_until_half_of_it_is_done() -> None:
    release = asyncio.Event()
    lanes = KeyLanes(max_in_flight=4, worker_max_in_flight=4, window=4)

    async def blocked() -> None:
        await release.wait()

    async def ack() -> None:
        return None

    for offset in range(4):
        await lanes.submit(LaneRecord(TOPIC, 3, offset, f"k{offset}".encode()), blocked, ack)
    fifth = asyncio.create_task(lanes.submit(LaneRecord(TOPIC, 3, 4, b"k4"), blocked, ack))
    for _ in range(10):
        await asyncio.sleep(0)

    assert not fifth.done(), "the window of 4 unacked records is full: submit waits"
    release.set()
    await fifth
    await lanes.stop()


async def test_with_window_hooks_a_partition_full_too_long_is_paused_and_others_keep_flowing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes_module, "HOLD_BEFORE_PAUSE_S", 0.05)
    releases = {offset: asyncio.Event() for offset in range(6)}
    calls: list[tuple[str, int, str]] = []
    lanes = KeyLanes(max_in_flight=8, worker_max_in_flight=8, window=4)
    lanes.set_window_hooks(
        WindowHooks(
            full=lambda topic, partition: calls.append((topic, partition, "pause")),
            room=lambda topic, partition: calls.append((topic, partition, "resume")),
        )
    )

    def job(offset: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await releases[offset].wait()

        return run

    async def ack() -> None:
        return None

    for offset in range(5):  # the fifth finds the window of 4 full for 50 ms: pause, stop waiting
        await lanes.submit(LaneRecord(TOPIC, 3, offset, f"k{offset}".encode()), job(offset), ack)
    await lanes.submit(LaneRecord(TOPIC, 5, 0, b"other"), job(5), ack)
    assert calls == [(TOPIC, 3, "pause")], "partition 3 paused once; partition 5 was never held up"
    for offset in (0, 1, 2):
        releases[offset].set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert calls == [(TOPIC, 3, "pause"), (TOPIC, 3, "resume")], "2 of 4 left: half drained"
    for event in releases.values():
        event.set()
    await lanes.stop()


async def test_partition_lanes_run_a_partition_serially_and_partitions_in_parallel() -> None:
    trace = Trace()
    lanes = PartitionLanes()
    for offset in range(6):
        partition = offset % 2
        work, ack = trace.job(b"same-partition-%d" % partition, offset, 2)
        await lanes.submit(LaneRecord(TOPIC, partition, offset, b"any"), work, ack)  # type: ignore[arg-type]
    await lanes.stop()

    assert sorted(trace.acked) == list(range(6))
    assert trace.max_running == 2, "one per partition, two partitions at once"


async def test_a_failing_job_stops_the_scheduler_from_taking_more_work() -> None:
    lanes = KeyLanes(max_in_flight=2, worker_max_in_flight=2)

    async def boom() -> None:
        raise RuntimeError("corrupt state")

    async def ack() -> None:
        raise AssertionError("a failed record must never be acked")

    await lanes.submit(LaneRecord(TOPIC, 0, 0, b"k"), boom, ack)
    await lanes.stop()

    with pytest.raises(RuntimeError, match="a lane failed"):
        await lanes.submit(LaneRecord(TOPIC, 0, 1, b"k"), boom, ack)


@pytest.mark.parametrize("scheduler", ["key", "partition"])
async def test_revoke_finishes_within_grace_and_releases_the_rest_in_offset_order(scheduler: str) -> None:
    lanes = (
        KeyLanes(max_in_flight=4, worker_max_in_flight=4) if scheduler == "key" else PartitionLanes(window=16)
    )
    settled: list[tuple[str, int]] = []

    async def forever() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        await asyncio.sleep(0.01)

    def settle(kind: str, offset: int) -> Callable[[], Awaitable[None]]:
        async def record() -> None:
            settled.append((kind, offset))

        return record

    # Partition lanes run 0, 1, 2 of partition 3 serially: 0 runs forever, 1 and 2 wait.
    # Key lanes run k0 (forever) and k1 (quick) at once; 2 waits behind k0.
    plan = [(0, b"k0", forever), (1, b"k1", quick), (2, b"k0", quick)]
    for offset, key, work in plan:
        await lanes.submit(
            LaneRecord(TOPIC, 3, offset, key), work, settle("ack", offset), settle("release", offset)
        )
    await asyncio.sleep(0.05)

    abandoned = await lanes.revoke(grace_s=0.1)

    if scheduler == "key":
        assert settled == [("release", 0), ("ack", 1), ("release", 2)], "1 finished within the grace period"
        assert abandoned == 2
    else:
        assert settled == [("release", 0), ("release", 1), ("release", 2)], "nothing after 0 started"
        assert abandoned == 3
    lanes.resume()
    await lanes.submit(LaneRecord(TOPIC, 3, 3, b"k2"), quick, settle("ack", 3), settle("release", 3))
    await lanes.stop()
    assert settled[-1] == ("ack", 3), "after resume() records run again"


@pytest.mark.parametrize("scheduler", ["key", "partition"])
async def test_a_superseded_job_is_released_unfinished_and_the_lane_goes_on(scheduler: str) -> None:
    lanes = (
        KeyLanes(max_in_flight=4, worker_max_in_flight=4) if scheduler == "key" else PartitionLanes(window=16)
    )
    settled: list[tuple[str, int]] = []

    async def superseded() -> None:
        raise Superseded("agent.events/3/0")

    async def quick() -> None:
        await asyncio.sleep(0)

    def settle(kind: str, offset: int) -> Callable[[], Awaitable[None]]:
        async def record() -> None:
            settled.append((kind, offset))

        return record

    for offset, work in ((0, superseded), (1, quick)):
        await lanes.submit(
            LaneRecord(TOPIC, 3, offset, b"k"), work, settle("ack", offset), settle("release", offset)
        )
    await lanes.stop()

    assert settled == [("release", 0), ("ack", 1)]
    lanes.check()  # no failure recorded: the scheduler still takes work


async def test_a_job_waiting_for_confirmation_gives_its_slot_to_another_key_but_not_its_own_lane() -> None:
    """A job that called leave_slot (the worker's wait for Kafka's confirmation) no longer
    counts against max_in_flight: another key starts. Its own key's next record, and every
    ack after it, still wait for the job to end."""
    confirmed = asyncio.Event()
    events: list[str] = []
    acked: list[int] = []

    def job(name: str, *, confirm: bool = False) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            events.append(f"{name} started")
            if confirm:
                lanes_module.leave_slot()
                await confirmed.wait()
            events.append(f"{name} ended")

        return work

    def ack_of(offset: int) -> Callable[[], Awaitable[None]]:
        async def ack() -> None:
            acked.append(offset)

        return ack

    lanes = KeyLanes(max_in_flight=1, worker_max_in_flight=1)
    await lanes.submit(LaneRecord(TOPIC, 0, 0, b"a"), job("a0", confirm=True), ack_of(0))
    await lanes.submit(LaneRecord(TOPIC, 0, 1, b"a"), job("a1"), ack_of(1))
    await lanes.submit(LaneRecord(TOPIC, 0, 2, b"b"), job("b2"), ack_of(2))
    for _ in range(20):
        await asyncio.sleep(0)

    assert events == ["a0 started", "b2 started", "b2 ended"], "b ran in a0's slot; a1 waits for a0"
    assert acked == [], "nothing is acked past the unfinished a0"

    confirmed.set()
    await lanes.stop()

    assert events[3:] == ["a0 ended", "a1 started", "a1 ended"]
    assert acked == [0, 1, 2]


async def test_a_job_that_keeps_its_slot_holds_back_other_keys() -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def slow() -> None:
        started.append("a")
        await release.wait()

    async def other() -> None:
        started.append("b")

    lanes = KeyLanes(max_in_flight=1, worker_max_in_flight=1)
    await lanes.submit(LaneRecord(TOPIC, 0, 0, b"a"), slow, lanes_module._nothing)
    await lanes.submit(LaneRecord(TOPIC, 0, 1, b"b"), other, lanes_module._nothing)
    for _ in range(20):
        await asyncio.sleep(0)
    assert started == ["a"]
    release.set()
    await lanes.stop()
    assert started == ["a", "b"]


async def test_lane_tasks_leave_the_scheduler_as_their_lanes_end_and_stop_returns() -> None:
    """A lane's task removes itself when its lane ends (no done callback); one cancelled
    before its first step never runs that code, and ``stop`` must still return."""
    lanes = KeyLanes(max_in_flight=4, worker_max_in_flight=4)
    trace = Trace()
    for offset, key in enumerate((b"a", b"b", b"a")):
        work, ack = trace.job(key, offset, ticks=2)
        await lanes.submit(LaneRecord(TOPIC, 0, offset, key), work, ack)  # type: ignore[arg-type]
    assert len(lanes._tasks) == 2, "one task per lane"
    await asyncio.wait_for(lanes.stop(), 5)
    assert (sorted(trace.acked), lanes._tasks) == ([0, 1, 2], set())

    work, ack = trace.job(b"c", 3, ticks=1)
    await lanes.submit(LaneRecord(TOPIC, 0, 3, b"c"), work, ack)  # type: ignore[arg-type]
    (never_started,) = lanes._tasks
    never_started.cancel()  # before the loop ran its first step
    await asyncio.wait_for(lanes.stop(), 5)
    assert lanes._tasks == set()


async def test_a_record_revoke_cancels_ends_alone_and_its_lane_releases_the_rest() -> None:
    """A record's work runs in its lane's task: revoke's cancellation of a late record ends
    that record (released), not the lane, whose next record is released too; a later record
    of the same key runs after resume(). A cancellation that is not revoke's still ends the
    lane (stop, shutdown)."""
    lanes = KeyLanes(max_in_flight=4, worker_max_in_flight=4)
    settled: list[tuple[str, int]] = []
    cleaned_up: list[int] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned_up.append(0)  # the work sees the cancellation, as in a task of its own

    def settle(kind: str, offset: int) -> Callable[[], Awaitable[None]]:
        async def record() -> None:
            settled.append((kind, offset))

        return record

    async def quick() -> None:
        await asyncio.sleep(0)

    await lanes.submit(LaneRecord(TOPIC, 0, 0, b"k"), forever, settle("ack", 0), settle("release", 0))
    await lanes.submit(LaneRecord(TOPIC, 0, 1, b"k"), quick, settle("ack", 1), settle("release", 1))
    await asyncio.sleep(0.01)
    (lane_task,) = lanes._tasks
    assert await asyncio.wait_for(lanes.revoke(grace_s=0.05), 5) == 2
    assert (settled, cleaned_up) == ([("release", 0), ("release", 1)], [0])
    await asyncio.sleep(0)
    assert lane_task.done() and not lane_task.cancelled(), "the lane ended on its own"
    assert lane_task.cancelling() == 0, "revoke's cancellation was taken back"

    lanes.resume()
    await lanes.submit(LaneRecord(TOPIC, 0, 2, b"k"), quick, settle("ack", 2), settle("release", 2))
    await lanes.submit(LaneRecord(TOPIC, 0, 3, b"j"), forever, settle("ack", 3), settle("release", 3))
    await asyncio.sleep(0.01)
    assert settled[-1] == ("ack", 2)
    (other,) = lanes._tasks
    other.cancel()  # not revoke's
    with pytest.raises(asyncio.CancelledError):
        await other
