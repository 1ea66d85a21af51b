"""FakeLLM's scripting, the tool registry, the effector's execute() and its claim store."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from keylane.authoring.api import AgentConfig, Complete
from keylane.authoring.context import ActivationContext
from keylane.authoring.tools import ToolRegistry, UnknownTool, default_registry, tool
from keylane.llm import (
    FakeLLM,
    LlmRequest,
    fail_then_succeed,
    match_any,
    match_contains,
    match_model_id,
    raise_error,
    respond_with,
)
from keylane.llm.fake import ScriptedFailure, UnmatchedRequest
from keylane.stages.effector.claims import Claimed, ClaimStore, Done, InDoubt, InFlight
from keylane.stages.effector.execute import execute
from keylane.testing import AgentHarness, ManualClock
from keylane.wire import ToolIntent


def ask(text: str, *, model: str = "fake-1", tools_schema: Any = None) -> LlmRequest:
    return LlmRequest(model_id=model, messages=[{"role": "user", "content": text}], tools_schema=tools_schema)


# --- FakeLLM --------------------------------------------------------------------------------


async def test_the_first_matching_rule_answers() -> None:
    llm = FakeLLM(
        [
            (match_contains("refund"), respond_with(b"refund script")),
            (match_model_id("fake-2"), respond_with(b"model two")),
            (match_any(), respond_with(b"fallback")),
        ]
    )

    assert (await llm.complete(ask("I want a refund", model="fake-2"))).response == b"refund script"
    assert (await llm.complete(ask("hello", model="fake-2"))).response == b"model two"
    assert (await llm.complete(ask("hello"))).response == b"fallback"
    assert [r.model_id for r in llm.requests] == ["fake-2", "fake-2", "fake-1"]


async def test_a_response_carries_the_request_model_and_the_scripted_token_counts() -> None:
    llm = FakeLLM([(match_any(), respond_with(b"hi", prompt_tokens=5, completion_tokens=2))])

    response = await llm.complete(ask("hello", model="fake-9"))

    assert (response.response, response.model_id, response.prompt_tokens, response.completion_tokens) == (
        b"hi",
        "fake-9",
        5,
        2,
    )
    assert response.cached is False


async def test_an_unmatched_request_raises_and_is_still_counted() -> None:
    llm = FakeLLM([(match_model_id("fake-1"), respond_with(b"ok"))])

    with pytest.raises(UnmatchedRequest, match="model 'other'"):
        await llm.complete(ask("hello", model="other"))

    assert llm.call_count == 1
    assert FakeLLM([]).call_count == 0


async def test_call_count_counts_every_call_including_failing_ones() -> None:
    llm = FakeLLM([(match_contains("fail"), raise_error()), (match_any(), respond_with(b"ok"))])

    await llm.complete(ask("fine"))
    for _ in range(2):
        with pytest.raises(ScriptedFailure):
            await llm.complete(ask("please fail"))

    assert llm.call_count == 3


async def test_latency_ms_really_waits() -> None:
    llm = FakeLLM([(match_any(), respond_with(b"slow", latency_ms=20))])
    loop = asyncio.get_running_loop()
    started = loop.time()

    await llm.complete(ask("hello"))

    tolerance = time.get_clock_info("monotonic").resolution
    assert loop.time() - started >= 0.020 - tolerance


async def test_raise_error_raises_a_message_as_scripted_failure_or_the_given_exception() -> None:
    class Boom(Exception):
        pass

    llm = FakeLLM(
        [(match_model_id("message"), raise_error("rate limited")), (match_any(), raise_error(Boom("boom")))]
    )

    with pytest.raises(ScriptedFailure, match="rate limited"):
        await llm.complete(ask("x", model="message"))
    with pytest.raises(Boom, match="boom"):
        await llm.complete(ask("x", model="exception"))


async def test_fail_then_succeed_fails_the_first_n_calls_then_answers() -> None:
    llm = FakeLLM([(match_any(), fail_then_succeed(2, b"ok"))])

    with pytest.raises(ScriptedFailure, match="scripted failure 1 of 2"):
        await llm.complete(ask("x"))
    with pytest.raises(ScriptedFailure, match="scripted failure 2 of 2"):
        await llm.complete(ask("x"))

    assert (await llm.complete(ask("x"))).response == b"ok"
    assert (await llm.complete(ask("x"))).response == b"ok"
    assert llm.call_count == 4


async def test_match_model_id_is_exact_and_match_contains_looks_in_the_messages() -> None:
    assert match_model_id("fake-1")(ask("x", model="fake-1"))
    assert not match_model_id("fake")(ask("x", model="fake-1"))
    assert match_contains("refund")(ask("I want a refund"))
    assert match_contains("é")(ask("café"))
    assert not match_contains("refund")(ask("hello"))


def test_match_contains_does_not_match_text_found_only_outside_the_messages() -> None:
    """match_contains is documented to match "requests whose canonical messages contain text"."""
    schema = [{"name": "refund", "description": "issue a refund"}]

    assert not match_contains("refund")(ask("hello", tools_schema=schema))
    assert not match_contains("gpt")(ask("hello", model="gpt-4o"))


# --- tool registry --------------------------------------------------------------------------


def test_the_registry_tells_read_only_tools_from_side_effect_tools() -> None:
    registry = ToolRegistry()

    @tool("lookup", registry=registry)
    def lookup(args: Any) -> str:
        return "found"

    @tool("refund", side_effect=True, timeout_s=2.5, registry=registry)
    def refund(args: Any) -> str:
        return "refunded"

    assert lookup({}) == "found"  # read-only tools stay plain functions
    assert registry.names() == ["lookup", "refund"]
    assert registry.get("lookup").side_effect is False
    assert registry.get("refund").side_effect is True
    assert registry.get("refund").timeout_s == 2.5
    assert "lookup" not in default_registry.names()
    with pytest.raises(UnknownTool, match="no tool named 'missing'"):
        registry.get("missing")


async def test_run_tool_runs_read_only_tools_inline_and_refuses_side_effect_tools() -> None:
    registry = ToolRegistry()
    registry.register("lookup", lambda args: {"order": args["id"], "status": "shipped"})
    registry.register("refund", lambda args: "never", side_effect=True)

    async def uses_tools(ctx: ActivationContext) -> Complete:
        found = await ctx.run_tool("lookup", {"id": 7})
        if ctx.event == b"refund":
            await ctx.run_tool("refund", {})
        return Complete(found["status"].encode())

    harness = AgentHarness(uses_tools, AgentConfig(tools=registry), clock=ManualClock())
    await harness.send_event(b"k", "look")
    await harness.send_event(b"k", "refund")

    assert harness.outputs() == [(b"k", b"shipped")]
    [error] = harness.errors()
    assert "ToolMisuse" in error.detail
    assert "stage it with ctx.act('refund'" in error.detail


# --- effector: execute ----------------------------------------------------------------------


def intent_for(tool_name: str, args_json: str = "{}") -> ToolIntent:
    return ToolIntent(
        intent_id="intent-1",
        entity_key="k#0",
        seq=0,
        step_index=0,
        tool=tool_name,
        args_json=args_json,
        created_at_ms=0,
        expires_at_ms=1,
    )


@pytest.fixture
def calls() -> list[Any]:
    return []


@pytest.fixture
def registry(calls: list[Any]) -> ToolRegistry:
    def refund(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"refunded": args["amount"]}

    registry = ToolRegistry()
    registry.register("lookup", calls.append)
    registry.register("refund", refund, side_effect=True)
    return registry


@pytest.mark.parametrize(
    ("tool_name", "args_json", "error"),
    [
        ("missing", "{}", "no tool named 'missing'"),
        ("lookup", "{}", "'lookup' is read-only"),
        ("refund", "{not json", "args_json is not JSON"),
        ("refund", "[1, 2]", "must be a JSON object"),
        ("refund", "3", "must be a JSON object"),
    ],
    ids=["unknown-tool", "read-only-tool", "non-json-args", "array-args", "number-args"],
)
async def test_an_intent_the_effector_cannot_run_is_rejected_without_running_anything(
    registry: ToolRegistry, calls: list[Any], tool_name: str, args_json: str, error: str
) -> None:
    result = await execute(intent_for(tool_name, args_json), registry, default_timeout_s=1)

    assert result.status == "REJECTED"
    assert result.error is not None
    assert error in result.error
    assert result.result_json is None
    assert calls == []


async def test_a_tool_that_runs_returns_ok_with_compact_json(
    registry: ToolRegistry, calls: list[Any]
) -> None:
    result = await execute(
        intent_for("refund", '{"amount": 5, "note": "late"}'), registry, default_timeout_s=1
    )

    assert result.status == "OK"
    assert result.result_json == '{"refunded":5}'
    assert (result.intent_id, result.entity_key, result.error) == ("intent-1", "k#0", None)
    assert calls == [{"amount": 5, "note": "late"}]


async def test_a_raising_tool_is_an_error_result() -> None:
    registry = ToolRegistry()

    async def broken(args: Any) -> None:
        raise ValueError("card declined")

    registry.register("charge", broken, side_effect=True)

    result = await execute(intent_for("charge"), registry, default_timeout_s=1)

    assert (result.status, result.error) == ("ERROR", "ValueError: card declined")


async def test_a_sync_tool_over_the_default_timeout_is_an_error_result() -> None:
    release = threading.Event()
    registry = ToolRegistry()
    registry.register("stuck", lambda args: release.wait(5), side_effect=True)

    try:
        result = await execute(intent_for("stuck"), registry, default_timeout_s=0.01)
    finally:
        release.set()

    assert (result.status, result.error) == ("ERROR", "tool 'stuck' timed out after 0.01s")


async def test_a_tool_timeout_overrides_the_default() -> None:
    registry = ToolRegistry()

    async def never_finishes(args: Any) -> None:
        await asyncio.Event().wait()

    registry.register("hang", never_finishes, side_effect=True, timeout_s=0.01)

    result = await execute(intent_for("hang"), registry, default_timeout_s=60)

    assert (result.status, result.error) == ("ERROR", "tool 'hang' timed out after 0.01s")


async def test_a_result_json_cannot_carry_is_an_error_result() -> None:
    registry = ToolRegistry()
    registry.register("weird", lambda args: object(), side_effect=True)

    result = await execute(intent_for("weird"), registry, default_timeout_s=1)

    assert result.status == "ERROR"
    assert result.error is not None
    assert "not JSON-encodable" in result.error
    assert result.result_json is None


# --- effector: claims -----------------------------------------------------------------------


def test_a_claim_is_exclusive_while_its_lease_lives_and_done_forever_after_complete() -> None:
    store = ClaimStore({})

    assert store.claim("i-1", now_ms=1_000, lease_ms=500) == Claimed()
    assert store.claim("i-1", now_ms=1_499, lease_ms=500) == InFlight(lease_until_ms=1_500)
    assert store.claim("i-2", now_ms=1_499, lease_ms=500) == Claimed()  # claims are per intent
    # The lease ran out with no Done: claimed again, and in doubt (the attempt may have run).
    assert store.claim("i-1", now_ms=1_500, lease_ms=500) == InDoubt(claimed_at_ms=1_000)
    assert store.claim("i-1", now_ms=1_600, lease_ms=500) == InFlight(lease_until_ms=2_000)

    store.complete("i-1", b'{"status":"OK"}', now_ms=1_700)

    assert store.claim("i-1", now_ms=1_701, lease_ms=500) == Done(b'{"status":"OK"}')
    assert store.claim("i-1", now_ms=10_000_000, lease_ms=500) == Done(b'{"status":"OK"}')


def test_claims_live_in_the_table_they_are_given() -> None:
    table: dict[bytes, bytes] = {}
    ClaimStore(table).claim("i-1", now_ms=1_000, lease_ms=500)

    assert ClaimStore(table).claim("i-1", now_ms=1_200, lease_ms=500) == InFlight(lease_until_ms=1_500)
    assert list(table) == [b"i-1"]
