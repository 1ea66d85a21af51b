"""The Faust internals keylane patches are checked against the installed faust-streaming."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import faust
import mode
import pytest
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.drivers.aiokafka import Consumer as DriverConsumer

from keylane.errors import ConfigError
from keylane.kafka import patches

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_every_patched_attribute_exists_on_the_installed_faust() -> None:
    patches.check_patchable(patches.PATCHED)  # what importing the module already did


def test_a_missing_attribute_fails_naming_the_installed_version_and_the_pinned_range() -> None:
    class Consumer:
        perform_seek = None

    with pytest.raises(ConfigError) as raised:
        patches.check_patchable([(Consumer, "perform_seek"), (Consumer, "_drain_messages")])

    message = str(raised.value)
    assert "Consumer._drain_messages" in message and "perform_seek" not in message
    assert faust.__version__ in message and patches.FAUST_PIN in message


def test_the_pinned_range_is_the_one_pyproject_pins() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert f"faust-streaming{patches.FAUST_PIN}" in dependencies


async def test_a_publish_through_a_running_producer_does_not_wait_for_the_event_loop() -> None:
    """mode's stampede wrapper around Faust's producer start awaited three turns of the event
    loop on every send; with the producer running, the patched lookup returns it at once."""
    patches.publish_without_stampede()
    app = faust.App("publish-without-stampede", broker="kafka://127.0.0.1:1")
    producer = app.producer
    producer._started.set()  # what Faust's start sets; no broker needed to look the producer up
    topic = app.topic("t")
    turns: list[int] = []
    asyncio.get_running_loop().call_soon(turns.append, 1)

    assert await topic._get_producer() is producer
    assert turns == [], "the lookup waited for the event loop"


class FetchLoop(mode.Service):
    """What Faust's Consumer.wait_first reads of its consumer: a mode Service's stopped and
    crashed events, and the consumer's suspend_flow. A real consumer would start a thread
    with its own event loop when built; the method under test is the Consumer class's."""

    def __init__(self) -> None:
        super().__init__()
        self.suspend_flow = asyncio.Event()

    def wait_first(self, *coros: Any, **options: Any) -> Any:
        return FaustConsumer.wait_first(self, *coros, **options)


@pytest.fixture
def consumer() -> FetchLoop:
    patches.deliver_without_tasks()
    return FetchLoop()


async def test_every_consumer_faust_runs_reaches_the_delivery_patch() -> None:
    patches.deliver_without_tasks()
    assert DriverConsumer.wait_first is FaustConsumer.wait_first
    assert FaustConsumer.wait_first.__qualname__.endswith("deliver_first")


async def test_a_delivery_that_ends_at_its_first_step_runs_at_once_without_a_task(consumer: Any) -> None:
    delivered: list[str] = []

    async def deliver() -> str:
        delivered.append("record")
        return "delivered"

    turns: list[int] = []
    asyncio.get_running_loop().call_soon(turns.append, 1)
    result = await consumer.wait_first(deliver(), consumer.suspend_flow.wait())
    assert delivered == ["record"]
    assert (result.results, result.stopped) == (["delivered"], False)
    assert turns == [], "the delivery waited for a turn of the event loop"


async def test_a_delivery_that_waits_goes_on_until_it_ends(consumer: Any) -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def deliver() -> str:
        await asyncio.sleep(0)  # a bare yield, then a future
        return await gate

    waiting = asyncio.ensure_future(consumer.wait_first(deliver(), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    gate.set_result("queued")
    result = await asyncio.wait_for(waiting, 5)
    assert (result.results, result.stopped) == (["queued"], False)


async def test_a_flow_suspended_while_a_delivery_waits_cancels_the_delivery(consumer: Any) -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def deliver() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    waiting = asyncio.ensure_future(consumer.wait_first(deliver(), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    consumer.suspend_flow.set()
    result = await asyncio.wait_for(waiting, 5)
    await asyncio.sleep(0.01)
    assert result.results == [True]  # the suspend won, as with Faust's own race
    assert seen == ["cancelled"]
    assert gate.cancelled()


async def test_a_cancel_after_what_the_delivery_waited_on_ended_still_reaches_it(consumer: Any) -> None:
    """Cancelled in the same turn its future got a result: as in an asyncio Task, the
    coroutine gets the CancelledError, not the result."""
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def deliver() -> None:
        try:
            seen.append(await gate)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    waiting = asyncio.ensure_future(consumer.wait_first(deliver(), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    gate.set_result("late")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await asyncio.sleep(0.01)
    assert seen == ["cancelled"]


async def test_an_error_at_the_first_step_is_raised_to_the_fetch_loop(consumer: Any) -> None:
    async def deliver() -> None:
        raise ValueError("undecodable")

    with pytest.raises(ValueError, match="undecodable"):
        await consumer.wait_first(deliver(), consumer.suspend_flow.wait())


async def test_with_the_flow_suspended_already_faust_decides(consumer: Any) -> None:
    delivered: list[str] = []

    async def deliver() -> None:
        await asyncio.sleep(0.05)
        delivered.append("record")

    consumer.suspend_flow.set()
    result = await asyncio.wait_for(consumer.wait_first(deliver(), consumer.suspend_flow.wait()), 5)
    await asyncio.sleep(0.1)
    assert result.results == [True]
    assert delivered == []  # Faust's race cancelled the delivery


async def test_the_table_manager_starts_its_tables_and_their_recovery_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The two steps of Faust's own on_start, in its order, without its one-second sleep
    first (each worker start in the broker tests runs the real ones)."""
    patches.start_tables_at_once()
    tables = faust.App("tables-at-once-test").tables
    steps: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def update_channels() -> None:
        steps.append(("tables registered", loop.time()))

    async def start_recovery() -> None:
        steps.append(("recovery started", loop.time()))

    monkeypatch.setattr(tables, "_update_channels", update_channels)
    monkeypatch.setattr(tables.recovery, "start", start_recovery)
    began = loop.time()
    await tables.on_start()
    assert [step for step, _ in steps] == ["tables registered", "recovery started"]
    assert steps[-1][1] - began < 0.5


def loop_turns() -> list[int]:
    """A counter of the running loop's turns: a callback that schedules itself again."""
    loop = asyncio.get_running_loop()
    turns = [0]

    def tick() -> None:
        turns[0] += 1
        loop.call_soon(tick)

    loop.call_soon(tick)
    return turns


STREAM_RUNS = """
import asyncio, json, faust
from keylane.kafka import patches
from tests.unit.kafka.test_patches import loop_turns

async def main():
    patches.feed_in_runs()
    app = faust.App("stream-runs-test", loop=asyncio.get_running_loop())
    app.flow_control.resume()
    stream = app.stream(app.channel())
    records = stream.__aiter__()
    first = asyncio.ensure_future(records.__anext__())
    await asyncio.sleep(0.05)  # the stream waits on its empty queue
    count = 4 * patches.STREAM_RUN
    for value in range(count):
        await stream.channel.put(value)
    values = [await first]
    turns = loop_turns()
    seen = [(await records.__anext__(), turns[0]) for _ in range(count - 1)]
    values += [value for value, _ in seen]
    print(json.dumps({"values": values, "turns": len({turn for _, turn in seen})}))

asyncio.run(main())
"""


def test_a_faust_stream_hands_over_a_run_of_queued_records_per_turn_of_the_loop() -> None:
    """Faust's compiled stream iterator, over a real channel, in a process of its own (the
    stream starts the app's consumer thread and its loop): 127 queued records come out in
    order in 5 turns of the loop (Faust's own iterator takes 127, one per record)."""
    run = subprocess.run(
        [sys.executable, "-c", STREAM_RUNS], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    count = 4 * patches.STREAM_RUN
    assert seen["values"] == list(range(count))
    assert seen["turns"] <= count // patches.STREAM_RUN + 1


async def test_the_stream_sleep_turns_the_loop_once_a_run_and_leaves_other_delays_to_asyncio() -> None:
    sleep = patches._TurnEveryRun(3)
    turns = loop_turns()
    for _ in range(9):
        assert await sleep(0) is None
    assert turns[0] == 3
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await sleep(0.05, "woke") == "woke"
    assert loop.time() - began >= 0.05


def test_build_app_gives_faust_s_compiled_stream_iterator_the_run_sleep() -> None:
    import faust._cython.streams as compiled  # the iterator Faust's wheels build

    from keylane.catalog import load_catalog
    from keylane.config import Settings
    from keylane.kafka.app import build_app

    build_app(Settings.from_env({}), load_catalog())
    assert isinstance(compiled.sleep, patches._TurnEveryRun)
