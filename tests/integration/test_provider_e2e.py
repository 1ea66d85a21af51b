"""A ToolLoop agent against a local OpenAI-compatible server, through the real broker: one
read-only tool inline, one side effect through the effector, a final answer; then the group
is rewound and the replay makes zero extra HTTP requests (the server counts them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.catalog import EVENTS, OUTPUT, RESULTS, Catalog
from keylane.config import Settings
from keylane.testing.processes import free_port
from keylane.wire import AgentEnvelope, encode
from tests.integration.test_redelivery import metric, rewind_group
from tests.kafka_io import produce, wait_for_records
from tests.llm_servers import FakeOpenAIServer
from tests.processes import KeylaneProcess, process_env, running

pytestmark = pytest.mark.kafka

# The OpenTelemetry GenAI series of the support agent's calls (service/keylane/metrics.py), their
# labels in the order /metrics prints them (sorted by name).
CHAT = 'gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="support-model"'
TOKENS = "gen_ai_client_token_usage_sum"
DURATION = "gen_ai_client_operation_duration_seconds_count"


@pytest.fixture
def model_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(model="support-model")
    server.start_in_thread()
    try:
        yield server
    finally:
        server.stop()


async def wait_for_metric(port: int, name: str, at_least: float, process: KeylaneProcess) -> None:
    for _ in range(120):
        if await metric(port, name) >= at_least:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"{name} never reached {at_least}\n{process.tail()}")


async def test_tool_loop_over_an_openai_server_then_a_replay_without_http(
    settings: Settings, catalog: Catalog, tmp_path: Path, model_server: FakeOpenAIServer
) -> None:
    model_server.reply_tool_calls([("call-1", "lookup_order", {"order_id": "A7"})])
    model_server.reply_tool_calls([("call-2", "issue_refund", {"order_id": "A7"})])
    model_server.reply_text("Refunded order A7.", prompt_tokens=30, completion_tokens=4)
    ledger = tmp_path / "tools.jsonl"
    env = process_env(settings, TOOL_LEDGER=str(ledger))
    worker_args = [
        "worker",
        "--agent",
        "tests.agents.support_loop:agent",
        "--provider",
        f"openai+{model_server.base_url}?model=support-model&max_attempts=2",
    ]
    effector = KeylaneProcess(["effector", "--tools", "tests.agents.support_loop"], env, tmp_path / "e.log")
    port = free_port()
    worker = KeylaneProcess(worker_args, {**env, "KEYLANE_METRICS_PORT": str(port)}, tmp_path / "w1.log")

    with running(effector):
        with running(worker):
            await produce(
                settings, catalog.name(EVENTS), [(b"cust-1", encode(AgentEnvelope(payload="refund A7")))]
            )
            [output] = await wait_for_records(
                settings, catalog.name(OUTPUT), lambda records: len(records) == 1, timeout_s=90
            )
            assert await metric(port, "keylane_llm_calls_total") == 3
            assert await metric(port, f'{TOKENS}{{{CHAT},gen_ai_token_type="input"}}') == 10 + 10 + 30
            assert await metric(port, f'{TOKENS}{{{CHAT},gen_ai_token_type="output"}}') == 5 + 5 + 4
            assert await metric(port, f"{TOKENS}{{{CHAT},") == 64
            assert await metric(port, f'{DURATION}{{error_type="",{CHAT}}}') == 3, "one per provider call"
        assert output.value == b"Refunded order A7."
        assert model_server.count == 3
        first, second, third = model_server.bodies
        assert first["tools"][0]["function"]["name"] == "lookup_order"
        assert first["messages"][-1] == {"role": "user", "content": "refund A7"}
        assert second["messages"][-1] == {
            "role": "tool",
            "tool_call_id": "call-1",
            "content": '{"order_id":"A7","state":"delivered","amount":42}',
        }
        assert third["messages"][-2]["tool_calls"][0]["function"]["name"] == "issue_refund"
        assert third["messages"][-1] == {
            "role": "tool",
            "tool_call_id": "call-2",
            "content": '{"refunded":"A7"}',
        }
        assert ledger.read_text().count("\n") == 1, "the refund ran once, in the effector"

        await rewind_group(settings, [catalog.name(EVENTS), catalog.name(RESULTS)])
        replay_port = free_port()
        replay = KeylaneProcess(
            worker_args, {**env, "KEYLANE_METRICS_PORT": str(replay_port)}, tmp_path / "w2.log"
        )
        with running(replay):
            await wait_for_metric(replay_port, "keylane_redeliveries_total", 2, replay)  # event + result
            assert await metric(replay_port, "keylane_activations_total") == 0
            assert await metric(replay_port, "keylane_llm_calls_total") == 0

    assert model_server.count == 3, "the replay made no HTTP request"
    assert ledger.read_text().count("\n") == 1
