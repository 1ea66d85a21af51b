"""The effector's per-intent decisions (service/keylane/stages/effector/handler.py), with a manual clock, a
dict-backed claim store and an in-memory Kafka side: routing, expiry, in-doubt intents,
signed results, dead letters, and the order in which an answer reaches the producer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from prometheus_client import REGISTRY

from keylane.authoring.tools import ToolRegistry
from keylane.core.lanes import Superseded
from keylane.kafka.partitioner import expected_partition
from keylane.records import ORIGIN_HEADER, Emit
from keylane.signing import Keyring
from keylane.stages.effector.claims import ClaimRecord, ClaimStore, Done
from keylane.stages.effector.handler import (
    EXPIRY_MARGIN_MS,
    LEASE_MARGIN_MS,
    UNKNOWN_TOOL_WAIT_S,
    Abandoned,
    Headers,
    IntentHandler,
)
from keylane.testing import ManualClock
from keylane.wire import ErrorRecord, ToolIntent, ToolResult, decode, encode

PARTITIONS = 6
TOPIC = "agent.intents"
KEY = b"acct-7#0"
HOME = expected_partition(KEY, PARTITIONS)
ELSEWHERE = (HOME + 1) % PARTITIONS
START_MS = 1_700_000_000_000
TTL_MS = 60_000
TOOL_TIMEOUT_S = 5.0
LEASE_MS = int(TOOL_TIMEOUT_S * 1000) + LEASE_MARGIN_MS
KEYS = "2026-11:current-secret,2026-10:previous-secret"


@dataclass(frozen=True)
class Message:
    """What a consumer hands the effector for one agent.intents record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Rerouted:
    key: bytes
    value: bytes | None
    partition: int
    headers: Headers


@dataclass
class FakeIO:
    """The Kafka side, in memory. ``log`` interleaves what it saw with the claim writes."""

    log: list[str]
    published: list[Emit] = field(default_factory=list)
    rerouted: list[Rerouted] = field(default_factory=list)
    on_flush: Callable[[], None] = lambda: None

    async def publish(self, emit: Emit) -> None:
        self.log.append(f"publish {emit.topic}")
        self.published.append(emit)

    async def reroute(self, *, key: bytes, value: bytes | None, partition: int, headers: Headers) -> None:
        self.log.append("reroute")
        self.rerouted.append(Rerouted(key, value, partition, headers))

    async def flush(self) -> None:
        self.log.append("flush")
        self.on_flush()

    def results(self) -> list[ToolResult]:
        return [decode(e.value, ToolResult) for e in self.published if e.topic == "agent.results"]

    def result_bytes(self) -> list[bytes]:
        return [e.value for e in self.published if e.topic == "agent.results"]

    def errors(self) -> list[ErrorRecord]:
        return [decode(e.value, ErrorRecord) for e in self.published if e.topic == "agent.errors"]


class LoggedTable(dict[bytes, bytes]):
    """A claim table that notes each write in the shared log."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def __setitem__(self, key: bytes, value: bytes) -> None:
        state = msgspec.msgpack.decode(value, type=ClaimRecord).state
        self.log.append(f"write {state}")
        super().__setitem__(key, value)


@dataclass
class Rig:
    """A handler, its clock, claim table, Kafka side and the tool calls it made."""

    handler: IntentHandler
    clock: ManualClock
    table: LoggedTable
    io: FakeIO
    calls: list[tuple[dict[str, Any], str]]
    log: list[str]

    @property
    def claims(self) -> ClaimStore:
        return self.handler.claims

    async def deliver(self, intent: ToolIntent, *, partition: int = HOME, offset: int = 0, **kw: Any) -> None:
        value = kw.pop("value", encode(intent))
        message = Message(TOPIC, partition, offset, kw.pop("key", intent.entity_key.encode()), value, **kw)
        await self.handler.handle(message)

    def stale_claim(self, intent: ToolIntent, *, claimed_at_ms: int) -> None:
        """An earlier attempt's claim, as a crashed effector left it in the changelog."""
        record = ClaimRecord(
            state="claimed", claimed_at_ms=claimed_at_ms, lease_until_ms=claimed_at_ms + LEASE_MS
        )
        dict.__setitem__(self.table, intent.intent_id.encode(), msgspec.msgpack.encode(record))


def make_rig(
    registry: ToolRegistry | None = None, *, keyring: Keyring | None = None, signatures: Any = "off"
) -> Rig:
    log: list[str] = []
    calls: list[tuple[dict[str, Any], str]] = []
    clock = ManualClock(START_MS)
    if registry is None:
        registry = ToolRegistry()

        def refund(args: dict[str, Any], *, intent_id: str) -> dict[str, Any]:
            log.append("tool")
            calls.append((args, intent_id))
            return {"refunded": args["amount"]}

        registry.register("refund", refund, side_effect=True)

    async def sleep(seconds: float) -> None:  # waiting moves the manual clock, not real time
        clock.advance(int(seconds * 1000))

    table = LoggedTable(log)
    io = FakeIO(log)
    handler = IntentHandler(
        registry,
        ClaimStore(table),
        io,
        partitions=PARTITIONS,
        tool_timeout_s=TOOL_TIMEOUT_S,
        clock=clock,
        sleep=sleep,
        keyring=keyring,
        intent_signatures=signatures,
    )
    return Rig(handler, clock, table, io, calls, log)


def intent(
    *, intent_id: str = "i-1", tool: str = "refund", key: str = KEY.decode(), ttl_ms: int = TTL_MS
) -> ToolIntent:
    return ToolIntent(
        intent_id=intent_id,
        entity_key=key,
        seq=0,
        step_index=0,
        tool=tool,
        args_json='{"amount": 5}',
        created_at_ms=START_MS,
        expires_at_ms=START_MS + ttl_ms,
    )


def in_doubt_count(resolution: str) -> float:
    value = REGISTRY.get_sample_value("keylane_effector_in_doubt_total", {"resolution": resolution})
    return value or 0.0


def doubtful_rig(**register: Any) -> Rig:
    """A rig whose refund tool is registered with ``register`` options, and an intent an
    earlier attempt claimed (then died) a full lease ago."""
    rig = make_rig()
    fn = rig.handler.registry.get("refund").fn
    rig.handler.registry.register("refund", fn, side_effect=True, **register)
    rig.stale_claim(intent(), claimed_at_ms=START_MS - LEASE_MS)
    return rig


# --- routing: one partition per intent id -------------------------------------------------


async def test_an_intent_on_another_partition_than_its_keys_is_rerouted_there_untouched() -> None:
    rig = make_rig()
    original = intent()

    await rig.deliver(original, partition=ELSEWHERE, offset=7, headers=(("trace", b"t-1"),))

    [copy] = rig.io.rerouted
    assert (copy.key, copy.value, copy.partition) == (KEY, encode(original), HOME)
    assert copy.headers == [("trace", b"t-1"), (ORIGIN_HEADER, f"{TOPIC}/{ELSEWHERE}/7".encode())]
    assert rig.calls == [] and rig.io.published == [] and dict(rig.table) == {}, "handled only at home"


async def test_a_rerouted_copy_keeps_the_first_origin() -> None:
    rig = make_rig()
    first = (ORIGIN_HEADER, f"{TOPIC}/{HOME}/3".encode())

    await rig.deliver(intent(), partition=ELSEWHERE, offset=9, headers=(first,))

    assert rig.io.rerouted[0].headers == [first]


async def test_copies_of_an_intent_in_its_keys_partition_run_it_once_and_answer_alike() -> None:
    rig = make_rig()
    original = intent()
    await rig.deliver(original, partition=ELSEWHERE, offset=0)
    copy = rig.io.rerouted[0]

    await rig.deliver(original, offset=4)  # the original producer's retry, on the right partition
    await rig.deliver(original, offset=5, headers=tuple(copy.headers))  # the re-routed copy

    assert len(rig.calls) == 1, "the tool ran once"
    first, second = rig.io.result_bytes()
    assert first == second, "the copy's answer is the stored result, byte for byte"


@pytest.mark.parametrize("key", [b"acct-8#0", None], ids=["other-key", "no-key"])
async def test_an_intent_whose_record_key_is_not_its_entity_key_is_a_malformed_record(
    key: bytes | None,
) -> None:
    rig = make_rig()
    partition = HOME if key is None else expected_partition(key, PARTITIONS)

    await rig.deliver(intent(), key=key, partition=partition, offset=2)

    [error] = rig.io.errors()
    assert (error.reason, error.intent_id) == ("malformed_record", "i-1")
    assert "is not the intent's entity_key 'acct-7#0'" in error.detail
    assert rig.calls == [] and rig.io.results() == [] and dict(rig.table) == {}


async def test_a_record_that_is_no_intent_is_a_malformed_record_with_its_bytes() -> None:
    rig = make_rig()

    await rig.deliver(intent(), value=b"{not json", offset=3)

    [error] = rig.io.errors()
    assert error.reason == "malformed_record"
    assert error.raw_value_b64 is not None
    assert error.origin is not None and (error.origin.partition, error.origin.offset) == (HOME, 3)


@pytest.mark.parametrize("forged_by", [None, "2026-11:guessed"], ids=["unsigned", "bad-signature"])
async def test_under_require_an_unsigned_intent_is_dead_lettered_and_never_runs(
    forged_by: str | None,
) -> None:
    rig = make_rig(keyring=Keyring.parse(KEYS), signatures="require")
    forged = intent() if forged_by is None else Keyring.parse(forged_by).sign(intent())

    await rig.deliver(forged)

    [error] = rig.io.errors()
    assert error.reason == "unsigned_intent"
    assert rig.calls == [] and rig.io.results() == []


# --- expiry -------------------------------------------------------------------------------


async def test_a_done_intent_answers_its_stored_result_even_after_its_expiry() -> None:
    rig = make_rig()
    await rig.deliver(intent())

    rig.clock.advance(TTL_MS * 10)
    await rig.deliver(intent(), offset=1)  # a rewound group redelivers it long after

    first, again = rig.io.result_bytes()
    assert again == first
    assert decode(again, ToolResult).status == "OK"
    assert len(rig.calls) == 1


@pytest.mark.parametrize("policy", ["rerun", "error"])
async def test_an_intent_that_expires_while_waiting_for_an_earlier_attempt_is_expired_not_run(
    policy: Any,
) -> None:
    rig = doubtful_rig(in_doubt=policy)
    # An attempt claimed it 10 s ago, then died; its lease runs 25 s more, the intent 10 s more.
    rig.clock.advance(50_000)
    rig.stale_claim(intent(), claimed_at_ms=rig.clock() - 10_000)
    late = intent()

    await rig.deliver(late)

    [result] = rig.io.results()
    assert result.status == "EXPIRED"
    assert rig.calls == [], "an intent that expired while it waited is never executed"
    assert rig.clock() >= late.expires_at_ms


async def test_a_live_holder_is_waited_for_and_its_answer_is_the_answer_even_after_expiry() -> None:
    rig = make_rig()
    rig.claims.claim("i-1", now_ms=START_MS, lease_ms=LEASE_MS)
    holder_answer = encode(ToolResult(intent_id="i-1", entity_key=KEY.decode(), status="OK", result_json="1"))
    waits = 0

    async def holder_finishes(seconds: float) -> None:
        nonlocal waits
        waits += 1
        rig.clock.advance(TTL_MS)  # past the intent's expiry by the time the holder is done
        rig.claims.complete("i-1", holder_answer, now_ms=rig.clock())

    rig.handler.sleep = holder_finishes
    await rig.deliver(intent())

    assert waits == 1
    assert rig.io.result_bytes() == [holder_answer]
    assert rig.calls == []


async def test_an_intent_that_expires_while_its_claim_is_flushed_is_expired_not_run() -> None:
    rig = make_rig()
    rig.io.on_flush = lambda: rig.clock.advance(TTL_MS)

    await rig.deliver(intent())

    assert [r.status for r in rig.io.results()] == ["EXPIRED"]
    assert rig.calls == []


async def test_an_expired_answer_is_final_even_for_an_effector_whose_clock_is_behind() -> None:
    rig = make_rig()
    rig.clock.advance(TTL_MS)
    await rig.deliver(intent())

    rig.clock.advance(-TTL_MS)  # another effector host, its clock a minute behind
    await rig.deliver(intent(), offset=1)

    first, again = rig.io.result_bytes()
    assert decode(first, ToolResult).status == "EXPIRED"
    assert again == first
    assert rig.calls == []


# --- expiry: a run must be over before the intent expires ----------------------------------


def slow_registry(seconds: float, ran: list[float]) -> ToolRegistry:
    """A "ship" tool with a 5 s timeout that takes ``seconds``; ``ran`` gets its start times."""
    registry = ToolRegistry()

    async def ship(args: dict[str, Any]) -> dict[str, Any]:
        ran.append(time.monotonic())
        await asyncio.sleep(seconds)
        return {"shipped": True}

    registry.register("ship", ship, side_effect=True, timeout_s=TOOL_TIMEOUT_S)
    return registry


@pytest.mark.parametrize("left_ms", [EXPIRY_MARGIN_MS, EXPIRY_MARGIN_MS - 1, 1])
async def test_an_intent_too_close_to_its_expiry_for_a_run_is_expired_and_never_runs(left_ms: int) -> None:
    rig = make_rig()
    rig.clock.advance(TTL_MS - left_ms)  # left_ms before the intent's expiry

    await rig.deliver(intent())
    await rig.deliver(intent(), offset=1)

    first, again = rig.io.results()
    assert first.status == "EXPIRED" and again == first, "recorded Done: one answer"
    assert first.error is not None and f"{left_ms} ms were left" in first.error
    assert rig.calls == []


async def test_a_run_gets_at_most_the_time_left_before_expiry_less_the_margin() -> None:
    ran: list[float] = []
    rig = make_rig(slow_registry(TOOL_TIMEOUT_S * 2, ran))
    budget_ms = 300
    rig.clock.advance(TTL_MS - EXPIRY_MARGIN_MS - budget_ms)

    await rig.deliver(intent(tool="ship"))
    took_s = time.monotonic() - ran[0]

    [result] = rig.io.results()
    assert result.status == "ERROR" and result.error is not None
    assert "did not finish within the 0.300s left before the intent's expiry" in result.error
    assert budget_ms / 1000 <= took_s < TOOL_TIMEOUT_S / 2, "cut at the budget, not the tool's 5 s"


async def test_a_run_that_fits_before_the_expiry_answers_ok() -> None:
    ran: list[float] = []
    rig = make_rig(slow_registry(0.05, ran))
    rig.clock.advance(TTL_MS - EXPIRY_MARGIN_MS - 1000)

    await rig.deliver(intent(tool="ship"))

    assert [r.status for r in rig.io.results()] == ["OK"] and len(ran) == 1


async def test_the_tools_own_timeout_still_applies_when_it_is_shorter_than_the_time_left() -> None:
    registry = ToolRegistry()

    async def hang(args: dict[str, Any]) -> None:
        await asyncio.sleep(10)

    registry.register("hang", hang, side_effect=True, timeout_s=0.2)
    rig = make_rig(registry)

    await rig.deliver(intent(tool="hang"))

    [result] = rig.io.results()
    assert (result.status, result.error) == ("ERROR", "tool 'hang' timed out after 0.2s")


async def test_an_in_doubt_rerun_too_close_to_its_expiry_is_expired_not_run() -> None:
    rig = doubtful_rig(in_doubt="rerun")
    rig.clock.advance(TTL_MS - EXPIRY_MARGIN_MS // 2)

    await rig.deliver(intent())

    [result] = rig.io.results()
    assert result.status == "EXPIRED" and result.error is not None and "in doubt: " in result.error
    assert rig.calls == []


# --- in doubt: claimed, no Done, lease over -----------------------------------------------


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-hook", "async-hook"])
async def test_reconcile_saying_it_happened_answers_ok_with_the_earlier_result_without_running(
    asynchronous: bool,
) -> None:
    asked: list[str] = []

    def find(intent_id: str) -> Any:
        asked.append(intent_id)
        return {"refunded": 5, "ref": "r-991"}

    async def find_async(intent_id: str) -> Any:
        return find(intent_id)

    before = in_doubt_count("reconciled_done")
    rig = doubtful_rig(reconcile=find_async if asynchronous else find)

    await rig.deliver(intent())

    [result] = rig.io.results()
    assert (result.status, result.result_json) == ("OK", '{"refunded":5,"ref":"r-991"}')
    assert asked == ["i-1"] and rig.calls == []
    assert in_doubt_count("reconciled_done") == before + 1


async def test_reconcile_saying_it_did_not_happen_runs_it_now() -> None:
    before = in_doubt_count("reconciled_not_done")
    rig = doubtful_rig(reconcile=lambda intent_id: None)

    await rig.deliver(intent())

    assert [r.status for r in rig.io.results()] == ["OK"]
    assert rig.calls == [({"amount": 5}, "i-1")]
    assert in_doubt_count("reconciled_not_done") == before + 1


async def test_without_a_hook_in_doubt_rerun_runs_it_again() -> None:
    before = in_doubt_count("rerun")
    rig = doubtful_rig(in_doubt="rerun")

    await rig.deliver(intent())

    assert [r.status for r in rig.io.results()] == ["OK"]
    assert len(rig.calls) == 1
    assert in_doubt_count("rerun") == before + 1


async def test_without_a_hook_the_default_answers_error_in_doubt_never_runs_and_records_done() -> None:
    before = in_doubt_count("error")
    rig = doubtful_rig()
    assert rig.handler.registry.get("refund").in_doubt == "error", "the default policy"

    await rig.deliver(intent())
    await rig.deliver(intent(), offset=1)

    first, again = rig.io.results()
    assert first.status == "ERROR"
    assert first.error is not None and first.error.startswith("in doubt: ")
    assert "may have taken effect and is not run again" in first.error
    assert again == first, "recorded Done: a redelivery gets the same answer"
    assert rig.calls == []
    assert in_doubt_count("error") == before + 1


@pytest.mark.parametrize(
    ("hook", "error"),
    [
        (lambda intent_id: 1 / 0, "reconcile raised ZeroDivisionError"),
        (lambda intent_id: object(), "reconcile result is not JSON-encodable"),
    ],
    ids=["raising-hook", "unencodable-result"],
)
async def test_a_failing_reconcile_hook_answers_error_in_doubt_and_never_runs(
    hook: Callable[[str], Any], error: str
) -> None:
    before = in_doubt_count("error")
    rig = doubtful_rig(reconcile=hook)

    await rig.deliver(intent())

    [result] = rig.io.results()
    assert result.status == "ERROR" and result.error is not None
    assert result.error.startswith("in doubt: ") and error in result.error
    assert rig.calls == []
    assert in_doubt_count("error") == before + 1


async def test_an_expired_in_doubt_intent_still_asks_reconcile_what_happened() -> None:
    rig = doubtful_rig(reconcile=lambda intent_id: {"refunded": 5})
    rig.clock.advance(TTL_MS)

    await rig.deliver(intent())

    assert [(r.status, r.result_json) for r in rig.io.results()] == [("OK", '{"refunded":5}')]
    assert rig.calls == []


async def test_an_intent_held_by_nobody_is_not_in_doubt() -> None:
    asked: list[str] = []
    rig = doubtful_rig(reconcile=asked.append)
    rig.table.clear()

    await rig.deliver(intent())

    assert asked == [] and len(rig.calls) == 1


# --- tools get the intent id --------------------------------------------------------------


async def test_a_tool_gets_the_intent_id_as_its_idempotency_key_and_plain_tools_still_work() -> None:
    seen: list[Any] = []
    registry = ToolRegistry()
    registry.register("keyed", lambda args, intent_id: seen.append(("keyed", intent_id)), side_effect=True)
    registry.register("plain", lambda args: seen.append(("plain", args)), side_effect=True)

    async def keyed_async(args: Any, *, intent_id: str) -> None:
        seen.append(("async", intent_id))

    registry.register("keyed_async", keyed_async, side_effect=True)
    rig = make_rig(registry)

    for number, name in enumerate(["keyed", "plain", "keyed_async"]):
        await rig.deliver(intent(intent_id=f"i-{name}", tool=name), offset=number)

    assert seen == [("keyed", "i-keyed"), ("plain", {"amount": 5}), ("async", "i-keyed_async")]
    assert [r.status for r in rig.io.results()] == ["OK", "OK", "OK"]


# --- signed results -----------------------------------------------------------------------


async def test_every_result_the_effector_publishes_is_signed_and_verifies() -> None:
    keyring = Keyring.parse(KEYS)
    rig = make_rig(keyring=keyring)

    await rig.deliver(intent(intent_id="ok"))
    await rig.deliver(intent(intent_id="rejected", tool="no_such_tool"), offset=1)
    await rig.deliver(intent(intent_id="expired", ttl_ms=0), offset=2)
    await rig.deliver(intent(intent_id="ok"), offset=3)  # Done: republished

    results = rig.io.results()
    assert [r.status for r in results] == ["OK", "REJECTED", "EXPIRED", "OK"]
    assert all(r.key_id == "2026-11" for r in results)
    assert [keyring.verify(r) for r in results] == ["ok"] * 4
    assert rig.io.result_bytes()[3] == rig.io.result_bytes()[0], "the stored bytes are the signed bytes"
    assert Keyring.parse("2026-10:previous-secret").verify(results[0]) == "unknown_key"


async def test_without_keys_results_are_unsigned() -> None:
    rig = make_rig()

    await rig.deliver(intent())

    [result] = rig.io.results()
    assert (result.signature, result.key_id) == (None, None)


# --- the order an answer reaches the producer ----------------------------------------------


async def test_the_claim_is_flushed_before_the_tool_and_done_is_flushed_before_the_result() -> None:
    rig = make_rig()

    await rig.deliver(intent())

    assert rig.log == ["write claimed", "flush", "tool", "write done", "flush", "publish agent.results"]


async def test_a_done_found_locally_is_written_and_flushed_again_before_it_is_republished() -> None:
    rig = make_rig()
    await rig.deliver(intent())
    rig.log.clear()

    await rig.deliver(intent(), offset=1)  # a restart on the same volume: Done is local only

    assert rig.log == ["write done", "flush", "publish agent.results"]
    first, again = rig.io.result_bytes()
    assert again == first and len(rig.calls) == 1
    assert msgspec.msgpack.decode(rig.table[b"i-1"], type=ClaimRecord).result == first


async def test_an_unknown_tool_is_held_then_rejected_once_and_every_copy_gets_that_answer() -> None:
    rig = make_rig()
    unknown = intent(tool="no_such_tool", ttl_ms=TTL_MS * 10)

    await rig.deliver(unknown)
    held_ms = rig.clock() - START_MS
    await rig.deliver(unknown, offset=1)  # a copy at the same old effector

    first, again = rig.io.result_bytes()
    assert decode(first, ToolResult).status == "REJECTED"
    assert again == first, "one answer per intent id, byte for byte"
    assert held_ms == UNKNOWN_TOOL_WAIT_S * 1000, "held for a newer effector first"
    assert rig.clock() - START_MS == held_ms, "the copy is answered from Done, not held again"
    assert rig.log[:4] == ["write claimed", "write done", "flush", "publish agent.results"], "no run"


async def test_an_unknown_tool_is_held_no_longer_than_its_intent_can_still_run() -> None:
    rig = make_rig()
    rig.clock.advance(TTL_MS - EXPIRY_MARGIN_MS - 2_000)

    await rig.deliver(intent(tool="no_such_tool"))

    assert rig.clock() == START_MS + TTL_MS - EXPIRY_MARGIN_MS
    assert [r.status for r in rig.io.results()] == ["REJECTED"]


async def test_an_unknown_tool_held_through_a_revocation_is_left_for_an_effector_that_knows_it() -> None:
    old = make_rig(ToolRegistry())  # an effector from before the tool was added
    revoking = False

    async def deploy_replaces_it(seconds: float) -> None:
        nonlocal revoking
        old.clock.advance(int(seconds * 1000))
        revoking = old.clock() - START_MS >= 10_000  # the rolling deploy stops it 10 s in

    old.handler.sleep = deploy_replaces_it
    old.handler.revoking = lambda: revoking
    with pytest.raises(Abandoned):
        await old.deliver(intent())
    assert old.io.published == [] and dict(old.table) == {}, "nothing answered, nothing claimed"

    new = make_rig()  # the partition's next owner restores the same (empty) claims
    new.table.update(old.table)
    await new.deliver(intent())

    assert [r.status for r in new.io.results()] == ["OK"] and len(new.calls) == 1


@pytest.mark.parametrize("args_json", ["{not json", "[1]"])
async def test_arguments_no_tool_could_take_are_rejected_at_once(args_json: str) -> None:
    rig = make_rig()

    await rig.deliver(msgspec.structs.replace(intent(), args_json=args_json))

    [result] = rig.io.results()
    assert result.status == "REJECTED" and rig.clock() == START_MS and rig.calls == []


async def test_handle_returns_only_after_the_result_is_handed_to_the_producer() -> None:
    rig = make_rig()
    gate = asyncio.Event()
    original_publish = rig.io.publish

    async def slow_publish(emit: Emit) -> None:
        await gate.wait()
        await original_publish(emit)

    rig.io.publish = slow_publish  # type: ignore[method-assign]
    handling = asyncio.ensure_future(rig.deliver(intent()))
    await asyncio.sleep(0.01)
    assert not handling.done(), "no ack while the result waits for the producer"
    gate.set()
    await handling
    assert len(rig.io.results()) == 1


async def test_a_result_over_the_record_limit_is_answered_as_an_error_and_recorded_done() -> None:
    registry = ToolRegistry()
    registry.register("report", lambda args: {"report": "x" * 5000}, side_effect=True)
    registry.register("small", lambda args: {"ok": True}, side_effect=True)
    rig = make_rig(registry)
    rig.handler.result_limit = 1000

    await rig.deliver(intent(intent_id="big", tool="report"))
    await rig.deliver(intent(intent_id="fits", tool="small"), offset=1)
    await rig.deliver(intent(intent_id="big", tool="report"), offset=2)  # a copy: Done, not run

    results = rig.io.results()
    assert [r.status for r in results] == ["ERROR", "OK", "ERROR"]
    assert results[0].error is not None and "over the 1000-byte limit" in results[0].error
    assert all(len(value) <= 1000 for value in rig.io.result_bytes())
    assert rig.io.result_bytes()[2] == rig.io.result_bytes()[0], "the copy got the recorded answer"
    assert isinstance(rig.claims.claim("big", now_ms=START_MS, lease_ms=LEASE_MS), Done)


async def test_a_run_the_effector_stood_still_through_is_left_in_doubt_not_answered() -> None:
    # The pause made the tool's timeout fire (or its partition move): nothing is recorded or
    # published, and the claim stays for the next attempt to settle in doubt.
    rig = make_rig()
    rig.handler.run_watch = lambda: lambda: bool(rig.calls)  # it stood still once the tool ran

    with pytest.raises(Superseded):
        await rig.deliver(intent())

    assert len(rig.calls) == 1
    assert rig.io.result_bytes() == []
    [claim] = rig.table.values()
    assert msgspec.msgpack.decode(claim)["state"] == "claimed"


async def test_a_run_starting_under_a_generation_the_group_left_never_runs() -> None:
    rig = make_rig()
    rig.handler.run_watch = lambda: lambda: True

    with pytest.raises(Superseded):
        await rig.deliver(intent())

    assert rig.calls == []
    assert rig.io.result_bytes() == []


async def test_a_done_on_its_way_through_a_pause_is_not_published() -> None:
    # The effector stood still while its Done record was on its way (the flush): the partition
    # may have moved, and its owner answers the intent from what it restores. A result
    # published now could differ from the owner's answer: nothing is published.
    rig = make_rig()
    paused = False

    def pause_during_the_done_flush() -> None:
        nonlocal paused
        paused = paused or any(isinstance(v, bytes) and b"done" in v for v in rig.table.values())

    rig.io.on_flush = pause_during_the_done_flush
    rig.handler.run_watch = lambda: lambda: paused

    with pytest.raises(Superseded):
        await rig.deliver(intent())

    assert len(rig.calls) == 1, "the tool ran before the pause"
    assert rig.io.result_bytes() == []
    [record] = rig.table.values()
    assert msgspec.msgpack.decode(record)["state"] == "done"


class Pauses:
    """PauseWatch's rule (service/keylane/kafka/pauses.py) on a fake clock: a watch taken when a
    job starts says it stood still once a long pause ended after that, or when the job's
    generation is one a pause fenced. The consumer reads generation -1 once it noticed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.resumed_at = -1.0
        self.fenced: set[int] = set()
        self.generation = 3

    def watch(self) -> Callable[[], bool]:
        since, epoch = self.now, self.generation
        return lambda: self.resumed_at > since or epoch in self.fenced

    def stand_still(self) -> None:
        self.now += 15.0
        self.fenced.add(self.generation)
        self.resumed_at = self.now
        self.generation = -1  # evicted: the heartbeat after the pause reset it
        self.now += 0.1


async def test_a_job_that_stood_still_before_its_run_never_runs_the_tool() -> None:
    # Found by the pause chaos with two effectors: the claim's flush was on its way when the
    # effector stood still; its successor, which never saw the claim, ran the tool; thawed,
    # this job ran it again, as a watch taken at the run read the consumer's generation -1,
    # which no pause fenced. The job's own start decides.
    rig = make_rig()
    pauses = Pauses()
    rig.handler.run_watch = pauses.watch
    rig.handler.epoch = lambda: pauses.generation
    rig.io.on_flush = lambda: pauses.stand_still() if pauses.generation >= 0 else None

    with pytest.raises(Superseded):
        await rig.deliver(intent())

    assert rig.calls == [], "the tool never ran"
    assert rig.io.result_bytes() == []
    [claim] = rig.table.values()
    assert msgspec.msgpack.decode(claim)["state"] == "claimed"


async def test_a_job_whose_group_generation_changed_before_its_run_never_runs_the_tool() -> None:
    rig = make_rig()
    generation = [3]
    rig.handler.epoch = lambda: generation[0]
    rig.io.on_flush = lambda: generation.__setitem__(0, 4)  # a rebalance while the claim flushed

    with pytest.raises(Superseded):
        await rig.deliver(intent())

    assert rig.calls == [] and rig.io.result_bytes() == []
