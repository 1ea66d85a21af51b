"""ActivationDeadlines: asyncio.timeout's behaviour for every activation, on one loop timer."""

from __future__ import annotations

import asyncio

import pytest

from keylane import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.catalog import ERRORS
from keylane.core.deadlines import ActivationDeadline, ActivationDeadlines
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
