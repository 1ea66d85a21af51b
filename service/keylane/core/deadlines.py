"""Every activation's timeout on one event-loop timer, instead of one timer each.

``asyncio.timeout`` schedules a timer handle per ``async with`` and cancels it at the exit;
a cancelled handle stays in the loop's heap until the loop runs and prunes it. An
activation that never waits (a no-op agent, a cache hit, a suspension) paid for a heap push,
a handle and, while the loop did not get to prune, an ever larger heap: back-to-back
suspension round trips slowed down as they ran.

All activations of one runtime share ``activation_timeout_s``, so their deadlines fall due in
the order they start. ``ActivationDeadlines`` keeps the running ones in start order and arms
one timer, for the oldest; when it fires, every activation past its deadline gets asyncio's
own expiry (``asyncio.Timeout.reschedule`` to now: the task is cancelled, and the
``async with`` turns that into ``TimeoutError`` with ``expired()`` true, exactly as
``asyncio.timeout`` would), and the timer moves to the next oldest.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class ActivationDeadline:
    """One activation's ``async with``: an ``asyncio.Timeout`` entered with no deadline of its
    own, registered with ``ActivationDeadlines`` while the block runs."""

    __slots__ = ("_timeout", "_watch")

    def __init__(self, watch: ActivationDeadlines) -> None:
        self._timeout = asyncio.Timeout(None)
        self._watch = watch

    async def __aenter__(self) -> ActivationDeadline:
        await self._timeout.__aenter__()
        self._watch._enter(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self._watch._leave(self)
        await self._timeout.__aexit__(exc_type, exc_val, exc_tb)

    def expired(self) -> bool:
        """Whether the block's deadline passed (its TimeoutError is the deadline's)."""
        return self._timeout.expired()

    def _expire(self, now: float) -> None:
        self._timeout.reschedule(now)  # asyncio's own expiry: cancels the task, TimeoutError at exit


class ActivationDeadlines:
    """The timeouts of one runtime's activations, each ``timeout_s`` after its start."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # Insertion-ordered: the first entry is the oldest running activation, the next due.
        self._running: dict[ActivationDeadline, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def timeout(self) -> ActivationDeadline:
        """``async with deadlines.timeout() as deadline:`` like ``asyncio.timeout(timeout_s)``."""
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
            deadline._expire(now)
