"""Every activation's timeout on one event-loop timer, instead of one timer each.

``asyncio.timeout`` schedules a timer handle per ``async with`` and cancels it at the exit;
a cancelled handle stays in the loop's heap until the loop runs and prunes it. An
activation that never waits (a no-op agent, a cache hit, a suspension) paid for a heap push,
a handle and, while the loop did not get to prune, an ever larger heap: back-to-back
suspension round trips slowed down as they ran.

All activations of one runtime share ``activation_timeout_s``, so their deadlines fall due in
the order they start. ``ActivationDeadlines`` keeps the running ones in start order and arms
one timer, for the oldest; when it fires, every activation past its deadline expires (its
task is cancelled, and the block's exit turns that cancellation into ``TimeoutError`` with
``expired()`` true, by the same rule as ``asyncio.Timeout``), and the timer moves to the
next oldest.

The block is a plain ``with``: asyncio.Timeout's ``async with`` made four coroutines per
activation (its own enter and exit, and a wrapper's), 2-3 µs of a suspension round trip.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class ActivationDeadline:
    """One activation's ``with`` block, registered with ``ActivationDeadlines`` while it runs.
    Expiring it cancels the task; the exit turns that cancellation, and only that one, into
    ``TimeoutError`` (asyncio.Timeout's rule: a cancellation from outside stays one)."""

    __slots__ = ("_cancelling", "_expired", "_task", "_watch")

    def __init__(self, watch: ActivationDeadlines) -> None:
        self._watch = watch
        self._expired = False

    def __enter__(self) -> ActivationDeadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("an activation deadline is entered inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._watch._enter(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self._watch._leave(self)
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc_val

    def expired(self) -> bool:
        """Whether the block's deadline passed (its TimeoutError is the deadline's)."""
        return self._expired

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()


class ActivationDeadlines:
    """The timeouts of one runtime's activations, each ``timeout_s`` after its start."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # Insertion-ordered: the first entry is the oldest running activation, the next due.
        self._running: dict[ActivationDeadline, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def timeout(self) -> ActivationDeadline:
        """``with deadlines.timeout() as deadline:`` inside a task, like ``async with
        asyncio.timeout(timeout_s)``."""
        return ActivationDeadline(self)

    def __len__(self) -> int:
        return len(self._running)

    def _enter(self, deadline: ActivationDeadline) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A runtime used from a new event loop: what ran on the old one cannot run again.
            if self._timer is not None:
                self._timer.cancel()
            self._running.clear()
            self._loop, self._timer = loop, None
        due = loop.time() + self.timeout_s
        self._running[deadline] = due
        if self._timer is None:
            self._timer = loop.call_at(due, self._expire)

    def _leave(self, deadline: ActivationDeadline) -> None:
        self._running.pop(deadline, None)

    def _expire(self) -> None:
        """Expire every running activation past its deadline, then arm for the next one."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        while self._running:
            deadline, due = next(iter(self._running.items()))
            if due > now:
                self._timer = loop.call_at(due, self._expire)
                return
            del self._running[deadline]
            deadline._expire()
