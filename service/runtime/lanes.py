"""Lane scheduling: the one seam that decides which inputs may run concurrently.

A lane runs its jobs one at a time, in submission order. ``PartitionLanes`` makes the
partition number the lane: every input of partition p (events, results, approvals of the
co-partitioned topics) runs serially, and different partitions run in parallel. A
key-ordered mode (per-key lanes inside a partition) implements the same Protocol.

Jobs own their acknowledgement: a job acks its record after its effects are staged, so
within a lane acks happen in offset order and Faust never commits past unfinished work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

log = logging.getLogger(__name__)

Job = Callable[[], Awaitable[None]]
LANE_QUEUE_SIZE = 256


class LaneScheduler(Protocol):
    """Runs jobs so that jobs of one lane never overlap and keep their order."""

    async def submit(self, partition: int, key: bytes | None, job: Job) -> None:
        """Queue ``job``; may wait when the lane's queue is full (backpressure)."""
        ...

    async def stop(self) -> None:
        """Finish queued jobs, then stop every lane."""
        ...


class PartitionLanes:
    """One serial lane per partition number; lanes run concurrently."""

    def __init__(self, *, queue_size: int = LANE_QUEUE_SIZE) -> None:
        self._queue_size = queue_size
        self._queues: dict[int, asyncio.Queue[Job | None]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.failure: BaseException | None = None

    async def submit(self, partition: int, key: bytes | None, job: Job) -> None:
        if self.failure is not None:
            raise RuntimeError("a lane failed; the worker must restart") from self.failure
        queue = self._queues.get(partition)
        if queue is None:
            queue = self._queues[partition] = asyncio.Queue(self._queue_size)
            self._tasks[partition] = asyncio.create_task(
                self._run(partition, queue), name=f"lane-{partition}"
            )
        await queue.put(job)

    async def _run(self, partition: int, queue: asyncio.Queue[Job | None]) -> None:
        while True:
            job = await queue.get()
            if job is None:
                return
            try:
                await job()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                # A job that raises is a keylane bug or fatal state (e.g. a corrupt blob):
                # stop taking work so nothing is acked past it; the worker crashes and restarts.
                self.failure = exc
                log.exception("lane %s failed; no further records are processed", partition)
                raise

    async def stop(self) -> None:
        for queue in self._queues.values():
            await queue.put(None)
        for task in self._tasks.values():
            with contextlib.suppress(BaseException):
                await task
        self._queues.clear()
        self._tasks.clear()
