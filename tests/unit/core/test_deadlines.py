"""ActivationDeadlines: asyncio.timeout's behaviour for every activation, on one loop timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from keylane import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.catalog import ERRORS
from keylane.core.deadlines import ActivationDeadline, ActivationDeadlines, Awaiting, first_step
from keylane.testing import AgentHarness


async def test_a_block_past_its_deadline_raises_timeout_error_and_says_it_expired() -> None:
    deadlines = ActivationDeadlines(0.05)
    with pytest.raises(TimeoutError), deadlines.timeout() as deadline:
        await asyncio.sleep(5)
    assert deadline.expired()
    assert len(deadlines) == 0


async def test_a_timeout_error_raised_inside_the_block_is_not_an_expiry() -> None:
    deadlines = ActivationDeadlines(30)
    with pytest.raises(TimeoutError), deadlines.timeout() as deadline:
        raise TimeoutError("the agent's own")
    assert not deadline.expired()


async def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    deadlines = ActivationDeadlines(30)
    entered = asyncio.Event()

    async def block() -> None:
        with deadlines.timeout():
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(block())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(deadlines) == 0


async def test_blocks_expire_in_start_order_each_at_its_own_deadline() -> None:
    deadlines = ActivationDeadlines(0.2)
    loop = asyncio.get_running_loop()
    ended: dict[str, float] = {}

    async def block(name: str) -> None:
        started = loop.time()
        try:
            with deadlines.timeout():
                await asyncio.sleep(5)
        except TimeoutError:
            ended[name] = loop.time() - started

    first = asyncio.create_task(block("first"))
    await asyncio.sleep(0.1)
    second = asyncio.create_task(block("second"))
    await asyncio.wait_for(asyncio.gather(first, second), timeout=5)
    # Each ran its full 0.2 s: the second was not expired with the first.
    assert ended["first"] >= 0.19
    assert ended["second"] >= 0.19


async def test_blocks_that_end_in_time_leave_one_timer_at_most() -> None:
    deadlines = ActivationDeadlines(30)
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    for _ in range(1_000):
        with deadlines.timeout():
            pass  # an activation that never waits: the loop does not run in between
    assert len(deadlines) == 0
    # asyncio.timeout leaves 1,000 cancelled handles in the heap here, until the loop runs.
    assert len(loop._scheduled) <= before + 1  # type: ignore[attr-defined]


async def slow_agent(ctx: ActivationContext) -> Complete:
    await asyncio.sleep(5)
    return Complete(output=b"never")


def test_a_runtime_times_out_activations_on_every_event_loop_it_runs_on() -> None:
    harness = AgentHarness(slow_agent, AgentConfig(activation_timeout_s=0.05))

    async def one() -> object:
        decision = await asyncio.wait_for(harness.send_event(b"key", "x"), timeout=5)
        (emit,) = decision.emits
        return emit.topic

    # Two loops one after the other: the timer armed on the first does not strand the second.
    assert asyncio.run(one()) == asyncio.run(one()) == ERRORS


async def test_an_outside_cancellation_of_an_expired_block_stays_a_cancellation() -> None:
    """asyncio.Timeout's rule: TimeoutError only when the deadline's cancellation is the only one."""
    deadlines = ActivationDeadlines(30)
    entered: asyncio.Future[ActivationDeadline] = asyncio.get_running_loop().create_future()

    async def block() -> None:
        with deadlines.timeout() as deadline:
            entered.set_result(deadline)
            await asyncio.sleep(5)

    task = asyncio.create_task(block())
    deadline = await entered
    deadline._expire()  # the deadline fell due ...
    task.cancel()  # ... as the worker was stopping the job
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadline.expired()


async def test_a_coroutine_that_finishes_without_waiting_is_done_at_its_first_step() -> None:
    async def at_once() -> str:
        return "done"

    assert first_step(at_once()) == "done"


async def test_a_first_step_that_raises_raises_at_once() -> None:
    async def failing() -> str:
        raise ValueError("agent bug")

    with pytest.raises(ValueError, match="agent bug"):
        first_step(failing())


async def test_the_rest_of_a_waiting_coroutine_runs_when_awaited_and_returns_its_value() -> None:
    steps: list[str] = []

    async def waits() -> str:
        steps.append("first")
        await asyncio.sleep(0)
        steps.append("second")
        await asyncio.sleep(0.01)
        return "done"

    rest = first_step(waits())
    assert type(rest) is Awaiting
    assert steps == ["first"]
    assert await rest == "done"
    assert steps == ["first", "second"]


async def test_an_exception_after_a_wait_reaches_the_awaiter() -> None:
    async def fails_later() -> str:
        await asyncio.sleep(0)
        raise KeyError("later")

    with pytest.raises(KeyError, match="later"):
        await first_step(fails_later())


async def test_a_cancellation_of_the_rest_reaches_the_coroutine_which_may_clean_up() -> None:
    cleaned = asyncio.Event()
    entered = asyncio.Event()

    async def agent() -> str:
        try:
            await asyncio.sleep(0)
            entered.set()
            await asyncio.sleep(5)
        finally:
            cleaned.set()
        return "never"

    async def runner() -> str:
        result: str = await first_step(agent())
        return result

    task = asyncio.create_task(runner())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


async def test_a_cancellation_the_coroutine_swallows_lets_it_finish() -> None:
    async def agent() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "recovered"
        return "slept"

    async def runner() -> str:
        result: str = await first_step(agent())
        return result

    task = asyncio.create_task(runner())
    await asyncio.sleep(0.01)
    task.cancel()
    assert await task == "recovered"


async def test_an_awaitable_that_is_not_a_coroutine_is_awaited_whole() -> None:
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    rest = first_step(future)
    asyncio.get_running_loop().call_later(0.01, future.set_result, "resolved")
    assert await rest == "resolved"


def test_a_long_first_step_counts_against_the_activation_timeout() -> None:
    """The timer cannot interrupt a first step that does not wait; the time it took is spent
    all the same, so the first wait after it is past the deadline at once."""

    async def busy_then_waits(ctx: ActivationContext) -> Complete:
        time.sleep(0.2)  # noqa: ASYNC251 - blocks the loop, as a CPU-bound agent would, past its timeout
        await asyncio.sleep(1)
        return Complete(output=b"never")

    harness = AgentHarness(busy_then_waits, AgentConfig(activation_timeout_s=0.1))

    async def one() -> tuple[list[str], float]:
        started = time.monotonic()
        decision = await asyncio.wait_for(harness.send_event(b"key", "x"), timeout=5)
        return [e.topic for e in decision.emits], time.monotonic() - started

    topics, took = asyncio.run(one())
    assert topics == [ERRORS]
    assert [e.reason for e in harness.errors()] == ["activation_timeout"]
    assert took < 0.9  # expired at the first wait, not after the agent's whole second


def test_an_agent_that_never_waits_is_not_timed_out_however_long_it_runs() -> None:
    """As under asyncio.timeout: no timer runs inside code that does not yield to the loop."""

    async def busy(ctx: ActivationContext) -> Complete:
        time.sleep(0.2)  # noqa: ASYNC251 - a CPU-bound agent, on purpose
        return Complete(output=b"done")

    harness = AgentHarness(busy, AgentConfig(activation_timeout_s=0.1))
    asyncio.run(harness.send_event(b"key", "x"))
    assert harness.outputs() == [(b"key", b"done")]
    assert harness.runtime.deadlines._running == {}


async def test_a_block_entered_late_expires_when_the_time_already_spent_runs_out() -> None:
    deadlines = ActivationDeadlines(30)
    with pytest.raises(TimeoutError), deadlines.timeout(elapsed_s=29.95) as deadline:
        await asyncio.wait_for(asyncio.sleep(10), timeout=5)  # 30 s without the time spent
    assert deadline.expired()
