"""Lane scheduling: the one seam that decides which inputs may run concurrently.

A lane runs one record at a time, in offset order. Two schedulers implement the seam:

* ``PartitionLanes`` — the partition number is the lane: every input of partition p (events,
  results, approvals, timers of the co-partitioned topics) runs serially; partitions run in
  parallel.
* ``KeyLanes`` — (partition, key) is the lane: a key's inputs still run one at a time in
  offset order, while different keys of a partition run concurrently, up to
  ``max_in_flight`` per partition and ``worker_max_in_flight`` per worker.

Either way a record's offset is acked only when it and every earlier record of its
topic-partition have finished: acks go out in offset order, never past unfinished work
(Faust's own out-of-order ack handling is not relied on, see faust-streaming issue #606).
When a topic-partition holds ``window`` unacked records (16 x max_in_flight by default),
``submit`` waits until half of them are done. A window that drains that far within
HOLD_BEFORE_PAUSE_S is an ordinary full pipeline, and waiting costs nothing; one that does
not (a hot key, a slow model) would hold every other partition behind it, so with
``WindowHooks`` installed (the Faust glue pauses fetching that partition) the wait ends
and the partition is paused instead, until half its window is done.

Key lanes count a record against ``max_in_flight`` while it works, not while it waits for
Kafka to confirm what it produced: a job that reaches that wait calls ``leave_slot()``, which
hands its slot to the next key while its own lane (the key's next record, and the ack order)
still waits for the job to end. Without that, every slot would sit idle for one produce
round trip per record, and a partition's rate would be max_in_flight / (activation + round
trip) instead of max_in_flight / activation.

A job that raises is a keylane bug or fatal state (a corrupt blob): the scheduler stops taking
work so nothing is acked past it, and the worker crashes and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from keylane import metrics

log = logging.getLogger(__name__)


class Superseded(Exception):
    """A job's record may belong to another worker now (its partition may have moved while
    the job ran): the lane releases it unfinished, as a revocation does, and goes on."""


Job = Callable[[], Awaitable[None]]
WINDOW_PER_IN_FLIGHT = 16
HOLD_BEFORE_PAUSE_S = 1.0


@dataclass(frozen=True)
class LaneRecord:
    """Where a record sits: what its lane and its ack order are derived from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None


class LaneScheduler(Protocol):
    """Runs each record's work in its lane, then acks records in offset order per topic-partition."""

    async def submit(self, record: LaneRecord, work: Job, ack: Job, release: Job | None = None) -> None:
        """Queue a record. While its topic-partition's window of unacked records is full it
        waits, unless window hooks pause that partition instead. ``ack`` runs once the record
        and every earlier one have finished; ``release`` instead, in the same order, when the
        record was abandoned by ``revoke``."""
        ...

    async def revoke(self, grace_s: float) -> int:
        """Stop starting records, give running ones ``grace_s`` to finish, cancel the rest;
        returns how many records were abandoned (released, not acked)."""
        ...

    def resume(self) -> None:
        """Start records again after a revocation."""
        ...

    async def stop(self) -> None:
        """Finish what was submitted, then stop."""
        ...

    def set_window_hooks(self, hooks: WindowHooks) -> None:
        """Pause and resume topic-partitions through ``hooks`` instead of blocking ``submit``."""
        ...


@dataclass(frozen=True)
class WindowHooks:
    """Called with (topic, partition) when a topic-partition's window fills, and when half of
    it has drained again."""

    full: Callable[[str, int], None]
    room: Callable[[str, int], None]


class _AckWindow:
    """The unacked records of one topic-partition, in the order they were submitted.

    Entries are keyed by a submission ticket, not by offset: after a rebalance the same
    offset can be submitted again while its earlier copy is still finishing.
    """

    def __init__(self, tp: tuple[str, int]) -> None:
        self.tp = tp
        self.pending: OrderedDict[int, tuple[bool | None, Job, Job]] = OrderedDict()
        self.lock = asyncio.Lock()
        self.room = asyncio.Event()
        self.room.set()
        self.paused = False
        self.empty = asyncio.Event()
        self.empty.set()
        self._tickets = 0

    def add(self, ack: Job, release: Job) -> int:
        self._tickets += 1
        self.pending[self._tickets] = (None, ack, release)
        self.empty.clear()
        return self._tickets

    async def complete(self, ticket: int, *, finished: bool = True) -> None:
        """Mark ``ticket`` finished (or abandoned), then ack (or release) the settled prefix,
        in order."""
        _, ack, release = self.pending[ticket]
        self.pending[ticket] = (finished, ack, release)
        async with self.lock:  # one acker at a time keeps acks in offset order
            while self.pending:
                head = next(iter(self.pending))
                outcome, head_ack, head_release = self.pending[head]
                if outcome is None:
                    break
                del self.pending[head]
                await (head_ack() if outcome else head_release())
            if not self.pending:
                self.empty.set()


@dataclass
class _Flow:
    """Windows per topic-partition. Admitting to a full window waits until half of it is done;
    with hooks, a wait longer than HOLD_BEFORE_PAUSE_S pauses the partition instead (admission
    goes on with what was already fetched). Half drained, it resumes."""

    window: int
    windows: dict[tuple[str, int], _AckWindow] = field(default_factory=dict)
    hooks: WindowHooks | None = None

    async def admit(self, record: LaneRecord, ack: Job, release: Job) -> tuple[_AckWindow, int]:
        tp = (record.topic, record.partition)
        window = self.windows.get(tp)
        if window is None:
            window = self.windows[tp] = _AckWindow(tp)
        if len(window.pending) >= self.window and not window.paused:
            try:
                async with asyncio.timeout(HOLD_BEFORE_PAUSE_S if self.hooks is not None else None):
                    while len(window.pending) >= self.window:
                        window.room.clear()
                        await window.room.wait()
            except TimeoutError:
                assert self.hooks is not None
                window.paused = True
                self.hooks.full(*tp)
        return window, window.add(ack, release)

    def drained(self, window: _AckWindow) -> None:
        if len(window.pending) <= self.window // 2:
            window.room.set()
            if window.paused:
                window.paused = False
                if self.hooks is not None:
                    self.hooks.room(*window.tp)


async def _nothing() -> None:
    return None


class _Slot:
    """A record's hold on its partition's and the worker's in-flight semaphores, given back
    once: by ``leave_slot`` from inside the job, or when the job ends."""

    def __init__(self, *semaphores: asyncio.Semaphore) -> None:
        self._semaphores = semaphores
        self._held = False

    async def acquire(self) -> None:
        taken: list[asyncio.Semaphore] = []
        try:
            for semaphore in self._semaphores:
                await semaphore.acquire()
                taken.append(semaphore)
        except BaseException:
            for semaphore in taken:
                semaphore.release()
            raise
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            for semaphore in self._semaphores:
                semaphore.release()


_current_slot: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "keylane_lane_slot", default=None
)


def leave_slot() -> None:
    """From inside a lane job: its record stops counting against ``max_in_flight`` (another
    key may start), while its own lane still waits for the job to end. A no-op outside key
    lanes."""
    slot = _current_slot.get()
    if slot is not None:
        slot.release()


Item = tuple[int, Job, _AckWindow, float]
"""A queued record: its window ticket, its work, its window, when it was queued."""


class _SchedulerBase:
    """What both schedulers share: the flow windows, running one record, failing fast, and
    abandoning work on revocation."""

    _flow: _Flow
    failure: BaseException | None = None
    _abandoning: bool = False
    _abandoned: int = 0
    _running: set[asyncio.Task[Any]]
    """The lane tasks running a record's work now (it runs in the lane's own task)."""
    _revoking: dict[asyncio.Task[Any], asyncio.Future[None]]
    """The lane tasks ``revoke`` waits for, each with what ends its wait."""

    async def revoke(self, grace_s: float) -> int:
        """Stop starting records, give the running ones ``grace_s`` to finish, cancel the rest.

        Every record that did not finish is released instead of acked, in offset order, so
        its offset is never committed and the partition's next owner runs it. Records
        submitted while this runs are released too; call ``resume`` once the revocation is
        over.

        A record's work runs in its lane's task, not a task of its own (one task less per
        record): cancelling a late one cancels that lane task, which takes that cancellation
        as the end of the record (``_process``) and goes on releasing the rest."""
        self._abandoning = True
        self._abandoned = 0
        loop = asyncio.get_running_loop()
        ends = {task: loop.create_future() for task in self._running}
        self._revoking.update(ends)
        if ends:
            await asyncio.wait(ends.values(), timeout=grace_s)
            # Checked now, with no wait since: a task still running its record is inside the
            # work, so the cancellation reaches it there.
            late = [task for task in ends if task in self._running]
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait([ends[task] for task in late])
                log.warning("revoked: cancelled %s activations still running after %ss", len(late), grace_s)
        for window in list(self._flow.windows.values()):
            await window.empty.wait()  # lane tasks release what they hold, without running it
        return self._abandoned

    def resume(self) -> None:
        """Start records again after a revocation."""
        self._abandoning = False

    async def _process(self, item: Item, label: str, lane: object) -> bool:
        """Run one record unless the scheduler is abandoning work; settle it in its window.
        Returns whether it finished."""
        ticket, work, window, queued_at = item
        finished = False
        if not self._abandoning:
            task = asyncio.current_task()
            assert task is not None  # a lane runs in a task of its own
            self._running.add(task)
            try:
                await self.execute(work, queued_at, label, lane=lane)
                finished = True
            except Superseded:
                pass  # released unfinished: the partition's next owner runs it
            except asyncio.CancelledError:
                if not (self._abandoning and task in self._revoking):
                    raise  # the lane itself is being cancelled
                task.uncancel()  # revoke's cancellation of this record: the lane goes on
            finally:
                self._running.discard(task)
                end = self._revoking.pop(task, None)
                if end is not None:
                    end.set_result(None)
        else:
            metrics.child(metrics.LANE_QUEUE_DEPTH, label).dec()
        if not finished:
            self._abandoned += 1
            metrics.RECORDS_ABANDONED.inc()
        await window.complete(ticket, finished=finished)
        self._flow.drained(window)
        return finished

    def set_window_hooks(self, hooks: WindowHooks) -> None:
        """Pause and resume topic-partitions through ``hooks`` instead of blocking ``submit``."""
        self._flow.hooks = hooks

    def check(self) -> None:
        if self.failure is not None:
            raise RuntimeError("a lane failed; the worker must restart") from self.failure

    async def execute(self, work: Job, queued_at: float, label: str, *, lane: object) -> None:
        """Run one record's work, keeping the lane metrics; a failure stops the scheduler."""
        metrics.child(metrics.LANE_QUEUE_DEPTH, label).dec()
        metrics.LANE_WAIT_SECONDS.observe(time.perf_counter() - queued_at)
        metrics.child(metrics.IN_FLIGHT, label).inc()
        try:
            await work()
        except (asyncio.CancelledError, Superseded):
            raise
        except BaseException as exc:
            self.failure = exc
            log.exception("lane %s failed; no further records are processed", lane)
            raise
        finally:
            metrics.child(metrics.IN_FLIGHT, label).dec()


class PartitionLanes(_SchedulerBase):
    """One serial lane per partition number; lanes run concurrently."""

    def __init__(self, *, window: int = 256) -> None:
        self._flow = _Flow(window)
        self._queues: dict[int, asyncio.Queue[Item | None]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._running = set()
        self._revoking = {}

    async def submit(self, record: LaneRecord, work: Job, ack: Job, release: Job | None = None) -> None:
        self.check()
        window, ticket = await self._flow.admit(record, ack, release or _nothing)
        queue = self._queues.get(record.partition)
        if queue is None:
            queue = self._queues[record.partition] = asyncio.Queue()
            self._tasks[record.partition] = asyncio.create_task(self._run(record.partition, queue))
        metrics.child(metrics.LANE_QUEUE_DEPTH, str(record.partition)).inc()
        queue.put_nowait((ticket, work, window, time.perf_counter()))

    async def _run(self, partition: int, queue: asyncio.Queue[Item | None]) -> None:
        label = str(partition)
        while True:
            item = await queue.get()
            if item is None:
                return
            await self._process(item, label, partition)

    async def stop(self) -> None:
        for queue in self._queues.values():
            queue.put_nowait(None)
        for task in self._tasks.values():
            with contextlib.suppress(BaseException):
                await task
        self._queues.clear()
        self._tasks.clear()


class KeyLanes(_SchedulerBase):
    """One serial lane per (partition, key); keys of a partition run concurrently."""

    def __init__(
        self,
        *,
        max_in_flight: int,
        worker_max_in_flight: int,
        window: int | None = None,
    ) -> None:
        if max_in_flight < 1 or worker_max_in_flight < 1:
            raise ValueError("max_in_flight and worker_max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self._flow = _Flow(window or WINDOW_PER_IN_FLIGHT * max_in_flight)
        self._worker_slots = asyncio.Semaphore(worker_max_in_flight)
        self._partition_slots: dict[int, asyncio.Semaphore] = {}
        self._lanes: dict[tuple[int, bytes], deque[Item]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = set()
        self._revoking = {}

    async def submit(self, record: LaneRecord, work: Job, ack: Job, release: Job | None = None) -> None:
        self.check()
        window, ticket = await self._flow.admit(record, ack, release or _nothing)
        lane_id = (record.partition, record.key or b"")
        lane = self._lanes.get(lane_id)
        item = (ticket, work, window, time.perf_counter())
        metrics.child(metrics.LANE_QUEUE_DEPTH, str(record.partition)).inc()
        if lane is not None:
            lane.append(item)  # the lane's task will get to it, in order
            return
        self._lanes[lane_id] = deque([item])
        # The task leaves ``_tasks`` as its lane ends, not through a done callback: that
        # would be one more turn of the event loop for nearly every record.
        self._tasks.add(asyncio.create_task(self._run(lane_id)))

    async def _run(self, lane_id: tuple[int, bytes]) -> None:
        partition = lane_id[0]
        label = str(partition)
        slots = self._partition_slots.get(partition)
        if slots is None:
            slots = self._partition_slots[partition] = asyncio.Semaphore(self.max_in_flight)
        lane = self._lanes[lane_id]
        try:
            while lane:
                slot = _Slot(slots, self._worker_slots)
                await slot.acquire()
                token = _current_slot.set(slot)  # the job runs in this task: see leave_slot
                try:
                    await self._process(lane[0], label, lane_id)
                finally:
                    _current_slot.reset(token)
                    slot.release()
                lane.popleft()
            del self._lanes[lane_id]
        finally:
            self._tasks.discard(asyncio.current_task())

    async def stop(self) -> None:
        while self._tasks:
            with contextlib.suppress(BaseException):
                await asyncio.gather(*list(self._tasks))
            # A task cancelled before its first step never ran the ``finally`` that removes it.
            self._tasks = {task for task in self._tasks if not task.done()}
