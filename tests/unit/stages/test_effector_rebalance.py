"""A rebalance never re-runs a tool: the effector's revocation grace covers its longest tool
attempt, a running attempt records Done and publishes before the partition is handed over,
and no attempt starts once a revocation has begun."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from keylane.authoring.tools import ToolRegistry
from keylane.catalog import INTENTS, load_catalog
from keylane.config import Settings
from keylane.core.lanes import LaneRecord
from keylane.kafka.app import build_app
from keylane.kafka.offset_guard import REBALANCE_GRACE_S
from keylane.stages.effector.claims import ClaimRecord, ClaimStore, Done
from keylane.stages.effector.handler import IntentHandler, revocation_grace_s
from keylane.stages.effector.service import Effector, EffectorLanes
from keylane.wire import ToolIntent, ToolResult, decode, encode
from tests.unit.stages.test_effector_handler import HOME, KEY, PARTITIONS, TOPIC, FakeIO, Message

DEFAULT_TIMEOUT_S = 60.0


def effector_with(
    registry: ToolRegistry, tmp_path: Path, *, tool_timeout_s: float = DEFAULT_TIMEOUT_S
) -> Effector:
    settings = Settings.from_env({}, data_dir=tmp_path)
    catalog = load_catalog()
    app = build_app(settings, catalog, partitions=catalog[INTENTS].partitions)
    return Effector(app, catalog, registry, tool_timeout_s=tool_timeout_s)


def test_the_revocation_grace_covers_the_default_tool_timeout(tmp_path: Path) -> None:
    registry = ToolRegistry()
    registry.register("refund", lambda args: None, side_effect=True)

    effector = effector_with(registry, tmp_path)

    assert REBALANCE_GRACE_S < DEFAULT_TIMEOUT_S, "the worker's grace would cancel a running tool"
    assert effector.offsets.grace_s > DEFAULT_TIMEOUT_S
    conf = effector.app.conf
    assert conf.broker_rebalance_timeout > effector.offsets.grace_s, "the group waits out the grace"
    assert conf.broker_request_timeout > conf.broker_rebalance_timeout, "and so does a JoinGroup request"


def test_the_revocation_grace_covers_the_longest_tool_attempt(tmp_path: Path) -> None:
    registry = ToolRegistry()
    registry.register("refund", lambda args: None, side_effect=True, timeout_s=120)
    registry.register(
        "ship", lambda args: None, side_effect=True, timeout_s=70, reconcile=lambda intent_id: None
    )  # reconcile, then the run it may allow: 140 s
    registry.register("lookup", lambda args: None, timeout_s=600)  # read-only: never an intent

    effector = effector_with(registry, tmp_path)

    assert 140 < effector.offsets.grace_s < 600
    assert effector.app.conf.broker_rebalance_timeout > effector.offsets.grace_s


@dataclass
class SlowRig:
    """A handler whose one tool takes ``seconds``, in EffectorLanes, over a dict claim table."""

    handler: IntentHandler
    lanes: EffectorLanes
    registry: ToolRegistry
    table: dict[bytes, bytes]
    io: FakeIO
    started: asyncio.Event
    runs: list[str]

    def grace_s(self) -> float:
        return revocation_grace_s(self.registry.specs(), 1.0)


def slow_rig(seconds: float) -> SlowRig:
    started = asyncio.Event()
    runs: list[str] = []

    async def ship(args: Any, *, intent_id: str) -> str:
        runs.append(intent_id)  # the side effect happens at the start, as with most real tools
        started.set()
        await asyncio.sleep(seconds)
        return "shipped"

    registry = ToolRegistry()
    registry.register("ship", ship, side_effect=True, timeout_s=1.0)
    lanes = EffectorLanes()
    io = FakeIO([])
    table: dict[bytes, bytes] = {}
    handler = IntentHandler(
        registry,
        ClaimStore(table),
        io,
        partitions=PARTITIONS,
        tool_timeout_s=1.0,
        revoking=lambda: lanes.revoking,
    )
    return SlowRig(handler, lanes, registry, table, io, started, runs)


def ship_intent() -> ToolIntent:
    now = time.time_ns() // 1_000_000
    return ToolIntent(
        intent_id="i-ship",
        entity_key=KEY.decode(),
        seq=0,
        step_index=0,
        tool="ship",
        args_json="{}",
        created_at_ms=now,
        expires_at_ms=now + 600_000,
    )


async def submit(
    lanes: EffectorLanes, handler: IntentHandler, intent: ToolIntent, offset: int, settled: dict[int, str]
) -> None:
    message = Message(TOPIC, HOME, offset, KEY, encode(intent))

    async def work() -> None:
        await handler.handle(message)

    async def ack() -> None:
        settled[offset] = "acked"

    async def release() -> None:
        settled[offset] = "released"

    await lanes.submit(LaneRecord(TOPIC, HOME, offset, KEY), work, ack, release)


async def test_a_revocation_lets_a_running_tool_finish_record_done_and_publish() -> None:
    rig = slow_rig(0.2)
    settled: dict[int, str] = {}
    await submit(rig.lanes, rig.handler, ship_intent(), 0, settled)
    await rig.started.wait()

    abandoned = await rig.lanes.revoke(rig.grace_s())

    assert (abandoned, settled) == (0, {0: "acked"})
    [result] = rig.io.result_bytes()
    assert decode(result, ToolResult).status == "OK"
    stored = ClaimStore(rig.table).claim("i-ship", now_ms=time.time_ns() // 1_000_000, lease_ms=1)
    assert stored == Done(result), "Done is in the table (its changelog) before the hand-over"

    # The partition's next owner restores that table and is handed the intent again.
    next_owner = IntentHandler(
        rig.registry, ClaimStore(dict(rig.table)), rig.io, partitions=PARTITIONS, tool_timeout_s=1.0
    )
    await next_owner.handle(Message(TOPIC, HOME, 0, KEY, encode(ship_intent())))
    assert rig.runs == ["i-ship"], "the tool ran once"
    assert rig.io.result_bytes() == [result, result]


async def test_a_grace_shorter_than_the_tool_would_leave_the_intent_claimed_without_done() -> None:
    # Why the grace must cover the tool: cancelled mid-tool, the attempt records nothing, and
    # the next owner can only wait out the lease and find the intent in doubt.
    rig = slow_rig(0.5)
    settled: dict[int, str] = {}
    await submit(rig.lanes, rig.handler, ship_intent(), 0, settled)
    await rig.started.wait()

    abandoned = await rig.lanes.revoke(0.05)

    assert (abandoned, settled, rig.runs, rig.io.results()) == (1, {0: "released"}, ["i-ship"], [])
    assert msgspec.msgpack.decode(rig.table[b"i-ship"], type=ClaimRecord).state == "claimed"


async def test_no_attempt_starts_once_a_revocation_has_begun() -> None:
    rig = slow_rig(0.0)
    now = time.time_ns() // 1_000_000
    held = ClaimRecord(state="claimed", claimed_at_ms=now, lease_until_ms=now + 60_000)
    rig.table[b"i-ship"] = msgspec.msgpack.encode(held)  # a previous owner's live lease
    waiting = asyncio.Event()

    async def short_sleep(seconds: float) -> None:
        waiting.set()
        await asyncio.sleep(0.01)

    rig.handler.sleep = short_sleep
    settled: dict[int, str] = {}
    await submit(rig.lanes, rig.handler, ship_intent(), 0, settled)
    await waiting.wait()

    began = time.monotonic()
    abandoned = await rig.lanes.revoke(rig.grace_s())

    assert time.monotonic() - began < 1.0, "a waiting record does not hold the rebalance"
    assert (abandoned, settled) == (1, {0: "released"}), "left, uncommitted, to the next owner"
    assert rig.table[b"i-ship"] == msgspec.msgpack.encode(held), "nothing claimed"
    assert rig.runs == [] and rig.io.published == []
