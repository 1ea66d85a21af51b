"""KeyRuntime: one input record + one key's state -> a Decision (new state, records to publish).

Broker-free on purpose: the Faust processor, the in-process test harness and the benchmarks
all drive this same code. For each input record, in order:

1. decode it strictly (a bad record becomes ``malformed_record``, the state is untouched);
   A key whose stored state does not read (a blob from a newer keylane, or corrupt) is
   quarantined and the input becomes ``poison_state`` (service/keylane/core/quarantine.py);
2. recognise a redelivery by the record's identity (``InputRecord.identity``: the original's
   stream and offset, shared by every copy keylane re-produced): an offset at or below the
   last one the key applied from that stream re-publishes that input's outbox entries and
   rewrites the key's state unchanged (no second activation, no new seq; the rewrite heals a
   changelog that lost the key's last record in a crash; service/keylane/core/outbox.py);
3. an operator's ``pause`` or ``resume`` (agent.control) applies at once; any other input of a
   paused key is held in its state, in order, until the resume runs it (``_hold``: bounded
   like the queue below, ``buffer_full`` past it; a timer fire is ignored, the resume re-arms);
   an event for a suspended key is queued behind the suspension (``events_while_suspended``),
   unless the key's queue is full (``max_buffered_events``, ``max_buffered_bytes``, or the
   key's state limit): then it is dead-lettered as ``buffer_full`` and the state is untouched;
4. a result or approval must be signed when its mode requires it, and must answer an intent
   of its own kind (a ToolResult a tool intent, an Approval an approval request) that the
   key is waiting for, else ``orphaned_result``; a result for an intent nobody waits for any
   more (fire-and-forget, or answered already) is acknowledged and counted, not an error;
5. run the activation under ``activation_timeout_s``; a raise or a timeout changes nothing
   and becomes ``activation_error`` / ``activation_timeout`` with the input's raw bytes;
6. on success build the whole next KeyState (memory, cache, continuation, pending, seq + 1,
   applied offset, outbox) as one value: the caller writes it as one record
   (service/keylane/core/apply.py);
7. after a resume that ends the suspension, run the queued events in order;
8. seal the next state against the key's state limit (``KeyRuntime.state_limit``: what one
   changelog record can carry, or ``AgentConfig.max_state_bytes`` if lower). Over it, the
   replay cache is trimmed, least recently used entries first (a dropped entry costs at most
   one repeated model call); still over, the input fails as ``state_too_large`` and the
   state is untouched. Memory writes see the same limit as they happen (``Memory``'s room),
   and a queued event whose activation would not fit fails alone, like a failing one.

A timer fire (agent.timers) is decoded and checked for redelivery like any input (steps 1
and 2); what it does then is service/keylane/core/timeouts.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final, Literal

import msgspec
from msgspec.structs import replace as struct_replace

from keylane import ids, metrics
from keylane.authoring.api import AgentConfig, AgentFn, Complete, Suspend
from keylane.authoring.context import ActivationContext, BudgetExceeded
from keylane.authoring.memory import MEMORY_HARD_CAP_BYTES, Memory
from keylane.authoring.ratelimit import ProviderLimiter
from keylane.catalog import (
    APPROVAL_REQUESTS,
    CONTROL,
    EVENTS,
    EVENTS_SHARDED,
    INTENTS,
    OUTPUT,
    RESULTS,
    TIMERS,
)
from keylane.clock import Clock, wall_clock_ms
from keylane.core.deadlines import ActivationDeadline, ActivationDeadlines, Awaiting, first_step
from keylane.core.outbox import (
    Deliveries,
    applied_offset,
    applied_with,
    forget_stream,
    republished,
    staged,
)
from keylane.core.quarantine import Quarantine
from keylane.core.replay_cache import ReplayCache
from keylane.core.state import (
    NO_MEMORY,
    BufferedEvent,
    Continuation,
    IntentKind,
    KeyState,
    PagedKeyState,
    Paused,
    PendingIntent,
    Sealed,
    UnencodableState,
    UnreadableState,
    encode_state,
    is_settled,
    memory_bytes,
    over_limit,
    seal,
    settle,
    waiting_input,
)
from keylane.core.timeouts import collected, fire_is_due, timed_out
from keylane.core.timers import TTL, armed
from keylane.errors import KeylaneError
from keylane.llm.resilience import CALL_DEADLINE
from keylane.llm.types import Provider
from keylane.records import Emit, InputRecord, OrphanDetail, error_emit
from keylane.signing import Keyring, Mode
from keylane.wire import (
    AgentEnvelope,
    Approval,
    ApprovalRequest,
    ErrorReason,
    KeyCommand,
    MalformedRecord,
    TimerFired,
    ToolResult,
    decode,
    decode_key,
    encode,
)

log = logging.getLogger(__name__)

UNAWAITED: Final = "unawaited"
"""The admission verdict for a result nobody waits for any more: acknowledged, not an error."""
DEFAULT_CHANGELOG_MAX_BYTES = 1_000_000
"""What one changelog record may carry when the worker does not say: Faust's default
``producer_max_request_size``, the first limit a record meets. The worker passes its own
(``KeyRuntime(changelog_max_bytes=...)``): the smaller of its producer's request limit and
the changelog topic's ``max.message.bytes``."""
PAUSE_ACTIONS: Final = ("pause", "resume")
"""Operator commands a paused key applies at once; it holds every other input."""
RECORD_OVERHEAD_BYTES = 1024
"""Reserved in a changelog record for everything but the value and the key: the record
batch header (61 bytes), the record's own overhead (at most 21) and headers, with room."""


class Decision(msgspec.Struct):
    """What to do for one input: write ``new_state`` (if not None), then publish ``emits``.

    A Struct (as the runtime's other per-record values are): one is built for every input,
    and a dataclass with a default factory takes three times as long to build."""

    new_state: KeyState | None
    emits: list[Emit] = msgspec.field(default_factory=list)
    blob: bytes | None = None
    """``new_state`` encoded, when the runtime sealed it against the key's state limit (a
    writer may store these bytes instead of encoding the state again)."""
    readback: KeyState | None = None
    """``blob`` as decoded when it was sealed: what reading it back gives (for a key whose
    memory is paged, but for the pages' slots the writer sets), so the writer can keep it for
    the key's next read."""
    unpages: bool = False
    """``new_state`` is one record again where the key's memory was paged (it emptied): the
    writer empties the pages the committed record names."""


class ActivationFailed(KeylaneError):
    """An activation that must change nothing; becomes an error record."""

    def __init__(self, reason: ErrorReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _Committed(msgspec.Struct):
    state: KeyState
    emits: list[Emit]
    round_trips: bool = False
    """No value the agent wrote to memory or a model answered is in ``state``: its blob
    decodes back to it as is (``seal``'s ``round_trips``)."""


class KeyRuntime:
    """Runs one agent's activations for the keys of the partitions it is given."""

    def __init__(
        self,
        agent: AgentFn,
        config: AgentConfig,
        *,
        provider: Provider | None = None,
        clock: Clock = wall_clock_ms,
        keyring: Keyring | None = None,
        approval_signatures: Mode = "off",
        result_signatures: Mode = "off",
        changelog_max_bytes: int = DEFAULT_CHANGELOG_MAX_BYTES,
    ) -> None:
        if changelog_max_bytes <= RECORD_OVERHEAD_BYTES:
            raise ValueError(
                f"changelog_max_bytes must exceed {RECORD_OVERHEAD_BYTES}, got {changelog_max_bytes}"
            )
        self.changelog_max_bytes = changelog_max_bytes
        self.agent = agent
        self.keyring = keyring or Keyring({})
        self.approval_signatures = approval_signatures
        self.result_signatures = result_signatures
        self.config = config
        self.provider = (
            provider
            if provider is not None
            else (config.provider_factory() if config.provider_factory else None)
        )
        self.clock = clock
        self.limiter = ProviderLimiter(config.rate_limit) if config.rate_limit else None
        self.deliveries = Deliveries()
        self.quarantine = Quarantine()
        self.deadlines = ActivationDeadlines(config.activation_timeout_s)
        self._activations = {
            False: metrics.child(metrics.ACTIVATIONS, "start"),
            True: metrics.child(metrics.ACTIVATIONS, "resume"),
        }

    def on_published(self, record_id: str) -> None:
        """A record was handed to the producer; its outbox entry stays until delivery."""
        self.deliveries.published(record_id)

    def on_delivered(self, record_id: str) -> None:
        """The producer confirmed a record; its outbox entry goes at the key's next commit."""
        self.deliveries.delivered(record_id)

    def state_limit(self, key: bytes) -> int:
        """The most bytes ``key``'s encoded state may take: what one changelog record carries
        besides the key and the record's overhead, or ``AgentConfig.max_state_bytes`` if lower."""
        limit = self.changelog_max_bytes - RECORD_OVERHEAD_BYTES - len(key)
        cap = self.config.max_state_bytes
        return limit if cap is None else min(limit, cap)

    async def handle(self, record: InputRecord, state_of: Callable[[bytes], KeyState]) -> Decision:
        """Decide what one input record does. ``state_of(key)`` reads the key's committed state."""
        try:
            key_text = decode_key(record.key)
            parsed = self._parse(record, key_text)
        except MalformedRecord as exc:
            return Decision(None, [self._error(record, "malformed_record", exc.detail)])
        assert record.key is not None
        key = record.key
        try:
            state = state_of(key)
        except UnreadableState as exc:
            self.quarantine.enter(key, str(exc))
            detail = (
                f"{exc}; the key is quarantined: its inputs are dead-lettered until its state reads "
                "again (deploy the keylane that wrote it, or remove the key's state), then re-drive them"
            )
            return Decision(None, [self._error(record, "poison_state", detail, entity_key=key_text)])
        if key in self.quarantine:
            self.quarantine.release(key)
        try:
            return await self._decide(record, parsed, state, key, key_text)
        except UnencodableState as exc:
            return Decision(None, [self._error(record, "activation_error", str(exc), entity_key=key_text)])

    async def _decide(
        self,
        record: InputRecord,
        parsed: AgentEnvelope | ToolResult | Approval | TimerFired | KeyCommand,
        state: KeyState,
        key: bytes,
        key_text: str,
    ) -> Decision:
        """``handle`` once the key's state is read: steps 2-8 of the module docstring."""
        stream, offset = record.identity
        last = applied_offset(state, record)
        if last is not None and offset <= last:
            if record.origin is None and record.log_end is not None and last >= record.log_end:
                # The key applied an offset the log does not reach: this is a new incarnation of
                # the topic (deleted and created again), not a redelivery.
                log.warning(
                    "%r applied %s up to offset %s but the log ends at %s: the topic was "
                    "recreated; reading its records as new",
                    key,
                    stream,
                    last,
                    record.log_end,
                )
                metrics.STREAMS_RESTARTED.labels(metrics.topic_label(record.topic)).inc()
                state = forget_stream(state, record)
            else:
                metrics.REDELIVERIES.labels(metrics.topic_label(record.topic)).inc()
                return Decision(_owned(state, record), republished(state, record))

        if isinstance(parsed, KeyCommand) and parsed.action in PAUSE_ACTIONS:
            return await self._on_pause_command(record, parsed, state, key)
        if state.paused is not None:
            return self._hold(state, record, parsed, key)
        return await self._dispatch(record, parsed, state, key, key_text)

    async def _dispatch(
        self,
        record: InputRecord,
        parsed: AgentEnvelope | ToolResult | Approval | TimerFired | KeyCommand,
        state: KeyState,
        key: bytes,
        key_text: str,
    ) -> Decision:
        """Steps 3-8 for an input the key runs now (not a redelivery, the key not paused)."""
        if isinstance(parsed, TimerFired):
            return await self._on_timer(record, parsed, state, key)
        if isinstance(parsed, KeyCommand):
            return await self._on_command(record, parsed, state, key)
        if isinstance(parsed, AgentEnvelope):
            if state.continuation is not None:
                return self._queue(state, record, key)
            try:
                committed = await self._activate(state, key, event=parsed.payload_bytes(), record=record)
            except ActivationFailed as exc:
                return Decision(None, [self._error(record, exc.reason, exc.detail, entity_key=key_text)])
            return self._commit(
                committed.state, record, committed.emits, key, round_trips=committed.round_trips
            )

        kind = "approval" if isinstance(parsed, Approval) else "result"
        mode = self.approval_signatures if kind == "approval" else self.result_signatures
        if mode != "off":
            reason: ErrorReason = "unsigned_approval" if kind == "approval" else "unsigned_result"
            refused = self._unsigned(
                record, parsed, mode, kind, reason, f"{kind} for {parsed.intent_id}", key_text
            )
            if refused is not None:
                return refused
        orphan = self._admission(state, parsed)
        if orphan == UNAWAITED:
            metrics.UNAWAITED_RESULTS.labels(kind).inc()
            return Decision(None, [])
        if orphan is not None:
            return Decision(None, [self._orphan(record, orphan, parsed.intent_id, key_text)])
        try:
            committed = await self._activate(state, key, resume=parsed, record=record)
        except ActivationFailed as exc:
            return Decision(None, [self._error(record, exc.reason, exc.detail, entity_key=key_text)])
        emits = list(committed.emits)
        next_state = committed.state
        if next_state.continuation is None and next_state.buffered:
            next_state, drained = await self._drain_buffered(next_state, key, record, emits)
            emits.extend(drained)
            return self._commit(next_state, record, emits, key)
        return self._commit(next_state, record, emits, key, round_trips=committed.round_trips)

    def _queue(self, state: KeyState, record: InputRecord, key: bytes) -> Decision:
        """Queue an event behind the key's suspension, or dead-letter it as ``buffer_full``
        (the key's state untouched) when the queue or the key's state would go past a limit."""
        value = record.value or b""
        depth = len(state.buffered)
        queued_bytes = sum(len(b.value) for b in state.buffered)
        config = self.config
        limit: str | None = None
        if depth + 1 > config.max_buffered_events:
            limit = "events"
            detail = (
                f"{depth} events already queued behind the suspension "
                f"(max_buffered_events={config.max_buffered_events})"
            )
        elif queued_bytes + len(value) > config.max_buffered_bytes:
            limit = "bytes"
            detail = (
                f"{queued_bytes} bytes already queued behind the suspension, this event has {len(value)} "
                f"(max_buffered_bytes={config.max_buffered_bytes})"
            )
        else:
            staged = self._advance(state, record, [], extra_buffered=(waiting_input(record),))
            sealed = self._seal(staged, key)
            if sealed is not None:
                metrics.EVENTS_BUFFERED.inc()
                metrics.BUFFERED_DEPTH.observe(depth + 1)
                return self._decided(state, staged, sealed, [])
            limit = "state"
            detail = f"queueing it would take the key's state past its limit: {self._over_limit(staged, key)}"
        metrics.BUFFERED_EVENTS_REJECTED.labels(limit).inc()
        detail += "; the event was not run (re-drive it from its origin once the key's suspension ends)"
        return Decision(None, [self._error(record, "buffer_full", detail, entity_key=key.decode())])

    def _parse(
        self, record: InputRecord, key_text: str
    ) -> AgentEnvelope | ToolResult | Approval | TimerFired | KeyCommand:
        if record.topic in (TIMERS, CONTROL):
            command: TimerFired | KeyCommand = (
                decode(record.value, TimerFired)
                if record.topic == TIMERS
                else decode(record.value, KeyCommand)
            )
            if command.entity_key != key_text:
                raise MalformedRecord(
                    f"entity_key {command.entity_key!r} differs from the record key {key_text!r}"
                )
            return command
        if record.topic in (EVENTS, EVENTS_SHARDED):
            envelope = decode(record.value, AgentEnvelope)
            envelope.payload_bytes()  # a bad payload_b64 is a malformed record, not an agent error
            if envelope.entity_key is not None and envelope.entity_key != key_text:
                raise MalformedRecord(
                    f"entity_key {envelope.entity_key!r} differs from the record key {key_text!r}"
                )
            return envelope
        parsed: ToolResult | Approval
        if record.topic == RESULTS:
            parsed = decode(record.value, ToolResult)
        else:
            parsed = decode(record.value, Approval)
        if parsed.entity_key != key_text:
            raise MalformedRecord(
                f"entity_key {parsed.entity_key!r} differs from the record key {key_text!r}"
            )
        return parsed

    def _admission(
        self, state: KeyState, resume: ToolResult | Approval
    ) -> OrphanDetail | Literal["unawaited"] | None:
        """None when the result may resume the key, UNAWAITED when it answers an intent nobody
        waits for any more, else why it is an orphaned_result."""
        cont = state.continuation
        if cont is None or resume.intent_id not in cont.pending_intent_ids:
            if is_settled(state, resume.intent_id):
                return UNAWAITED
            return "no_continuation" if cont is None else "unknown_intent"
        pending = state.pending.get(resume.intent_id)
        wanted: IntentKind = "approval" if isinstance(resume, Approval) else "tool"
        if pending is not None and pending.kind != wanted:
            return "kind_mismatch"  # e.g. a ToolResult forged for an approval request's id
        now = self.clock()
        past_deadline = cont.deadline_ms <= 0 or now >= cont.deadline_ms
        if isinstance(resume, ToolResult) and resume.status == "EXPIRED":
            # The effector refused the intent as expired, which it says only once the intent's
            # expiry passed. Where that expiry is what set the suspension's deadline, the
            # answer is due at the deadline and the agent gets its degraded path; a
            # suspension whose own timeout passed first belongs to the HITL timer's policy.
            expiry_set_deadline = pending is not None and pending.expires_at_ms <= cont.deadline_ms
            return "deadline_passed" if past_deadline and not expiry_set_deadline else None
        if past_deadline:
            return "deadline_passed"
        if pending is not None and now >= pending.expires_at_ms:
            # The effector starts no run that could end past the intent's expiry, and stamps
            # when it ended: a run that ended in time is honoured, however late its result.
            ended = resume.completed_at_ms if isinstance(resume, ToolResult) else 0
            if not 0 < ended < pending.expires_at_ms:
                return "intent_expired"
        return None

    async def _activate(
        self,
        state: KeyState,
        key: bytes,
        *,
        record: InputRecord | None,
        event: bytes = b"",
        resume: ToolResult | Approval | None = None,
    ) -> _Committed:
        cont = state.continuation if resume is not None else None
        seq = cont.seq if cont is not None else state.seq
        now = self.clock()
        soft_cap_hit: list[int] = []
        cache = ReplayCache(state.llm_cache)

        def open_memory() -> Memory:
            """The agent's ``ctx.memory``, made the first time the agent asks for it."""

            def memory_room() -> int:
                """Memory shares the key's one changelog record with the rest of its state."""
                rest = len(encode_state(struct_replace(state, memory=NO_MEMORY)))
                return max(0, self.state_limit(key) - rest)

            return Memory(
                state.memory,
                now_ms=now,
                hard_cap_bytes=MEMORY_HARD_CAP_BYTES,
                room_bytes=memory_room,
                on_soft_cap=soft_cap_hit.append,
                total_bytes=_memory_size(state),
            )

        ctx = ActivationContext(
            event=event,
            entity_key=key,
            _open_memory=open_memory,
            seq=seq,
            snapshot=cont.snapshot if cont is not None else b"",
            resume_result=resume if isinstance(resume, ToolResult) else None,
            resume_approval=resume if isinstance(resume, Approval) else None,
            now_ms=now,
            _step_index=cont.step_index if cont is not None else 0,
            _provider=self.provider,
            _limiter=self.limiter,
            _token_budget=self.config.max_tokens_per_activation,
            _cache=cache,
            _tools=self.config.tools,
            _intent_ttl_ms=self.config.hitl_policy.intent_ttl_ms,
            _approval_channel=self.config.hitl_policy.approval_channel,
        )
        started = time.perf_counter()
        timeout_s = self.config.activation_timeout_s
        # Provider retries never wait past the activation's own deadline.
        deadline_token = CALL_DEADLINE.set(time.monotonic() + timeout_s)
        deadline: ActivationDeadline | None = None
        try:
            # An agent that finishes without waiting cannot time out (first_step).
            outcome = first_step(self.agent(ctx))
            if type(outcome) is Awaiting:
                with self.deadlines.timeout(elapsed_s=time.perf_counter() - started) as deadline:
                    outcome = await outcome
            ctx.check_budget()  # an agent that caught BudgetExceeded still does not commit
        except BudgetExceeded as exc:
            metrics.ACTIVATION_SECONDS.observe(time.perf_counter() - started)
            raise ActivationFailed("budget_exceeded", str(exc)) from None
        except TimeoutError:
            metrics.ACTIVATION_SECONDS.observe(time.perf_counter() - started)
            if deadline is not None and deadline.expired():
                raise ActivationFailed(
                    "activation_timeout", f"activation exceeded {timeout_s}s at step {ctx.step_index}"
                ) from None
            raise ActivationFailed(
                "activation_error", f"TimeoutError() failed_at_step={ctx.step_index}"
            ) from None
        except Exception as exc:
            metrics.ACTIVATION_SECONDS.observe(time.perf_counter() - started)
            raise ActivationFailed("activation_error", f"{exc!r} failed_at_step={ctx.step_index}") from exc
        finally:
            CALL_DEADLINE.reset(deadline_token)
        if not isinstance(outcome, (Complete, Suspend)):  # a tuple is a constant; a union is built per call
            raise ActivationFailed(
                "activation_error", f"agent returned {type(outcome).__name__}, expected Complete or Suspend"
            )
        # Checked here, not when written: a value state cannot encode would fail the key's
        # next input with CorruptState instead of failing this activation.
        carried = outcome.output if isinstance(outcome, Complete) else outcome.snapshot
        if not isinstance(carried, bytes):
            what = "Complete.output" if isinstance(outcome, Complete) else "Suspend.snapshot"
            raise ActivationFailed(
                "activation_error", f"{what} must be bytes, got {type(carried).__name__}; encode it first"
            )
        wall_s = time.perf_counter() - started

        pending = dict(state.pending) if cont is not None else {}
        still_waiting = (
            [i for i in cont.pending_intent_ids if i != resume.intent_id] if cont and resume else []
        )
        settled = [resume.intent_id] if resume is not None else []
        if resume is not None:
            pending.pop(resume.intent_id, None)
        staged = [*ctx.intents, *(a.intent for a in ctx.approvals)] if ctx.approvals else ctx.intents
        for intent in staged:
            kind: IntentKind = "approval" if any(a.intent is intent for a in ctx.approvals) else "tool"
            pending[intent.intent_id] = PendingIntent(
                intent_id=intent.intent_id, tool=intent.tool, kind=kind, expires_at_ms=intent.expires_at_ms
            )
        continuation: Continuation | None = None
        emits: list[Emit] = (
            [
                Emit(record_id=i.intent_id, topic=INTENTS, key=key, value=encode(self.keyring.sign(i)))
                for i in ctx.intents
            ]
            if ctx.intents
            else []
        )
        if isinstance(outcome, Suspend):
            wait_ms = outcome.timeout_ms or self.config.hitl_policy.timeout_ms
            deadline_ms = min([now + wait_ms, *(i.expires_at_ms for i in staged)])
            continuation = Continuation(
                seq=seq,
                step_index=ctx.step_index,
                pending_intent_ids=[*still_waiting, *(i.intent_id for i in staged)],
                snapshot=outcome.snapshot,
                suspended_at_ms=now,
                deadline_ms=deadline_ms,
                escalations=cont.escalations if cont is not None else 0,
            )
            for approval in ctx.approvals:
                request = ApprovalRequest(
                    intent_id=approval.intent.intent_id,
                    entity_key=approval.intent.entity_key,
                    channel=approval.channel,
                    args_json=approval.intent.args_json,
                    created_at_ms=now,
                    expires_at_ms=approval.intent.expires_at_ms,
                    deadline_ms=deadline_ms,
                )
                emits.append(
                    Emit(record_id=request.intent_id, topic=APPROVAL_REQUESTS, key=key, value=encode(request))
                )
            metrics.SUSPENSIONS.inc()
        else:
            pending = {}
            # Fire-and-forget intents, and those the agent stopped waiting for: their results
            # are expected and acknowledged, not dead-lettered.
            if still_waiting or ctx.intents:
                settled += [*still_waiting, *(i.intent_id for i in ctx.intents)]
            emits.append(Emit(record_id=ids.output_id(key, seq), topic=OUTPUT, key=key, value=outcome.output))

        memory = ctx.opened_memory
        if memory is not None:
            memory_blob, memory_size = memory.to_blob(), memory.total_bytes
        else:
            memory_blob, memory_size = state.memory, _memory_size(state)
        self._activations[resume is not None].inc()
        metrics.ACTIVATION_SECONDS.observe(wall_s)
        metrics.OVERHEAD_SECONDS.observe(max(0.0, wall_s - ctx.stats.llm_s - ctx.stats.tool_s))
        metrics.MEMORY_BYTES.observe(memory_size)
        if ctx.stats.tool_calls:
            metrics.TOOL_CALLS.inc(ctx.stats.tool_calls)
        if soft_cap_hit:
            metrics.MEMORY_SOFT_CAP_WARNINGS.inc()
        settled_ids, settled_intents = settle(state, settled)
        next_state = struct_replace(
            state,
            seq=state.seq + 1,
            memory=memory_blob,
            continuation=continuation,
            # An entry answers only its own (key, seq): once no activation of this seq can run
            # again (no continuation), none of the cell's entries can hit, and carrying them
            # would cost every later commit their bytes for nothing.
            llm_cache=cache.entries() if continuation is not None else [],
            pending=pending,
            settled_ids=settled_ids,
            settled_intents=settled_intents,
        )
        if isinstance(next_state, PagedKeyState) and memory is not None:
            layout = struct_replace(
                next_state.pages,
                memory_bytes=memory_size,
                dirty=next_state.pages.dirty | memory.changed,
            )
            next_state = struct_replace(next_state, pages=layout)
        return _Committed(next_state, emits, self._round_trips(memory, cache, now, continuation is not None))

    def _round_trips(self, memory: Memory | None, cache: ReplayCache, now: int, suspended: bool) -> bool:
        """Whether the state an activation staged holds only decoded values and the runtime's
        own: nothing the agent wrote to memory, no model answer it keeps (the replay cache is
        kept while suspended), and a clock and config whose times are ints (a config patched
        past its checks, or a test's clock, could give a float)."""
        config = self.config
        return (
            not (memory is not None and memory.took_values)
            and not (suspended and cache.took_responses)
            and type(now) is int
            and type(config.ttl_ms) is int
            and type(config.hitl_policy.timeout_ms) is int
        )

    async def _on_timer(
        self, record: InputRecord, fired: TimerFired, state: KeyState, key: bytes
    ) -> Decision:
        """A timer fire (service/keylane/core/timeouts.py): stale or early fires change nothing;
        a due TTL collects the key's state; a due HITL timer runs the fail-closed policy, and
        the events queued behind a suspension it ends run."""
        now = self.clock()
        if not fire_is_due(state, fired, now):
            metrics.TIMERS_IGNORED.inc()
            return Decision(None, [])
        metrics.TIMERS_FIRED.labels(fired.kind).inc()
        if fired.kind == TTL:
            tombstone, emits = collected(state, record, key, ttl_ms=self.config.ttl_ms, now_ms=now)
            # The dead letters go in the tombstone's outbox, so a redelivered fire (a crash
            # before they were confirmed) publishes them again.
            kept = struct_replace(
                _owned(tombstone, record), outbox=staged(state, record, emits, self.deliveries)
            )
            sealed = self._seal(kept, key)
            if sealed is None:  # cannot happen: the outbox holds what the state held already
                return Decision(tombstone, emits)
            return self._decided(state, kept, sealed, emits)
        outcome = timed_out(state, record, key, self.config.hitl_policy, now_ms=now)
        if outcome is None:
            return Decision(None, [])
        next_state, emits = outcome
        if next_state.continuation is None and next_state.buffered:
            next_state, drained = await self._drain_buffered(next_state, key, record, emits)
            emits.extend(drained)
        return self._commit(next_state, record, emits, key)

    async def _on_command(
        self, record: InputRecord, command: KeyCommand, state: KeyState, key: bytes
    ) -> Decision:
        """An operator's command (agent.control), in the key's lane after its earlier inputs.
        ``cancel`` ends the key's suspension through its HITL policy as a timeout would, told
        who cancelled and why, and runs the events queued behind it; a key that is not
        suspended (it resumed first) is left as it is. Signed like approvals when
        KEYLANE_APPROVAL_SIGNATURES asks for it."""
        key_text = key.decode()
        what = f"{command.action} by {command.operator}"
        refused = self._unsigned(
            record, command, self.approval_signatures, "command", "unsigned_command", what, key_text
        )
        if refused is not None:
            return refused
        why = f"by {command.operator}: {command.reason}"
        outcome = timed_out(state, record, key, self.config.hitl_policy, now_ms=self.clock(), cancelled=why)
        if outcome is None:
            metrics.KEY_COMMANDS.labels(command.action, "not_suspended").inc()
            log.info("%s of %r %s: the key is not suspended; nothing to do", command.action, key_text, why)
            # Committed all the same, with the command's offset applied: a redelivery of it
            # must not cancel a suspension the key starts later.
            return self._commit(state, record, [], key)
        metrics.KEY_COMMANDS.labels(command.action, "done").inc()
        log.info(
            "%r: suspension at seq %s cancelled %s",
            key_text,
            state.continuation and state.continuation.seq,
            why,
        )
        next_state, emits = outcome
        if next_state.buffered:
            next_state, drained = await self._drain_buffered(next_state, key, record, emits)
            emits.extend(drained)
        return self._commit(next_state, record, emits, key)

    def _hold(
        self,
        state: KeyState,
        record: InputRecord,
        parsed: AgentEnvelope | ToolResult | Approval | TimerFired | KeyCommand,
        key: bytes,
    ) -> Decision:
        """An input for a paused key waits in its state (``held``), in arrival order, for the
        key's resume; or is dead-lettered as ``buffer_full`` (the state untouched) when the
        key's hold or its state would go past a limit (the queue's limits, AgentConfig's
        ``max_buffered_events`` / ``max_buffered_bytes``). A timer fire is ignored: the
        resume re-arms the key's timers, and a timer due by then fires after it."""
        if isinstance(parsed, TimerFired):
            metrics.TIMERS_IGNORED.inc()
            return Decision(None, [])
        assert state.paused is not None
        value = record.value or b""
        depth = len(state.held)
        held_bytes = sum(len(h.value) for h in state.held)
        config = self.config
        limit: str | None = None
        if depth + 1 > config.max_buffered_events:
            limit = "events"
            detail = f"{depth} inputs already held (max_buffered_events={config.max_buffered_events})"
        elif held_bytes + len(value) > config.max_buffered_bytes:
            limit = "bytes"
            detail = (
                f"{held_bytes} bytes already held, this input has {len(value)} "
                f"(max_buffered_bytes={config.max_buffered_bytes})"
            )
        else:
            held = struct_replace(state, held=[*state.held, waiting_input(record)])
            staged = self._advance(held, record, [])
            sealed = self._seal(staged, key)
            if sealed is not None:
                metrics.INPUTS_HELD.labels(metrics.topic_label(record.topic)).inc()
                return self._decided(state, staged, sealed, [])
            limit = "state"
            detail = f"holding it would take the key's state past its limit: {self._over_limit(staged, key)}"
        metrics.BUFFERED_EVENTS_REJECTED.labels(limit).inc()
        detail = (
            f"the key is paused by {state.paused.operator} and its hold is full: {detail}; the input was "
            "not run (resume the key, then re-drive it: keylane errors redrive --key KEY)"
        )
        return Decision(None, [self._error(record, "buffer_full", detail, entity_key=key.decode())])

    async def _on_pause_command(
        self, record: InputRecord, command: KeyCommand, state: KeyState, key: bytes
    ) -> Decision:
        """``pause``: the key's inputs wait in its state from now on (``_hold``), while every
        other key goes on. ``resume``: the key runs what it held, in order, as they would have
        run on arrival, all committed under this command (a redelivered resume publishes their
        records again). Either is committed with the command's offset applied, even when the
        key already was as asked (so a redelivery never acts twice). Signed like approvals."""
        key_text = key.decode()
        who = f"{command.action} by {command.operator}"
        refused = self._unsigned(
            record, command, self.approval_signatures, "command", "unsigned_command", who, key_text
        )
        if refused is not None:
            return refused
        if command.action == "pause":
            if state.paused is not None:
                metrics.KEY_COMMANDS.labels("pause", "already_paused").inc()
                log.info("%s of %r: the key is paused already (by %s)", who, key_text, state.paused.operator)
                return self._commit(state, record, [], key)
            paused = Paused(
                operator=command.operator,
                reason=command.reason,
                at_ms=command.issued_at_ms or self.clock(),
                command_id=command.command_id,
            )
            metrics.KEY_COMMANDS.labels("pause", "done").inc()
            log.info("%r paused %s: %s", key_text, who, command.reason)
            return self._commit(struct_replace(state, paused=paused), record, [], key)
        if state.paused is None:
            metrics.KEY_COMMANDS.labels("resume", "not_paused").inc()
            log.info("%s of %r: the key is not paused; nothing to do", who, key_text)
            return self._commit(state, record, [], key)
        resumed, emits = await self._run_held(state, record, key, key_text)
        metrics.KEY_COMMANDS.labels("resume", "done").inc()
        log.info("%r resumed %s: %s held inputs run", key_text, who, len(state.held))
        return self._commit(resumed, record, emits, key)

    async def _run_held(
        self, state: KeyState, record: InputRecord, key: bytes, key_text: str
    ) -> tuple[KeyState, list[Emit]]:
        """The key unpaused, after each of its held inputs ran in order as on arrival; and the
        records they produced, for ``record`` (the resume) to stage in the outbox."""
        current = struct_replace(state, paused=None, held=[])
        emits: list[Emit] = []
        for waiting in state.held:
            origin = struct_replace(waiting.input_record(key), epoch=record.epoch)
            try:
                parsed = self._parse(origin, key_text)
                decision = await self._dispatch(origin, parsed, current, key, key_text)
            except MalformedRecord as exc:  # it parsed when it was held; a rule changed since
                decision = Decision(None, [self._error(origin, "malformed_record", exc.detail)])
            except UnencodableState as exc:
                decision = Decision(
                    None, [self._error(origin, "activation_error", str(exc), entity_key=key_text)]
                )
            if decision.new_state is not None:
                current = decision.new_state
            emits.extend(decision.emits)
        # Each held input staged its records under itself, and was applied when it was held:
        # the resume stages them all (the caller), and no stream's applied offset goes back.
        applied = dict(current.applied)
        for stream, offset in state.applied.items():
            applied[stream] = max(offset, applied.get(stream, offset))
        return struct_replace(current, outbox=state.outbox, applied=applied), emits

    def _unsigned(
        self,
        record: InputRecord,
        signed: ToolResult | Approval | KeyCommand,
        mode: Mode,
        kind: str,
        reason: ErrorReason,
        what: str,
        key_text: str,
    ) -> Decision | None:
        """The signature check of a result, an approval or an operator's command under ``mode``:
        a Decision refusing it as ``reason`` when ``require`` finds no valid signature; None to
        go on (signed, ``off``, or ``permissive``, which logs and counts what it lets through)."""
        if mode == "off":
            return None
        verdict = self.keyring.verify(signed)
        if verdict == "ok":
            return None
        metrics.UNSIGNED.labels(kind).inc()
        if mode == "require":
            detail = f"{verdict}: {what} refused"
            return Decision(None, [self._error(record, reason, detail, entity_key=key_text)])
        log.warning("%s is %s; accepted (permissive mode)", what, verdict)
        return None

    async def _drain_buffered(
        self, state: KeyState, key: bytes, record: InputRecord, before: list[Emit]
    ) -> tuple[KeyState, list[Emit]]:
        """Run the events queued behind a suspension that just ended, in arrival order.

        Stops (keeping the rest queued) as soon as one of them suspends again. A queued
        event whose activation fails becomes an error record, like any other; so does one
        whose activation would take the state ``record`` commits (``before`` and what the
        drain produced so far in its outbox) past the key's limit (``state_too_large``).
        """
        emits: list[Emit] = []
        while state.buffered and state.continuation is None:
            head, rest = state.buffered[0], state.buffered[1:]
            state = struct_replace(state, buffered=rest)
            origin = head.input_record(key)
            try:
                committed = await self._activate(state, key, event=head.payload, record=origin)
            except ActivationFailed as exc:
                emits.append(self._error(origin, exc.reason, exc.detail, entity_key=key.decode()))
                continue
            staged = self._advance(committed.state, record, [*before, *emits, *committed.emits])
            try:
                sealed = self._seal(staged, key)
            except UnencodableState as exc:
                emits.append(self._error(origin, "activation_error", str(exc), entity_key=key.decode()))
                continue
            if sealed is None:
                metrics.STATE_OVER_LIMIT.inc()
                detail = self._over_limit(staged, key)
                emits.append(self._error(origin, "state_too_large", detail, entity_key=key.decode()))
                continue
            state = committed.state
            emits.extend(committed.emits)
        return state, emits

    def _commit(
        self,
        state: KeyState,
        record: InputRecord,
        emits: list[Emit],
        key: bytes,
        *,
        round_trips: bool = False,
    ) -> Decision:
        """The decision that commits ``state`` for ``record`` with ``emits`` in its outbox, or,
        when that state does not fit the key's limit, one that fails ``record`` as
        ``state_too_large`` and changes nothing (``round_trips``: see ``seal``)."""
        staged = self._advance(state, record, emits)
        sealed = self._seal(staged, key, round_trips=round_trips)
        if sealed is None:
            metrics.STATE_OVER_LIMIT.inc()
            detail = self._over_limit(staged, key)
            return Decision(None, [self._error(record, "state_too_large", detail, entity_key=key.decode())])
        return self._decided(state, staged, sealed, emits)

    def _decided(self, before: KeyState, staged: KeyState, sealed: Sealed, emits: list[Emit]) -> Decision:
        """The decision writing ``sealed`` (``staged`` sealed) in place of ``before``."""
        state, blob = sealed.state, sealed.blob
        # Delivered ids are forgotten only once the outbox that held them is replaced.
        if before.outbox:
            self.deliveries.forget(before.outbox)
        trimmed = len(staged.llm_cache) - len(state.llm_cache)
        if trimmed:
            metrics.STATE_CACHE_TRIMMED.inc(trimmed)
        # A paged key's record leaves its memory out: the key's size is both.
        paged_bytes = state.pages.memory_bytes if isinstance(state, PagedKeyState) else 0
        metrics.STATE_BYTES.observe(len(blob) + paged_bytes)
        unpages = isinstance(before, PagedKeyState) and not isinstance(state, PagedKeyState)
        return Decision(state, emits, blob=blob, readback=sealed.readback, unpages=unpages)

    def _seal(self, state: KeyState, key: bytes, *, round_trips: bool = False) -> Sealed | None:
        return seal(state, self.state_limit(key), round_trips=round_trips)

    def _over_limit(self, state: KeyState, key: bytes) -> str:
        return over_limit(state, self.state_limit(key))

    def _advance(
        self,
        state: KeyState,
        record: InputRecord,
        emits: list[Emit],
        *,
        extra_buffered: tuple[BufferedEvent, ...] = (),
    ) -> KeyState:
        """Record the input as applied and stage its emits in the outbox, dropping settled ones
        (``outbox.staged``). Pure: the caller forgets delivered ids only when it commits the
        result (``_decided``)."""
        # One replace, timers included: a replace of its own would copy the state a second
        # time. The timers depend only on the continuation and seq, which this leaves as they are.
        return struct_replace(
            _owned(state, record),
            applied=applied_with(state, record),
            outbox=staged(state, record, emits, self.deliveries),
            buffered=[*state.buffered, *extra_buffered] if extra_buffered else state.buffered,
            timers=armed(state, ttl_ms=self.config.ttl_ms, now_ms=self.clock()),
        )

    def _error(
        self,
        record: InputRecord,
        reason: ErrorReason,
        detail: str,
        *,
        entity_key: str | None = None,
        intent_id: str | None = None,
    ) -> Emit:
        return error_emit(
            record, reason, detail, now_ms=self.clock(), entity_key=entity_key, intent_id=intent_id
        )

    def _orphan(self, record: InputRecord, why: OrphanDetail, intent_id: str, entity_key: str) -> Emit:
        detail = f"{why}:{intent_id}" if why == "intent_expired" else why
        emit = self._error(record, "orphaned_result", detail, entity_key=entity_key, intent_id=intent_id)
        return struct_replace(emit, error_reason=None, orphan_detail=why)


def _memory_size(state: KeyState) -> int:
    """The size of ``state``'s memory as the Memory facade counts it (kept beside paged memory)."""
    if isinstance(state, PagedKeyState):
        return state.pages.memory_bytes
    return memory_bytes(state.memory) if state.memory.entries else 0


def _owned(state: KeyState, record: InputRecord) -> KeyState:
    """``state`` as written under ``record``'s owner epoch: never lower than it was
    (service/keylane/kafka/epochs.py)."""
    if record.epoch <= state.epoch:
        return state
    return struct_replace(state, epoch=record.epoch)
