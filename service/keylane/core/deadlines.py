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

An activation that never waits needs no deadline at all: no timer can interrupt code that
does not yield to the loop, so ``asyncio.timeout`` could not have fired inside it either.
``first_step`` runs an agent's coroutine up to its first wait (a model call, a tool, a
sleep); one that finishes before it (a suspension that stages an intent, a replay-cache hit,
a resume that completes) is done without the block. One that waits hands back the rest of its
run (``Awaiting``), which the caller awaits inside the block, entered with the time the first
step took already spent (``timeout(elapsed_s=...)``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator
from types import CoroutineType, TracebackType
from typing import Any, cast


class ActivationDeadline:
    """One activation's ``with`` block, registered with ``ActivationDeadlines`` while it runs.
    Expiring it cancels the task; the exit turns that cancellation, and only that one, into
    ``TimeoutError`` (asyncio.Timeout's rule: a cancellation from outside stays one)."""

    __slots__ = ("_cancelling", "_elapsed_s", "_expired", "_task", "_watch")

    def __init__(self, watch: ActivationDeadlines, elapsed_s: float) -> None:
        self._watch = watch
        self._expired = False
        self._elapsed_s = elapsed_s

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

    def timeout(self, *, elapsed_s: float = 0.0) -> ActivationDeadline:
        """``with deadlines.timeout() as deadline:`` inside a task, like ``async with
        asyncio.timeout(timeout_s)``; ``elapsed_s`` of the timeout already spent."""
        return ActivationDeadline(self, elapsed_s)

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
        # Start order is still due order: an activation's first step runs to its end (and its
        # block's entry) before any other activation can start.
        due = loop.time() + self.timeout_s - deadline._elapsed_s
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


class Awaiting:
    """The rest of a coroutine whose first step yielded ``first`` to the loop: awaiting this
    hands ``first`` to the task, then drives the coroutine as the task would, each resumption
    and each exception thrown in (a cancellation) passed on, and returns what it returns."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, None, Any]:
        coro, yielded = self._coro, self._first
        while True:
            try:
                yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancellation, or any throw, goes to the coroutine
                try:
                    yielded = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                yielded = coro.send(None)
            except StopIteration as done:
                return done.value


def first_step(awaitable: Awaitable[Any]) -> Any:
    """What ``awaitable`` returns when it finishes without waiting (its exception, when it
    raises), else an ``Awaiting`` of the rest. An awaitable that is not a coroutine (a
    Future, an object with ``__await__``) is stepped inside one."""
    if type(awaitable) is CoroutineType:
        # Quoted: cast's first argument is evaluated, and a subscripted ABC is built per call.
        coro = cast("Coroutine[Any, Any, Any]", awaitable)
    else:
        coro = _awaited(awaitable)
    try:
        first = coro.send(None)
    except StopIteration as done:
        return done.value
    return Awaiting(coro, first)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
