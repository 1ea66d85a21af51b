"""AgentHarness: run an agent in-process, without a broker, exactly as a worker would.

It drives the same KeyRuntime the Faust processor drives and applies its decisions with the
same step (``keylane.core.apply``), keeps each key's committed state as the encoded blob a
table would hold, numbers offsets per topic like a partition, fires due timers as the
worker's scan does (``keylane.core.timers.due_timers``), and collects what would be
published. Use it to test your own agents::

    harness = AgentHarness(my_agent, AgentConfig(provider_factory=make_provider))
    await harness.send_event(b"customer-1", "hello")
    assert harness.outputs() == [(b"customer-1", b"...")]
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from keylane.authoring.api import AgentConfig, AgentFn
from keylane.catalog import (
    APPROVAL_REQUESTS,
    APPROVALS,
    CONTROL,
    ERRORS,
    EVENTS,
    INTENTS,
    OUTPUT,
    RESULTS,
    TIMERS,
)
from keylane.clock import Clock, wall_clock_ms
from keylane.core.activation import Decision, KeyRuntime
from keylane.core.apply import apply_decision
from keylane.core.key_states import KeyStates
from keylane.core.state import KeyState
from keylane.core.timers import TimerIndex, due_timers
from keylane.llm.types import Provider
from keylane.records import Emit, InputRecord
from keylane.wire import (
    AgentEnvelope,
    Approval,
    ApprovalRequest,
    ErrorRecord,
    KeyCommand,
    ToolIntent,
    ToolResult,
    decode,
    encode,
)


class ManualClock:
    """A clock tests move by hand: ``clock.advance(ms)``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class AgentHarness:
    """One agent, its per-key state and its published records, all in memory."""

    def __init__(
        self,
        agent: AgentFn,
        config: AgentConfig | None = None,
        *,
        provider: Provider | None = None,
        clock: Clock = wall_clock_ms,
        events_topic: str = EVENTS,
    ) -> None:
        self.runtime = KeyRuntime(agent, config or AgentConfig(), provider=provider, clock=clock)
        self.events_topic = events_topic
        self.store: dict[bytes, bytes] = {}
        self.states = KeyStates(self.store.get, self.store.__setitem__)
        self.published: list[Emit] = []
        self._offsets: dict[str, Iterator[int]] = defaultdict(itertools.count)
        self.records: list[InputRecord] = []
        self.timers = TimerIndex()

    async def send_event(self, key: bytes, payload: Any, **envelope: Any) -> Decision:
        """Deliver an event; ``payload`` is any JSON value (a str reaches the agent as UTF-8)."""
        value = encode(AgentEnvelope(payload=payload, **envelope))
        return await self.send_raw(self.events_topic, key, value)

    async def send_result(self, result: ToolResult) -> Decision:
        """Deliver a tool result under its physical key."""
        return await self.send_raw(RESULTS, result.entity_key.encode(), encode(result))

    async def send_approval(self, approval: Approval) -> Decision:
        """Deliver an approval decision under its physical key."""
        return await self.send_raw(APPROVALS, approval.entity_key.encode(), encode(approval))

    async def send_command(self, command: KeyCommand) -> Decision:
        """Deliver an operator's command (``keylane cancel``) under its physical key."""
        return await self.send_raw(CONTROL, command.entity_key.encode(), encode(command))

    async def send_raw(self, topic: str, key: bytes | None, value: bytes | None) -> Decision:
        """Deliver raw bytes on a logical input topic, at that topic's next offset."""
        record = InputRecord(
            topic=topic,
            broker_topic=topic,
            partition=0,
            offset=next(self._offsets[topic]),
            key=key,
            value=value,
        )
        return await self.redeliver(record)

    async def redeliver(self, record: InputRecord) -> Decision:
        """Deliver a record again (or for the first time), as Kafka does after a crash."""
        self.records.append(record)
        decision = await self.runtime.handle(record, self.state)
        for emit in apply_decision(self.states, self.timers, record.key, decision):
            self.runtime.on_published(emit.record_id)
            self.published.append(emit)
            self.runtime.on_delivered(emit.record_id)
        return decision

    async def fire_due_timers(self) -> list[Decision]:
        """Send a timer-fired command for every timer due at the clock's now, as the worker's
        scan would, and let each key's lane apply it."""
        decisions = []
        for due in due_timers(self.timers, self.runtime.clock()):
            decisions.append(await self.send_raw(TIMERS, due.key, encode(due.fired)))
        return decisions

    def state(self, key: bytes) -> KeyState:
        """The committed state of a key (its memory read from its pages, when paged)."""
        return self.states.read(key)

    def outputs(self) -> list[tuple[bytes, bytes]]:
        """(physical key, output) of every Complete, in publication order."""
        return [(e.key, e.value) for e in self.published if e.topic == OUTPUT]

    def intents(self) -> list[ToolIntent]:
        """Every intent published to agent.intents, in order."""
        return [decode(e.value, ToolIntent) for e in self.published if e.topic == INTENTS]

    def approval_requests(self) -> list[ApprovalRequest]:
        """Every request published to agent.approval-requests, in order."""
        return [decode(e.value, ApprovalRequest) for e in self.published if e.topic == APPROVAL_REQUESTS]

    def errors(self) -> list[ErrorRecord]:
        """Every record published to agent.errors, in order."""
        return [decode(e.value, ErrorRecord) for e in self.published if e.topic == ERRORS]

    def result_for(
        self,
        intent: ToolIntent,
        *,
        status: str = "OK",
        result_json: str | None = "null",
        error: str | None = None,
    ) -> ToolResult:
        """The ToolResult an effector would publish for ``intent``."""
        return ToolResult(
            intent_id=intent.intent_id,
            entity_key=intent.entity_key,
            status=status,  # type: ignore[arg-type]
            result_json=result_json,
            error=error,
            completed_at_ms=intent.created_at_ms,
        )
