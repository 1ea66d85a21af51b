"""What a timer fire does to a key: a stale or early fire does nothing, a due TTL collects the
key's state, and a suspension past its deadline runs the fail-closed HITL timeout policy
(service/keylane/authoring/hitl.py)."""

from __future__ import annotations

from msgspec.structs import replace as struct_replace

from keylane import ids
from keylane.authoring.hitl import Deny, Escalate, FallbackContext, HitlPolicy, TimeoutDecision
from keylane.catalog import APPROVAL_REQUESTS, OUTPUT
from keylane.core.outbox import applied_with
from keylane.core.state import KeyState, PendingIntent
from keylane.records import Emit, InputRecord, error_emit
from keylane.wire import ApprovalRequest, TimerFired, encode


def fire_is_due(state: KeyState, fired: TimerFired, now_ms: int) -> bool:
    """Whether ``fired`` is the key's armed timer of its kind (same token) and due at ``now_ms``."""
    armed = state.timers.get(fired.kind)
    return armed is not None and armed.token == fired.token and now_ms >= armed.deadline_ms


def collected(
    state: KeyState, record: InputRecord, key: bytes, *, ttl_ms: int, now_ms: int
) -> tuple[KeyState, list[Emit]]:
    """The tombstone a due TTL leaves of ``state``, and a ``ttl_wiped_suspension`` dead letter
    for a suspension it collects and for every event queued behind it.

    The tombstone keeps only what keeps ids unique and redeliveries recognisable (the seq
    counter, applied offsets, settled intents): a key that came back at seq 0 would re-mint
    its old intent and output ids. The caller stages the dead letters in its outbox.
    """
    key_text = key.decode()
    emits = []
    if state.continuation is not None:
        detail = f"state collected after {ttl_ms} ms idle while suspended at seq {state.continuation.seq}"
        emits.append(error_emit(record, "ttl_wiped_suspension", detail, now_ms=now_ms, entity_key=key_text))
        for queued in state.buffered:
            detail = "queued behind a suspension that TTL collected; the event was not run"
            emits.append(
                error_emit(
                    queued.input_record(key),
                    "ttl_wiped_suspension",
                    detail,
                    now_ms=now_ms,
                    entity_key=key_text,
                )
            )
    tombstone = KeyState(
        seq=state.seq,
        applied=applied_with(state, record),
        settled_ids=state.settled_ids,
        settled_intents=state.settled_intents,
        epoch=state.epoch,
    )
    return tombstone, emits


def timed_out(
    state: KeyState,
    record: InputRecord,
    key: bytes,
    policy: HitlPolicy,
    *,
    now_ms: int,
    cancelled: str | None = None,
) -> tuple[KeyState, list[Emit]] | None:
    """The next state and records of a key whose suspension is past its deadline at ``now_ms``,
    or that an operator ``cancelled`` (who and why) whatever its deadline; None if it is not
    suspended, or not yet due: escalated (a new approval request, a new deadline; never for a
    cancel) or ended (Deny's output, or ``hitl_timeout`` for Drop and a policy that raised or
    returned something else). Its queued events have not run yet."""
    cont = state.continuation
    if cont is None or (cancelled is None and now_ms < cont.deadline_ms):
        return None
    context = FallbackContext(
        entity_key=key,
        seq=cont.seq,
        pending_intent_ids=tuple(cont.pending_intent_ids),
        escalations=cont.escalations,
        snapshot=cont.snapshot,
        deadline_ms=cont.deadline_ms,
        cancelled=cancelled,
    )
    try:
        decision: TimeoutDecision | Exception = policy.decide(context)
    except Exception as exc:  # noqa: BLE001 - a failing policy fails closed, the worker goes on
        decision = exc
    key_text = key.decode()
    if isinstance(decision, Escalate):
        intent_id = ids.intent_id(key, cont.seq, cont.step_index)
        deadline_ms = now_ms + decision.timeout_ms
        request = ApprovalRequest(
            intent_id=intent_id,
            entity_key=key_text,
            channel=decision.tool_name,
            args_json=decision.args_json,
            created_at_ms=now_ms,
            expires_at_ms=deadline_ms,
            deadline_ms=deadline_ms,
        )
        pending = {
            **state.pending,
            intent_id: PendingIntent(
                intent_id=intent_id, tool=decision.tool_name, kind="approval", expires_at_ms=deadline_ms
            ),
        }
        escalated = struct_replace(
            cont,
            step_index=cont.step_index + 1,
            pending_intent_ids=[*cont.pending_intent_ids, intent_id],
            deadline_ms=deadline_ms,
            escalations=cont.escalations + 1,
        )
        emits = [Emit(record_id=intent_id, topic=APPROVAL_REQUESTS, key=key, value=encode(request))]
        return struct_replace(state, continuation=escalated, pending=pending), emits
    if isinstance(decision, Deny):
        emits = [Emit(record_id=ids.output_id(key, cont.seq), topic=OUTPUT, key=key, value=decision.output)]
    else:
        detail = (
            f"policy raised {decision!r}" if isinstance(decision, Exception) else "dropped by policy"
        ) + f"; deadline {cont.deadline_ms}, pending {cont.pending_intent_ids}"
        if cancelled is not None:
            detail = f"cancelled {cancelled}; {detail}"
        emits = [error_emit(record, "hitl_timeout", detail, now_ms=now_ms, entity_key=key_text)]
    # The suspended activation will not run again: its replay-cache entries cannot hit.
    return struct_replace(state, continuation=None, pending={}, llm_cache=[]), emits
